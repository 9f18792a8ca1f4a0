"""The response cache in Redis: exact entries and a near index for requests that mean the same,
partitioned by scope and tenant (key layout: zccp.cache.scope).

A lookup is one round trip: a server-side script (LOOKUP_SCRIPT) tries the exact keys
the placement allows and, on a miss, reads the near index of the request's final turn
(the records whose turn reads the same once whitespace, case, punctuation, filler and
masked values are set aside: zccp.cache.near) and returns at most MAX_CANDIDATES of them
with their near records; a near hit costs one more round trip for the winner's entry.
Every key one script touches carries the same hash tag (one Redis Cluster slot). A
candidate only counts when its prefix key equals the request's (the same system prompt,
tools, parameters and earlier turns) and its final turn passes the meaning check against
this one's with the word list in force (zccp.cache.meaning).

A hit is served only if it passes the masked-literal guard (CachedAnswer.leaks_to: the
values the masks replaced in this request, not anything else its body holds):
otherwise it is a MISS with the reason `masked_literal`, and the fresh answer is
stored over it.

Redis down or slow: a lookup's Redis calls give up after `timeout_ms` (a deadline
around each, which also bounds the cluster and Sentinel clients' own steps: a slot map
refresh, asking a Sentinel for the master), the lookup answers ERROR, a counter rises,
and for one second after a failure the cache is not even tried (no request waits on a
dead Redis); then it is tried again, so it comes back by itself. A store runs after the
answer has gone out, so no request waits on it: each of its steps has the socket timeout
`timeout_ms`, with no deadline around the whole (one would also count the time the
engine's busy loop kept it waiting). The same holds for one server, a Redis Cluster and
a Sentinel-managed master (zccp.cache.redis_target).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zccp.cache.answer import CachedAnswer
from zccp.cache.keys import CacheKeys
from zccp.cache.meaning import near_words_or_none
from zccp.cache.near import NearRecord, choose
from zccp.cache.redis_target import RedisConnection, connect, parse_redis_url
from zccp.cache.scope import SHARED, Placement
from zccp.config import CacheConfig
from zccp.observe.metrics import EngineMetrics

if TYPE_CHECKING:
    from zccp.cache.redis_target import RedisClient

log = logging.getLogger("zccp.cache.store")

MAX_CANDIDATES = 32

# KEYS: the exact entry keys to try, in order, then the near index's key (none when near
# is off); the script can take several index keys (their members ranked by votes).
# ARGV: how many exact keys, max candidates, the near records' key prefix.
# Returns {i, entry} on an exact hit in KEYS[i], else {0, key1, rec1, key2, rec2, ...}.
# The near records it reads (ARGV[3] .. candidate) are not in KEYS: they are only known
# once the index sets are read. Their names carry KEYS[1]'s hash tag, so they live in its
# slot, on the node the call was routed to, and Redis Cluster runs them (Redis 7 refuses
# keys of a node's other slots only to scripts with a shebang, and keys of other nodes to
# every script). No shebang: Redis 6 runs it too. docs/cache.md, "Redis topologies";
# tests/integration/test_scale_out.py checks it against a real cluster.
LOOKUP_SCRIPT = """
local n = tonumber(ARGV[1])
for i = 1, n do
  local e = redis.call('GET', KEYS[i])
  if e then return {i, e} end
