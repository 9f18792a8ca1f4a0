"""Purging cache entries: everything, one scope (a tenant, `anonymous` or `shared`), or
one exact key, in Redis. The same code serves `zccp-cache purge` (the CLI, straight to
Redis) and `POST /v1/zccp/purge` (nginx, loopback only, rings the engine with
ZCCP_KIND_PURGE; zccp.prep.endpoints answers it through the slot).

    parse_purge({"all": true} | {"scope": S} | {"tenant": VALUE} | {"key": HEX}) -> PurgeRequest
    await purge(redis, request) -> number of keys deleted (then a new purge epoch: every
                                   host's nginx L1 forgets, zccp.cache.purge_epoch)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from zccp.cache.purge_epoch import bump
from zccp.cache.scope import purge_patterns, tenant_digest

if TYPE_CHECKING:
    from zccp.cache.redis_target import RedisClient

_BATCH = 500


@dataclass(frozen=True)
class PurgeRequest:
    what: Literal["all", "scope", "key"]
    value: str = ""          # the scope (`shared`, `anonymous`, a tenant digest in hex) or the exact key

    @property
    def patterns(self) -> list[str]:
        return purge_patterns(self.what, self.value)

    def describe(self) -> dict[str, Any]:
        return {"all": True} if self.what == "all" else {self.what: self.value}


def parse_purge(obj: Any) -> PurgeRequest:
    """A purge request from its JSON object; ValueError names the field at fault."""
    if not isinstance(obj, dict):
        raise ValueError("body: expected a JSON object with one of all, scope, tenant, key")
    unknown = set(obj) - {"all", "scope", "tenant", "key"}
    if unknown:
        raise ValueError(f"{sorted(unknown)[0]}: unknown field (expected one of all, scope, tenant, key)")
    if len(obj) != 1:
        raise ValueError("body: give exactly one of all, scope, tenant, key")
    (name, v), = obj.items()
    if name == "all":
        if v is not True:
            raise ValueError("all: expected true")
        return PurgeRequest("all")
    if not isinstance(v, str) or not v:
        raise ValueError(f"{name}: expected a non-empty string")
    if name == "tenant":          # the tenant source's value (an API key, a user id): hashed as nginx does
        return PurgeRequest("scope", tenant_digest(v).hex())
    req = PurgeRequest(name, v.lower() if name == "key" else v) 
    try:
        purge_patterns(req.what, req.value)      # a key of the wrong form is refused here
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    return req


async def purge(redis: RedisClient, req: PurgeRequest, on_epoch: Callable[[int], None] | None = None) -> int:
    """Delete every key matching the request (SCAN + UNLINK in batches); the count. Then
    a new purge epoch, handed to on_epoch (this engine's control page: this host's nginx
    sees it before the purge is answered; the others within purge_epoch.POLL_S).
    On a Redis Cluster, redis-py's SCAN visits every primary (each with its own cursor)
    and its UNLINK splits a batch by slot; through Sentinel it runs on the master."""
    n = 0
    for pattern in req.patterns:
        batch: list[bytes] = []
        async for key in redis.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= _BATCH:
                n += await redis.unlink(*batch)
                batch.clear()
        if batch:
            n += await redis.unlink(*batch)
    epoch = await bump(redis)   # after the deletes: an L1 entry stored meanwhile carries the old epoch
    if on_epoch is not None:
        on_epoch(epoch)
    return n
