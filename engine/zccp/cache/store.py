"""The response cache in Redis: exact entries and an LSH band index for near-duplicates.

Keys (all under `zccp:v1:`, all with the configured TTL):
  e:<exact hex>                 the entry: orjson {text, stop_reason, stop_sequence, output_tokens, deltas, created}
  s:<exact hex>                 scope (32 bytes) + MinHash signature (128 little-endian u32): for Jaccard checks
  b:<band index>:<band hex>     set of exact keys whose signature has this band

A lookup is one round trip: a server-side script (LOOKUP_SCRIPT) does the exact GET
and, on a miss, the 16 band SMEMBERS, ranks the candidates by shared bands and
returns the best MAX_CANDIDATES with their scope + signature; a near hit costs one
more round trip for the winner's entry. Only entries whose fingerprint saw the whole prompt are indexed
by band, and a candidate only counts when its scope — every output-relevant
parameter and the system prompt — is byte-identical to the request's.

Redis down or slow: the lookup answers ERROR within `timeout_ms`, a counter rises,
and for one second after a failure the cache is not even tried (no request waits
on a dead Redis); then it is tried again, so it comes back by itself.
"""

from __future__ import annotations

import logging
import struct
import time
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from zccp.abi import MINHASH_COUNT
from zccp.cache.answer import CachedAnswer
from zccp.cache.fp.csf import estimate_jaccard
from zccp.cache.keys import CacheKeys
from zccp.config import CacheConfig
from zccp.metrics import EngineMetrics

log = logging.getLogger("zccp.cache.store")

PREFIX = "zccp:v1:"
MAX_CANDIDATES = 32

# KEYS: the exact entry key, then the band keys (none when near-duplicates are off).
# ARGV: max candidates, the signature key prefix.
# Returns {1, entry} on an exact hit, else {0, key1, sig1, key2, sig2, ...}.
LOOKUP_SCRIPT = """
local e = redis.call('GET', KEYS[1])
if e then return {1, e} end
local votes, order = {}, {}
for i = 2, #KEYS do
  for _, k in ipairs(redis.call('SMEMBERS', KEYS[i])) do
    local v = votes[k]
    if v then votes[k] = v + 1 else votes[k] = 1; order[#order + 1] = k end
  end
end
table.sort(order, function(a, b) return votes[a] > votes[b] end)
local out = {0}
for i = 1, math.min(#order, tonumber(ARGV[1])) do
  local sig = redis.call('GET', ARGV[2] .. order[i])
  if sig then out[#out + 1] = order[i]; out[#out + 1] = sig end
end
return out
"""
RETRY_AFTER_FAILURE_S = 1.0


@dataclass(frozen=True)
class Lookup:
    status: str                       # HIT | NEAR | MISS | BYPASS | ERROR
    answer: CachedAnswer | None = None
    similarity: float = 0.0
    age_s: int = 0


def _sig_bytes(scope: bytes, sig: tuple[int, ...]) -> bytes:
    return scope + struct.pack(f"<{len(sig)}I", *sig)


def _parse_sig(raw: bytes | None) -> tuple[bytes, tuple[int, ...]] | None:
    if raw is None or len(raw) != 32 + 4 * MINHASH_COUNT:
        return None
    return raw[:32], struct.unpack(f"<{MINHASH_COUNT}I", raw[32:])


@dataclass
class ResponseCache:
    cfg: CacheConfig
    metrics: EngineMetrics
    _redis: aioredis.Redis = field(init=False)
    _skip_until: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        t = self.cfg.timeout_ms / 1000
        self._redis = aioredis.Redis.from_url(self.cfg.redis_url, socket_timeout=t, socket_connect_timeout=t,
                                              retry_on_timeout=False, health_check_interval=0)
        self._lookup = self._redis.register_script(LOOKUP_SCRIPT)

    async def close(self) -> None:
        await self._redis.aclose()

    def _failed(self, what: str, exc: Exception) -> Lookup:
        self.metrics.cache_errors.inc()
        if time.monotonic() >= self._skip_until:
            log.warning("redis %s failed: %s; serving uncached", what, exc)
        self._skip_until = time.monotonic() + RETRY_AFTER_FAILURE_S
        return Lookup("ERROR")

    def _available(self) -> bool:
        return time.monotonic() >= self._skip_until

    async def lookup(self, keys: CacheKeys) -> Lookup:
        if not self._available():
            self.metrics.cache_errors.inc()
            return Lookup("ERROR")
        exact = keys.exact.hex()
        near = keys.near_ok and self.cfg.near_duplicate
        redis_keys = [PREFIX + "e:" + exact]
        if near:
            redis_keys += [f"{PREFIX}b:{i}:{band:016x}" for i, band in enumerate(keys.bands)]
        try:
            reply = await self._lookup(keys=redis_keys, args=[MAX_CANDIDATES, PREFIX + "s:"])
            if reply and reply[0] == 1:
                hit = CachedAnswer.from_json(reply[1])
                if hit is not None:
                    return Lookup("HIT", hit, 1.0, self._age(hit))
                return Lookup("MISS")
            if not near:
                return Lookup("MISS")
            return await self._near(keys, reply[1:])
        except Exception as exc:  # redis errors, timeouts, a dropped connection: never fail the request
            return self._failed("lookup", exc)

    async def _near(self, keys: CacheKeys, flat: list[bytes]) -> Lookup:
        best, best_sim = None, 0.0
        for cand, raw in zip(flat[0::2], flat[1::2]):
            parsed = _parse_sig(raw)
            if parsed is None or parsed[0] != keys.scope:
                continue
            sim = estimate_jaccard(parsed[1], keys.signature)
            if sim > best_sim:
                best, best_sim = cand, sim
        if best is None or best_sim < self.cfg.similarity_threshold:
            return Lookup("MISS")
        raw = await self._redis.get(PREFIX + "e:" + best.decode())
        ans = CachedAnswer.from_json(raw) if raw is not None else None
        if ans is None:
            return Lookup("MISS")
        return Lookup("NEAR", ans, best_sim, self._age(ans))

    @staticmethod
    def _age(ans: CachedAnswer) -> int:
        return max(0, int(time.time() - ans.created))

    async def store(self, keys: CacheKeys, answer: CachedAnswer) -> None:
        if not self._available():
            return
        exact = keys.exact.hex()
        ttl = self.cfg.ttl_s
        try:
            pipe = self._redis.pipeline(transaction=False)
            pipe.set(PREFIX + "e:" + exact, answer.to_json(), ex=ttl)
            if keys.near_ok:
                pipe.set(PREFIX + "s:" + exact, _sig_bytes(keys.scope, keys.signature), ex=ttl)
                for i, band in enumerate(keys.bands):
                    k = f"{PREFIX}b:{i}:{band:016x}"
                    pipe.sadd(k, exact)
                    pipe.expire(k, ttl)
            await pipe.execute()
        except Exception as exc:
            self._failed("store", exc)
