"""The limits' local fast path (zccp.plugins.limits.lease, docs/keys.md "Leases") through the real nginx,
engine and Redis: admissions are spent from each worker's lease of a window's budget, with
no Redis round trip while it lasts, and still never pass the limit across two stacks;
unspent leases go back to Redis; concurrency stays exact; a revoked key holding leases
stops within auth.cache_ttl_s."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from tests.support.cache_requests import NULL, req
from tests.support.keys_helpers import keys_cli, status
from zccp.ops.stack import free_port

AUTH = {"mode": "keys", "cache_ttl_s": 1, "negative_ttl_s": 1}
SHARE = 16        # zccp.plugins.limits.lease.SHARE: a lease takes about 1/SHARE of what is left
WORKERS = 2       # nginx workers per stack (the harness's)


def fresh_minute() -> None:
    """Start well inside a minute (the windows these tests count in)."""
    if time.time() % 60 > 40:
        time.sleep(61 - time.time() % 60)


def counter(r: redis.Redis, tenant: str, key_id: str, what: str) -> int:
    minute = int(time.time() // 60)
    return int(r.get(f"zccp:lim:{{{tenant}}}:k:{key_id}:{what}:{minute}") or 0)


@pytest.fixture
def auth_redis(tmp_path: Path):
    """A Redis of its own for keys and counters (auth.redis_url), that a test may stop."""
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    r = redis.Redis(port=port)
    for _ in range(100):
        try:
            r.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    try:
        yield proc, f"redis://127.0.0.1:{port}/0", r
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_admissions_are_spent_from_leases_without_redis_up_to_the_lease_bound(make_stack, auth_redis):
    proc, url, r = auth_redis
    s = make_stack({"model": NULL, "auth": dict(AUTH, cache_ttl_s=60, redis_url=url)}, with_redis=True)
    fresh_minute()
    rpm = 160
    k = keys_cli(s, "create", "--tenant", "acme", "--rpm", str(rpm), "--otpm", "100000")
    conc = keys_cli(s, "create", "--tenant", "acme", "--concurrency", "5")
    body = req("anthropic", [{"role": "user", "content": "hi"}], max_tokens=4)
    for _ in range(6):   # both workers verify the keys and lease
        assert status(s, "anthropic", body, x_api_key=k["key"], cache_control="no-store").status_code == 200
        assert status(s, "anthropic", body, x_api_key=conc["key"], cache_control="no-store").status_code == 200
    leased = counter(r, "acme", k["id"], "rpm")
    assert 6 < leased <= rpm, leased       # slices were leased, not one request each
    proc.kill()
    proc.wait(5)
    # Redis is gone: the leased key goes on within what its workers hold, then 503 (fail
    # closed); the exact concurrency limit needs Redis at every admission: 503 at once
    assert status(s, "anthropic", body, x_api_key=conc["key"], cache_control="no-store").status_code == 503
    codes = Counter(status(s, "anthropic", body, x_api_key=k["key"], cache_control="no-store").status_code
                    for _ in range(WORKERS * (rpm // SHARE + 1) + 20))
    assert codes[200] >= 1, codes                              # no round trip per admission
    assert codes[200] <= leased - 6, codes                     # never more than was leased
    assert codes[503] >= 1 and set(codes) <= {200, 503}, codes


def test_a_token_limit_holds_with_leases_under_concurrency_on_two_stacks(make_stack):
    a = make_stack({"model": NULL, "auth": AUTH}, with_redis=True)
    b = make_stack({"model": NULL, "auth": AUTH, "cache": {"enabled": True, "redis_url": a.cfg.cache.redis_url}})
    fresh_minute()
    limit = 160        # 20 answers of max_tokens 8: the clients ask for more within the run
    k = keys_cli(a, "create", "--tenant", "burst", "--otpm", str(limit))
    served = Counter[str]()
    codes = Counter[int]()
    lock = threading.Lock()
    stop = time.time() + 4

    def client(i: int) -> None:
        s = (a, b)[i % 2]
        n = 0
        while time.time() < stop:
            body = req("anthropic", [{"role": "user", "content": f"client {i} question {n}"}], max_tokens=8)
            resp = status(s, "anthropic", body, x_api_key=k["key"], cache_control="no-store")
            n += 1
            with lock:
                codes[resp.status_code] += 1
                if resp.status_code == 200:
                    served["out"] += resp.json()["usage"]["output_tokens"]
            if resp.status_code == 429:
                time.sleep(0.05)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(codes) <= {200, 429}, codes
    assert codes[429] > 0, codes
    assert served["out"] <= limit, (served, codes)        # max_tokens reserved from leases: never past N
    assert served["out"] >= limit // 2, (served, codes)   # and the leases did not strand most of it
    r = redis.Redis.from_url(a.cfg.cache.redis_url)
    assert counter(r, "burst", k["id"], "otpm") <= limit   # what all workers leased, together


def test_concurrency_is_exact_across_two_stacks(make_stack):
    a = make_stack({"model": dict(NULL, null_token_delay_ms=150), "auth": AUTH}, with_redis=True)
    b = make_stack({"model": dict(NULL, null_token_delay_ms=150), "auth": AUTH,
                    "cache": {"enabled": True, "redis_url": a.cfg.cache.redis_url}})
    k = keys_cli(a, "create", "--tenant", "acme", "--concurrency", "2", "--rpm", "1000")["key"]
    for s in (a, b):   # the key verified on every worker before the burst
        for _ in range(3):
            status(s, "anthropic", req("anthropic", [{"role": "user", "content": "warm"}], max_tokens=1),
                   x_api_key=k, cache_control="no-store")
    time.sleep(0.3)
    got: list[int] = []
    barrier = threading.Barrier(6)

    def one(i: int) -> None:
        body = req("anthropic", [{"role": "user", "content": f"slow {i}"}], max_tokens=12)   # ~1.8 s
        barrier.wait()
        got.append(status((a, b)[i % 2], "anthropic", body, x_api_key=k, cache_control="no-store").status_code)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == [200, 200, 429, 429, 429, 429], got


def test_a_revoked_key_holding_leases_stops_within_the_bound_and_its_leases_go_back(make_stack):
    a = make_stack({"model": NULL, "auth": AUTH}, with_redis=True)
    b = make_stack({"model": NULL, "auth": AUTH, "cache": {"enabled": True, "redis_url": a.cfg.cache.redis_url}})
    fresh_minute()
    k = keys_cli(a, "create", "--tenant", "acme", "--rpm", "1600")
    body = req("anthropic", [{"role": "user", "content": "hi"}], max_tokens=4)
    sent = 0
    for _ in range(5):
        for s in (a, b):
            assert status(s, "anthropic", body, x_api_key=k["key"], cache_control="no-store").status_code == 200
            sent += 1
    r = redis.Redis.from_url(a.cfg.cache.redis_url)
    assert counter(r, "acme", k["id"], "rpm") > sent    # the workers hold leases
    keys_cli(a, "revoke", k["id"])
    time.sleep(AUTH["cache_ttl_s"] + 0.3)               # the revocation bound
    for s in (a, b):
        assert status(s, "anthropic", body, x_api_key=k["key"]).status_code == 401
    # unspent leases are given back once idle (zccp.plugins.limits.lease.IDLE_S) : the counter is what was served
    time.sleep(1.5)
    assert counter(r, "acme", k["id"], "rpm") == sent


def test_count_tokens_and_models_count_as_requests(make_stack):
    s = make_stack({"model": NULL, "auth": AUTH}, with_redis=True)
    fresh_minute()
    k = keys_cli(s, "create", "--tenant", "counted", "--rpm", "3", "--otpm", "1000")["key"]
    h = {"x-api-key": k, "anthropic-version": "2023-06-01"}
    c = s.client()
    count = {"model": "zccp-tiny", "messages": [{"role": "user", "content": "hi"}]}
    r = c.post("/v1/messages/count_tokens", json=count, headers=h)
    assert r.status_code == 200 and r.headers["anthropic-ratelimit-requests-remaining"] == "2", r.text
    assert c.get("/v1/models", headers=h).status_code == 200
    body = req("anthropic", [{"role": "user", "content": "hi"}])
    assert status(s, "anthropic", body, x_api_key=k, cache_control="no-store").status_code == 200
    assert status(s, "anthropic", body, x_api_key=k, cache_control="no-store").status_code == 429   # 3 a minute
    time.sleep(0.3)
    usage = keys_cli(s, "usage", "--tenant", "counted")["tenant"]
    assert usage["requests"] == 4 and usage["status_200"] == 3 and usage["status_429"] == 1, usage
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0   # the generation's only


def nginx_workers(master: int) -> set[int]:
    """The nginx master's worker processes (its children), from /proc."""
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_bytes()
            except OSError:
                continue
            if int(stat[stat.rindex(b")") + 2:].split()[1]) == master:
                out.add(int(d.name))
    return out