end
local votes, order = {}, {}
for i = n + 1, #KEYS do
  for _, k in ipairs(redis.call('SMEMBERS', KEYS[i])) do
    local v = votes[k]
    if v then votes[k] = v + 1 else votes[k] = 1; order[#order + 1] = k end
  end
end
table.sort(order, function(a, b) return votes[a] > votes[b] end)
local out = {0}
for i = 1, math.min(#order, tonumber(ARGV[2])) do
  local rec = redis.call('GET', ARGV[3] .. order[i])
  if rec then out[#out + 1] = order[i]; out[#out + 1] = rec end
end
return out
"""
RETRY_AFTER_FAILURE_S = 1.0


@dataclass(frozen=True)
class Lookup:
    status: str                       # HIT | NEAR | MISS | BYPASS | ERROR
    reason: str                       # why (the `reason` label of zccp_engine_cache_total)
    answer: CachedAnswer | None = None
    similarity: float = 0.0
    age_s: int = 0
    shared: bool = False              # the answer came from the `shared` owner


def _near_index(keys: CacheKeys) -> str | None:
    """The key of the request's near index; None when its turn allows no near hits."""
    if not keys.near_ok or keys.turn is None:
        return None
    name = keys.turn.index(keys.prefix)
    return None if name is None else keys.placement.key(keys.placement.near_owner, "n", name)


def _near_record(keys: CacheKeys) -> bytes | None:
    """The record that makes this request a near candidate; None when its turn has no units."""
    units = keys.turn.get() if keys.turn is not None else None
    if units is None:
        return None
    p = keys.placement
    shared_entry = p.store_owner == SHARED and p.near_owner != SHARED
    return NearRecord(keys.prefix, shared_entry, units).encode()


@dataclass
class ResponseCache:
    cfg: CacheConfig
    metrics: EngineMetrics
    _conn: RedisConnection = field(init=False)
    _skip_until: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self._timeout = self.cfg.timeout_ms / 1000
        self._conn = connect(parse_redis_url(self.cfg.redis_url), self._timeout)
        self._redis = self._conn.client
        self._lookup = self._redis.register_script(LOOKUP_SCRIPT)
        if self.cfg.near_duplicate:
            near_words_or_none()     # read the word list now, not on the first request (an error is logged)

    @property
    def redis(self) -> RedisClient:
        return self._redis

    async def close(self) -> None:
        await self._conn.aclose()

    async def _call(self, op: Awaitable[Any]) -> Any:
        """One Redis call, given up after timeout_ms whatever the client does inside it."""
        return await asyncio.wait_for(op, self._timeout)

    def _failed(self, what: str, exc: Exception) -> Lookup:
        self.metrics.cache_errors.inc()
        if time.monotonic() >= self._skip_until:
            log.warning("redis %s failed: %s; serving uncached", what, str(exc) or type(exc).__name__)
        self._skip_until = time.monotonic() + RETRY_AFTER_FAILURE_S
        return Lookup("ERROR", "redis")

    def _available(self) -> bool:
        return time.monotonic() >= self._skip_until

    async def lookup(self, keys: CacheKeys, masked_values: Callable[[], tuple[bytes, ...]]) -> Lookup:
        """The answer to serve for these keys, if any. masked_values: the values the masks
        replaced in this request (called only when a hit carries masked values: the guard)."""
        if not self._available():
            self.metrics.cache_errors.inc()
            return Lookup("ERROR", "redis")
        p = keys.placement
        exact = keys.exact.hex()
        index = _near_index(keys) if self.cfg.near_duplicate and p.near_read else None
        near = index is not None
        if not p.lookup_owners and not near:
            return Lookup("MISS", "not_found")    # no-store on shared entries: nothing to read
        redis_keys = [p.key(owner, "e", exact) for owner in p.lookup_owners]
        if index is not None:
            redis_keys.append(index)
        try:
            reply = await self._call(self._lookup(keys=redis_keys, args=[len(p.lookup_owners), MAX_CANDIDATES,
                                                                         p.key(p.near_owner, "s", "")]))
            if reply and reply[0] >= 1:
                ans = CachedAnswer.from_json(reply[1])
                if ans is None:
                    return Lookup("MISS", "not_found")
                shared = p.lookup_owners[reply[0] - 1] == SHARED
                return self._guarded(Lookup("HIT", "exact", ans, 1.0, self._age(ans), shared), masked_values)
            if not near:
                return Lookup("MISS", "not_found")
            return await self._near(keys, p, reply[1:], masked_values)
        except Exception as exc:  # redis errors, timeouts, a dropped connection: never fail the request
            return self._failed("lookup", exc)

    async def _near(self, keys: CacheKeys, p: Placement, flat: list[bytes],
                    masked_values: Callable[[], tuple[bytes, ...]]) -> Lookup:
        assert keys.turn is not None
        v = choose(flat, keys.prefix, keys.turn)
        if v.key is None or v.record is None:
            return Lookup("MISS", v.reason)
        shared = v.record.shared_entry
        if shared and not p.read_shared:
            return Lookup("MISS", "not_found")   # no-store: never a shared entry
        owner = SHARED if shared else p.near_owner
        raw = await self._call(self._redis.get(p.key(owner, "e", v.key.decode("ascii", "replace"))))
        ans = CachedAnswer.from_json(raw) if raw is not None else None
        if ans is None:
            return Lookup("MISS", "not_found")
        return self._guarded(Lookup("NEAR", "near", ans, v.similarity, self._age(ans), shared), masked_values)

    @staticmethod
    def _guarded(hit: Lookup, masked_values: Callable[[], tuple[bytes, ...]]) -> Lookup:
        """The masked-literal guard: an entry whose text carries a masked value of its own
        request is served only to a request whose masks replaced that very value too
        (not one that merely carries it elsewhere, say in metadata)."""
        assert hit.answer is not None
        if hit.answer.literals and hit.answer.leaks_to(masked_values()) is not None:
            return Lookup("MISS", "masked_literal")
        return hit

    @staticmethod
    def _age(ans: CachedAnswer) -> int:
        return max(0, int(time.time() - ans.created))

    def l1_ttl(self, answer: CachedAnswer, age_s: int = 0) -> int:
        """How long nginx may keep this answer by its exact key (meta.cache_ttl_s): never when
        it carries a masked value (only the engine can run the guard), else its remaining TTL."""
        if answer.literals:
            return 0
        return max(0, self.cfg.ttl_s - age_s)

    async def store(self, keys: CacheKeys, answer: CachedAnswer) -> None:
        if not self._available():
            return
        p = keys.placement
        exact = keys.exact.hex()
        ttl = self.cfg.ttl_s
        try:
            pipe = self._redis.pipeline(transaction=False)
            pipe.set(p.key(p.store_owner, "e", exact), answer.to_json(), ex=ttl)
            index = _near_index(keys)
            record = _near_record(keys) if index is not None else None
            if index is not None and record is not None:
                pipe.set(p.key(p.near_owner, "s", exact), record, ex=ttl)
                pipe.sadd(index, exact)
                pipe.expire(index, ttl)
            await pipe.execute()     # after the answer: bounded by the socket timeouts, no deadline
        except Exception as exc:
            self._failed("store", exc)
