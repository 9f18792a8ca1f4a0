"""Keys and limits on a Redis Cluster, two complete hosts sharing it (issue 18): nginx finds
each key record on whichever master holds it (MOVED followed), every counter of a tenant
lives in one hash slot (the tenant's tag), and a key's limit holds across both hosts."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cache_requests import NULL, req
from tests.support.harness import Stack
from tests.support.keys_helpers import keys_cli, status
from tests.support.redis_topologies import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        yield c.start()
    finally:
        c.stop()


def test_keys_and_a_limit_across_two_hosts_on_a_cluster(cluster: LocalCluster, tmp_path: Path):
    hosts = []
    try:
        for name, startup in (("a", 1), ("b", None)):
            hosts.append(Stack(tmp_path / name, {"model": NULL, "auth": {"mode": "keys", "cache_ttl_s": 1},
                                                 "cache": {"enabled": True, "redis_url": cluster.url(startup),
                                                           "timeout_ms": 1000}}).start())
        a, b = hosts
        if time.time() % 60 > 45:
            time.sleep(61 - time.time() % 60)
        keys = [keys_cli(a, "create", "--tenant", f"team-{i}", "--rpm", "4") for i in range(8)]
        # the records spread over the masters (by their hash): nginx follows MOVED to each
        records = cluster.keys("zccp:auth:k:*")
        assert sum(len(v) for v in records.values()) == 8 and sum(1 for v in records.values() if v) >= 2
        body = req("anthropic", [{"role": "user", "content": "hi"}])
        for k in keys:
            codes = [status((a, b)[i % 2], "anthropic", body, x_api_key=k["key"], cache_control="no-store").status_code
                     for i in range(5)]
            assert codes == [200, 200, 200, 200, 429], (k["tenant"], codes)   # 4 a minute, over both hosts
        # one tenant's counters, all in one slot
        found = cluster.keys("zccp:lim:*")
        slots = {}
        for node_keys in found.values():
            for key in node_keys:
                tag = key.decode().split("{", 1)[1].split("}", 1)[0]
                slots.setdefault(tag, set()).add(key.decode())
        assert set(slots) == {f"team-{i}" for i in range(8)}
        for tag in slots:
            nodes = {n for n, ks in found.items() if any(k.decode().startswith(f"zccp:lim:{{{tag}}}") for k in ks)}
            assert len(nodes) == 1, tag
        keys_cli(a, "revoke", keys[0]["id"])
        time.sleep(1.2)
        assert status(b, "anthropic", body, x_api_key=keys[0]["key"]).status_code == 401
    finally:
        for s in hosts:
            s.stop()
