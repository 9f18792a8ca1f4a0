"""Keys and limits through Redis Sentinel (issue 30): nginx's Redis client (zccp.lib.redis over
lua-resty-redis and lua-resty-redis-connector) asks a real `redis-sentinel` for the master,
finds keys there and counts a concurrency limit there (a script at every admission, so a
write per request), and follows a `SENTINEL FAILOVER` by itself, with no request refused
while it happens (each worker asks the Sentinel again after 1 s, at once when the master
refuses a connection or answers READONLY)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cache_requests import NULL, req
from tests.support.harness import Stack
from tests.support.keys_helpers import keys_cli, status
from tests.support.redis_topologies import LocalSentinel, Node


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[LocalSentinel]:
    s = LocalSentinel(tmp_path / "redis-sentinel")
    try:
        yield s.start()
    finally:
        s.stop()


def limit_keys(node: Node, tenant: str) -> list[bytes]:
    with node.client() as c:
        return list(c.scan_iter(match=f"zccp:lim:{{{tenant}}}*", count=1000))


def test_keys_and_a_concurrency_limit_through_sentinel_follow_a_failover(sentinel: LocalSentinel, tmp_path: Path):
    s = Stack(tmp_path / "a", {"model": NULL, "auth": {"mode": "keys", "cache_ttl_s": 1, "negative_ttl_s": 1},
                               "cache": {"enabled": True, "redis_url": sentinel.url(), "timeout_ms": 1000}}).start()
    try:
        body = req("anthropic", [{"role": "user", "content": "hi"}])
        k = keys_cli(s, "create", "--tenant", "team-s", "--concurrency", "2")
        assert status(s, "anthropic", body, x_api_key="zk_nope").status_code == 401
        codes = [status(s, "anthropic", body, x_api_key=k["key"], cache_control="no-store").status_code
                 for _ in range(3)]
        assert codes == [200, 200, 200]
        # the concurrency count lives on the master the Sentinel names (fail closed: a 200 is
        # an admission script that ran there)
        assert limit_keys(sentinel.master, "team-s")

        # requests all through the failover: each is an admission script on whichever master
        # nginx was told of (the old one takes writes until the Sentinel makes it a replica)
        during: list[int] = []
        done = threading.Event()

        def load() -> None:
            for _ in range(400):        # bounded: ~20 s at most
                if done.is_set():
                    return
                during.append(status(s, "anthropic", body, x_api_key=k["key"], cache_control="no-store").status_code)
                time.sleep(0.05)

        t = threading.Thread(target=load, daemon=True)
        t.start()
        try:
            new = sentinel.failover()
        finally:
            done.set()
            t.join(60)
        assert new is sentinel.replica and sentinel.master.call("ROLE")[0] == b"slave"
        assert during and set(during) == {200}, during
        codes = [status(s, "anthropic", body, x_api_key=k["key"], cache_control="no-store").status_code
                 for _ in range(5)]
        assert codes == [200] * 5, codes
        # a key made after the failover (the engine's client writes it to the new master)
        k2 = keys_cli(s, "create", "--tenant", "team-t", "--concurrency", "1")
        r = status(s, "openai", req("openai", [{"role": "user", "content": "hi"}]),
                   authorization=f"Bearer {k2['key']}", cache_control="no-store")
        assert r.status_code == 200, r.text
        assert limit_keys(new, "team-t")
        assert "runtime error" not in s.error_log()
        s.assert_no_leaks()
    finally:
        s.stop()
