"""A purge on one host reaches every host's nginx L1 (issue 20): two complete stacks share one
Redis; host b's L1 keeps an answer; a purge on host a; b's next request is no L1 hit, once
b's engine has read the new purge epoch (every 0.25 s), long before b's L1 TTL (600 s). And
the Redis the stack starts is bounded."""

from __future__ import annotations

import time

import httpx
import redis

from tests.support.cache_requests import NULL, PATHS, req

TTL = {"ttl_s": 600, "l1": {"ttl_s": 600}}


def layer(r: httpx.Response) -> str:
    return f'{r.headers["x-zccp-cache"]}/{r.headers.get("x-zccp-cache-layer", "-")}'


def post(s, body: dict, **headers: str) -> httpx.Response:
    r = httpx.post(s.url(PATHS["anthropic"]), json=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r


def until(what, guard_s: float = 10):
    """what() until it is truthy (guard_s against a hang, not a timing assertion)."""
    end = time.monotonic() + guard_s
    while True:
        got = what()
        if got or time.monotonic() > end:
            return got
        time.sleep(0.05)


def purge_epoch(s) -> int:
    reader = s.arena()
    try:
        return reader.purge_epoch
    finally:
        reader.close()


def test_a_purge_on_one_host_empties_every_hosts_l1(make_stack):
    a = make_stack({"model": NULL, "cache": TTL}, with_redis=True)
    b = make_stack({"model": NULL, "cache": {"enabled": True, "redis_url": a.cfg.cache.redis_url, **TTL}})
    body = req("anthropic", [{"role": "user", "content": "Name three lakes"}])
    assert layer(post(a, body)) == "MISS/-"
    # b: the engine's replay from the shared Redis, which b's nginx keeps; then b's L1 answers
    assert until(lambda: layer(post(b, body)) == "HIT/L2")
    assert layer(post(b, body)) == "HIT/L1"
    before = purge_epoch(b)
    assert before != 0 and purge_epoch(a) == before   # one epoch, shared through Redis

    with a.admin_client() as c:
        r = c.post("/v1/zccp/purge", json={"all": True})
    assert r.status_code == 200 and r.json()["purged"] >= 1, r.text
    assert until(lambda: purge_epoch(b) != before), "b's engine never read the new purge epoch"
    assert purge_epoch(a) == purge_epoch(b)
    # b's L1 entry is unreachable now; Redis was purged: the engine's MISS
    assert layer(post(b, body)) == "MISS/-"
    a.assert_no_leaks()
    b.assert_no_leaks()


def test_the_stacks_redis_is_bounded_and_evicts_like_a_cache(make_stack):
    s = make_stack({"model": NULL, "cache": {"redis_maxmemory_mb": 64}}, with_redis=True)
    r = redis.Redis.from_url(s.cfg.cache.redis_url)
    try:
        assert r.config_get("maxmemory")["maxmemory"] == str(64 << 20)
        assert r.config_get("maxmemory-policy")["maxmemory-policy"] == "allkeys-lru"
    finally:
        r.close()
