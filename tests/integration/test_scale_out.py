"""More than one machine (docs/scale-out.md), on loopback: two complete ZCCP hosts (each its
own nginx, engine, ports, arena and doorbell socket) sharing one 3-master Redis Cluster as
the cache, and a host whose cache is the master a Redis Sentinel names, through a failover.

Each host runs the null model with a reply of its own, so an answer served by host b that
says "answered by host a" can only have come through the shared cache.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

from tests.support.cache_requests import (
    ENGINE_ENV,
    CHAT,
    NULL,
    Q,
    REWORDED,
    cache_of,
    eventually,
    metric,
    post,
    req,
    reworded,
    stored,
)
from tests.support.harness import Stack
from tests.support.redis_topologies import LocalCluster, LocalSentinel, Node, wait_for

# A second per Redis call leaves room for a busy shared test machine; a hung node still
# answers ERROR within it.
TIMEOUT_MS = 1000


def host(run_dir: Path, name: str, redis_url: str) -> Stack:
    # These tests are about the engines and the Redis they share: nginx's L1 (each host's
    # own, tests/integration/test_l1.py) would answer a repeat before Redis is asked.
    return Stack(run_dir / name, {"model": dict(NULL, null_reply=f"answered by host {name}"),
                                  "cache": {"enabled": True, "redis_url": redis_url, "timeout_ms": TIMEOUT_MS,
                                            "l1": {"enabled": False}}})


def text_of(api: str, r) -> str:
    j = r.json()
    return j["content"][0]["text"] if api == "anthropic" else j["choices"][0]["message"]["content"]


def history(i: int) -> list:
    """Conversation i: its own earlier turns, so its own prefix key and hash tag."""
    return [{"role": "user", "content": f"Tell me about city number {i}."},
            {"role": "assistant", "content": f"City number {i} is a port on a river."},
            {"role": "user", "content": Q}]


# ------------------------------------------------------------------------------------- Redis Cluster

@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture(scope="module")
def hosts(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Stack]]:
    """Host a knows one cluster node (the client finds the others), host b all three."""
    run_dir = tmp_path_factory.mktemp("hosts")
    made: list[Stack] = []
    try:
        for name, startup in (("a", 1), ("b", None)):
            made.append(host(run_dir, name, cluster.url(startup)))
            made[-1].start()
        yield made[0], made[1]
    finally:
        for s in made:
            s.stop()


@pytest.fixture
def shared(cluster: LocalCluster, hosts: tuple[Stack, Stack]) -> tuple[Stack, Stack]:
    """Both hosts, over an empty cluster."""
    for n in cluster.nodes:
        n.call("FLUSHALL")
    return hosts


def zccp_keys(cluster: LocalCluster) -> dict[str, list[bytes]]:
    return cluster.keys("zccp:*")


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_an_answer_from_one_host_is_a_hit_on_the_other(shared, api):
    a, b = shared
    r = post(a, api, req(api, CHAT))
    assert r.headers["x-zccp-cache"] == "MISS" and text_of(api, r) == "answered by host a"
    assert eventually(b, api, req(api, CHAT)) == "HIT"
    r = post(b, api, req(api, CHAT))
    assert r.headers["x-zccp-cache"] == "HIT" and text_of(api, r) == "answered by host a"
    # and the other way round
    stored(b, api, req(api, history(1)))
    r = post(a, api, req(api, history(1)))
    assert r.headers["x-zccp-cache"] == "HIT" and text_of(api, r) == "answered by host b"
    a.assert_no_leaks()
    b.assert_no_leaks()


def test_a_reworded_question_is_a_near_hit_on_the_other_host_in_the_same_tenant_only(shared):
    a, b = shared
    stored(a, "anthropic", req("anthropic", CHAT), x_api_key="team-1")
    r = post(b, "anthropic", req("anthropic", REWORDED), x_api_key="team-1")
    assert r.headers["x-zccp-cache"] == "NEAR", r.headers
    assert 0.85 <= float(r.headers["x-zccp-similarity"]) < 1.0
    assert text_of("anthropic", r) == "answered by host a"
    # near hits stay within the tenant, and within the conversation
    assert cache_of(b, "anthropic", req("anthropic", REWORDED), x_api_key="team-2") == "MISS"
    other = [{"role": "user", "content": "What is the capital of Austria?"}] + REWORDED[1:]
    assert cache_of(b, "anthropic", req("anthropic", other), x_api_key="team-1") == "MISS"


def test_a_masked_request_does_not_cross_tenants_across_hosts(shared):
    a, b = shared
    ann = req("anthropic", [{"role": "user", "content": "Write to ann@north.com about invoice 123456789"}])
    bob = req("anthropic", [{"role": "user", "content": "Write to bob@south.org about invoice 987654321"}])
    stored(a, "anthropic", ann, x_api_key="key-ann")
    assert cache_of(b, "anthropic", bob, x_api_key="key-bob") == "MISS"
    assert cache_of(b, "anthropic", bob) == "MISS"                      # anonymous
    r = post(b, "anthropic", bob, x_api_key="key-ann")                 # the same tenant: served
    assert r.headers["x-zccp-cache"] == "HIT" and text_of("anthropic", r) == "answered by host a"


def test_keys_spread_over_every_master_one_request_in_one_slot(shared, cluster):
    a, b = shared
    for i in range(24):
        stored(a if i % 2 else b, "anthropic", req("anthropic", history(i)))
    by_node = zccp_keys(cluster)
    assert all(by_node.values()), {k: len(v) for k, v in by_node.items()}   # every master holds some
    # every key of one request (entry, near record, near index) carries one hash tag: one slot
    tags: dict[str, set[str]] = {}
    for node, keys in by_node.items():
        for k in keys:
            tag = re.match(rb"zccp:v2:\{([0-9a-f]{32})\}:", k)
            assert tag is not None, k
            tags.setdefault(tag.group(1).decode(), set()).add(node)
    assert len(tags) == 24 and all(len(nodes) == 1 for nodes in tags.values())
    assert sum(map(len, by_node.values())) == 24 * 3


def test_the_lookup_scripts_undeclared_keys_run_in_their_slot_and_nowhere_else(cluster):
    """What the lookup script relies on (zccp.cache.store.LOOKUP_SCRIPT): Redis Cluster runs a
    script's reads of keys it did not declare when they share the declared key's hash tag;
    a key that lives on another node is refused. Should a Redis version refuse the first,
    this test names the cause."""
    rc = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port, socket_timeout=5)
    try:
        read = "return redis.call('GET', ARGV[1])"
        rc.set("t:{one}:declared", "d")
        rc.set("t:{one}:undeclared", "u")
        assert rc.eval(read, 1, "t:{one}:declared", "t:{one}:undeclared") == b"u"
        here = rc.get_node_from_key("t:{one}:declared").name
        elsewhere = next(k for k in (f"t:{{{i}}}:x" for i in range(1000)) if rc.get_node_from_key(k).name != here)
        rc.set(elsewhere, "e")
        with pytest.raises(redis.ResponseError, match="non local key"):
            rc.eval(read, 1, "t:{one}:declared", elsewhere)
    finally:
        rc.close()


def test_a_hung_master_is_served_uncached_and_the_cache_comes_back(shared, cluster):
    a, b = shared
    stored(a, "anthropic", req("anthropic", CHAT))
    (name,) = [n for n, keys in zccp_keys(cluster).items() if keys]
    node = next(n for n in cluster.nodes if n.name == name)
    errors = metric(a, "zccp_engine_cache_total", result="ERROR", reason="redis")
    node.pause()
    try:
        for s, who in ((a, "a"), (b, "b")):
            r = post(s, "anthropic", req("anthropic", CHAT))
            assert r.headers["x-zccp-cache"] == "ERROR" and text_of("anthropic", r) == f"answered by host {who}"
        assert metric(a, "zccp_engine_cache_total", result="ERROR", reason="redis") > errors
    finally:
        node.resume()
    cluster.wait_ok()
    # the entry is still there once the node answers again: the hosts find it by themselves
    for s in (a, b):
        wait_for("a HIT after the node came back",
                 lambda s=s: cache_of(s, "anthropic", req("anthropic", CHAT)) == "HIT",
                 timeout=30, every=0.3)
        s.assert_no_leaks()


def test_purge_through_one_host_empties_the_cache_for_both(shared, cluster):
    a, b = shared
    for i in range(24):
        stored(a if i % 2 else b, "anthropic", req("anthropic", history(i)))
    masked = req("anthropic", [{"role": "user", "content": "Status of order #123456789?"}])
    stored(a, "anthropic", masked, x_api_key="tenant-x")
    before = zccp_keys(cluster)
    assert all(before.values())
    # one tenant, through host a's endpoint: only its keys go, on whichever master they are
    r = a.admin_client().post("/v1/zccp/purge", json={"tenant": "tenant-x"})
    assert r.status_code == 200 and r.json()["purged"] >= 1
    assert cache_of(b, "anthropic", masked, x_api_key="tenant-x") == "MISS"
    assert cache_of(b, "anthropic", req("anthropic", history(3))) == "HIT"
    # everything, through host b's endpoint: every master is scanned
    total = sum(map(len, zccp_keys(cluster).values()))
    r = b.admin_client().post("/v1/zccp/purge", json={"all": True})
    assert r.status_code == 200 and r.json()["purged"] == total
    assert not any(zccp_keys(cluster).values())
    for i, s in enumerate((a, b)):       # two conversations: a MISS stores its own answer again
        assert cache_of(s, "anthropic", req("anthropic", history(5 + i))) == "MISS"
    # the CLI, straight to the cluster from host a's config.yaml
    for i in range(6):
        stored(a, "anthropic", req("anthropic", history(100 + i)))
    total = sum(map(len, zccp_keys(cluster).values()))
    out = subprocess.run([sys.executable, "-m", "zccp.ops.cli", "cache", "purge", "--all", "--config",
                          str(a.config_path)], capture_output=True, text=True, timeout=60, env=ENGINE_ENV)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["purged", str(total), "keys"]
    assert not any(zccp_keys(cluster).values())
    assert cache_of(b, "anthropic", req("anthropic", history(100))) == "MISS"


# ------------------------------------------------------------------------------------- Redis Sentinel

@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[LocalSentinel]:
    s = LocalSentinel(tmp_path / "redis-sentinel")
    try:
        yield s.start()
    finally:
        s.stop()


def count_keys(node: Node) -> int:
    with node.client() as c:
        return sum(1 for _ in c.scan_iter(match="zccp:*", count=1000))


def test_the_cache_through_sentinel_survives_a_hung_master_and_a_failover(sentinel, tmp_path):
    s = host(tmp_path, "a", sentinel.url()).start()
    try:
        stored(s, "anthropic", req("anthropic", CHAT))
        assert cache_of(s, "anthropic", req("anthropic", REWORDED)) == "NEAR"
        assert count_keys(sentinel.master) == 3     # entry, near record, near index
        # a master that answers nothing: served uncached, then the cache comes back
        sentinel.master.pause()
        try:
            r = post(s, "anthropic", req("anthropic", CHAT))
            assert r.headers["x-zccp-cache"] == "ERROR" and r.json()["type"] == "message"
        finally:
            sentinel.master.resume()
        wait_for("a HIT after the master came back", lambda: cache_of(s, "anthropic", req("anthropic", CHAT)) == "HIT",
                 timeout=30, every=0.3)
        # SENTINEL FAILOVER: the replica is promoted; the engine follows it by itself
        new = sentinel.failover()
        assert new is sentinel.replica
        wait_for("a HIT after the failover", lambda: cache_of(s, "anthropic", req("anthropic", CHAT)) == "HIT",
                 timeout=30, every=0.3)
        # writes go to the new master (the old one is its read-only replica now)
        before = count_keys(new)
        body = req("anthropic", reworded("Which mountains can be seen from that city on a clear day?"))
        wait_for("a new answer stored after the failover", lambda: cache_of(s, "anthropic", body) == "HIT",
                 timeout=30, every=0.3)
        assert count_keys(new) == before + 3
        assert sentinel.master.call("ROLE")[0] == b"slave"
        s.assert_no_leaks()
    finally:
        s.stop()
