"""Concurrency counts that mend (docs/keys.md, "Concurrency is exact"): a key's requests in
flight are a Redis hash of each nginx worker's count ("<count> <time>", Redis' clock). The
admission script counts the fresh fields and drops those not written for 5 s (an nginx
that died with requests in flight); each worker writes its own count again, so a count
Redis holds wrongly for a live worker (a give-back a demoted master took) is put right by
that worker without waiting for the key's TTL. Real nginx, engine and Redis."""

from __future__ import annotations

import threading
import time

import httpx
import redis

from tests.support.cache_requests import NULL, PATHS, req
from tests.support.keys_helpers import keys_cli, status

AUTH = {"mode": "keys", "cache_ttl_s": 1, "negative_ttl_s": 1}


def inflight_key(tenant: str, kid: str) -> str:
    return f"zccp:lim:{{{tenant}}}:k:{kid}:inflight"


def wait_for(what: str, cond, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"never: {what}")


def test_a_dead_workers_count_stops_counting_and_a_live_ones_counts(make_stack):
    s = make_stack({"model": NULL, "auth": AUTH}, with_redis=True)
    r = redis.Redis.from_url(s.cfg.cache.redis_url)
    rec = keys_cli(s, "create", "--tenant", "inf", "--concurrency", "1")
    k, hk = rec["key"], inflight_key("inf", rec["id"])
    body = req("anthropic", [{"role": "user", "content": "hi"}], max_tokens=4)

    def one() -> int:
        return status(s, "anthropic", body, x_api_key=k, cache_control="no-store").status_code

    assert one() == 200
    wait_for("the worker's field is gone once its request ended", lambda: not r.hgetall(hk))
    now = int(r.time()[0])
    r.hset(hk, "other-stack.1", f"1 {now}")          # another nginx's request, in flight now
    assert one() == 429
    r.hset(hk, "other-stack.1", f"1 {now - 60}")     # that nginx died a minute ago
    assert one() == 200
    assert b"other-stack.1" not in r.hgetall(hk)     # dropped by the admission script
    r.hset(hk, "garbage", "not a count")             # untrusted: a field it cannot read
    assert one() == 200
    assert b"garbage" not in r.hgetall(hk)
    assert "runtime error" not in s.error_log()


def test_a_worker_puts_right_a_count_redis_holds_wrongly_for_it(make_stack):
    s = make_stack({"model": dict(NULL, null_token_delay_ms=20), "auth": AUTH}, with_redis=True)
    r = redis.Redis.from_url(s.cfg.cache.redis_url)
    rec = keys_cli(s, "create", "--tenant", "mend", "--concurrency", "2")
    k, hk = rec["key"], inflight_key("mend", rec["id"])
    short = req("anthropic", [{"role": "user", "content": "hi"}], max_tokens=4)
    long = req("anthropic", [{"role": "user", "content": "hi"}], max_tokens=60, stream=True)
    fields: list[dict] = []

    def slow() -> None:
        with httpx.stream("POST", s.url(PATHS["anthropic"]), json=long, timeout=30,
                          headers={"x-api-key": k, "cache-control": "no-store"}) as resp:
            assert resp.status_code == 200
            for _ in resp.iter_bytes():
                if not fields:
                    fields.append(r.hgetall(hk))

    t = threading.Thread(target=slow)
    t.start()
    t.join(60)
    assert fields and len(fields[0]) == 1, fields          # one worker held one request
    (uid, value), = fields[0].items()
    assert value.split()[0] == b"1", value
    # the give-back Redis lost (as a demoted master loses it): the worker's field says 2,
    # stamped far ahead, so that only the worker's own write can take it away
    r.hset(hk, uid, f"2 {int(r.time()[0]) + 3600}")
    wait_for("the worker writes its own count (0) again", lambda: uid not in r.hgetall(hk))
    codes: list[int] = []
    ts = [threading.Thread(target=lambda: codes.append(
        status(s, "anthropic", short, x_api_key=k, cache_control="no-store").status_code)) for _ in range(2)]
    for x in ts:
        x.start()
    for x in ts:
        x.join(60)
    assert codes == [200, 200], codes                       # both concurrency slots free
    assert "runtime error" not in s.error_log()


def test_a_far_concurrency_limit_lends_a_worker_spare_slots_that_go_back(make_stack):
    """Limit 1000, nothing in flight: the first admission's round gives its worker 1 + 62
    spare slots (1/16 of what is free), so that its next admissions need no Redis; they go
    back once the worker has not needed them all for 1 s (zccp.plugins.limits.lease.IDLE_S)."""
    s = make_stack({"model": NULL, "auth": AUTH}, with_redis=True)
    r = redis.Redis.from_url(s.cfg.cache.redis_url)
    rec = keys_cli(s, "create", "--tenant", "far", "--concurrency", "1000")
    k, hk = rec["key"], inflight_key("far", rec["id"])
    body = req("anthropic", [{"role": "user", "content": "hi"}], max_tokens=4)
    seen: list[list[int]] = []
    for _ in range(5):   # (read at once: a loaded machine may take 1 s between two requests)
        assert status(s, "anthropic", body, x_api_key=k, cache_control="no-store").status_code == 200
        seen.append([int(v.split()[0]) for v in r.hgetall(hk).values()])
        if any(c > 1 for c in seen[-1]):
            break
    counts = seen[-1]
    assert counts and max(counts) == 63 and sum(counts) <= 1000, seen
    wait_for("the spare slots go back", lambda: not r.hgetall(hk))
    assert "runtime error" not in s.error_log()
