"""Purging cache entries: everything, one scope (a tenant, `anonymous` or `shared`), or
one exact key. The same code serves `zccp-cache purge` (the CLI, straight to Redis) and
`POST /v1/zccp/purge` (nginx, loopback only, rings the engine with ZCCP_KIND_PURGE).

    parse_purge({"all": true} | {"scope": S} | {"tenant": VALUE} | {"key": HEX}) -> PurgeRequest
    await purge(redis, request) -> number of keys deleted
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import orjson

from zccp.api import codec_for
from zccp.cache.scope import purge_patterns, tenant_digest
from zccp.shared_types import ApiError
from zccp.ring_writer import ResponseWriter, SlotAbandoned

if TYPE_CHECKING:
    from zccp.cache.redis_target import RedisClient

log = logging.getLogger("zccp.cache.purge")

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
    req = PurgeRequest(name, v.lower() if name == "key" else v)   # type: ignore[arg-type]
    try:
        req.patterns
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    return req


async def purge(redis: RedisClient, req: PurgeRequest) -> int:
    """Delete every key matching the request (SCAN + UNLINK in batches); the count.
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
    return n


class PurgeFlow:
    """One POST /v1/zccp/purge through a slot: the JSON body in, {"purged": n} out."""

    def __init__(self, payload: memoryview, writer: ResponseWriter, redis: RedisClient | None,
                 spawn: Callable[[Any], None], on_done: Callable[[], None]) -> None:
        self._payload = payload
        self._writer = writer
        self._redis = redis
        self._spawn = spawn
        self._on_done = on_done

    def start(self) -> None:
        self._spawn(self._run())

    async def _run(self) -> None:
        codec = codec_for("anthropic")
        try:
            try:
                if self._redis is None:
                    raise ApiError(409, "invalid_request_error", "the cache is disabled (cache.enabled: false)")
                try:
                    req = parse_purge(orjson.loads(bytes(self._payload)))
                except orjson.JSONDecodeError as exc:
                    raise ApiError(400, "invalid_request_error", f"body: not valid JSON: {exc}") from None
                except ValueError as exc:
                    raise ApiError(400, "invalid_request_error", str(exc)) from None
                try:
                    n = await purge(self._redis, req)
                except Exception as exc:   # redis down, a timeout: say so, nothing else breaks
                    log.warning("purge failed: %s", exc)
                    raise ApiError(503, "api_error", f"purge failed: {exc}") from None
                log.info("cache purged: %s, %d keys", req.describe(), n)
                self._writer.begin(200, sse=False)
                self._writer.write(orjson.dumps({"purged": n, **req.describe()}))
            except ApiError as err:
                self._writer.begin(err.status, sse=False)
                self._writer.write(codec.render_error(err))
            self._writer.finish()
        except SlotAbandoned:
            pass
        finally:
            self._payload.release()
            self._on_done()