def test_a_reload_gives_the_exiting_workers_leases_back(make_stack):
    """The workers a reload replaces give back what they leased and did not spend, as they
    exit (lease.collect, all): nobody else could, as each lease lives in one worker's memory.
    Requests go on until the reload is sent, so no lease is idle (lease.IDLE_S) before then."""
    s = make_stack({"model": NULL, "auth": AUTH}, with_redis=True)
    fresh_minute()
    k = keys_cli(s, "create", "--tenant", "acme", "--rpm", "16000")
    body = req("anthropic", [{"role": "user", "content": "hi"}], max_tokens=4)
    r = redis.Redis.from_url(s.cfg.cache.redis_url)
    assert s.nginx is not None
    master = s.nginx.proc.pid
    old = nginx_workers(master)
    sent = 0
    with s.client() as c:   # one client: its connections close with the old workers
        for _ in range(20):
            resp = c.post("/v1/messages", json=body, headers={"x-api-key": k["key"], "cache-control": "no-store"})
            assert resp.status_code == 200, resp.text
            sent += 1
        assert counter(r, "acme", k["id"], "rpm") > sent    # the workers hold leases (1/SHARE of 16000)
        os.kill(master, signal.SIGHUP)
    deadline = time.monotonic() + 30
    while nginx_workers(master) & old and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not nginx_workers(master) & old, "the old workers did not exit"
    # Nothing after the reload leased (no request went to the new workers), and the old ones
    # are gone: what they had not spent is back only if their exit gave it back.
    assert counter(r, "acme", k["id"], "rpm") == sent
