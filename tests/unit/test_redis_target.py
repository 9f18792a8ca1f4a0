"""cache.redis_url: the three topologies' URL forms, what a bad one is told at config load,
and the redis-py client each one makes (nothing connects here: the integration tests in
test_scale_out.py and test_cache.py run them against real servers)."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import SentinelConnectionPool

from zccp.cache.redis_target import connect, parse_redis_url
from zccp.config import ConfigError, parse_config


@pytest.mark.parametrize("url,topology,nodes,service,db,tls", [
    ("redis://127.0.0.1:6379/0", "single", (), "", 0, False),
    ("rediss://user:pw@cache.example:6380/3", "single", (), "", 3, True),
    ("unix:///run/redis/redis.sock?db=2", "single", (), "", 2, False),
    ("redis+cluster://10.0.0.1:7000,10.0.0.2:7001", "cluster", (("10.0.0.1", 7000), ("10.0.0.2", 7001)), "", 0, False),
    ("rediss+cluster://:secret@redis-0.redis,[fd00::1]:7000/0", "cluster",
     (("redis-0.redis", 6379), ("fd00::1", 7000)), "", 0, True),
    ("redis+sentinel://s1,s2:26380/mymaster/2?sentinel_password=x", "sentinel",
     (("s1", 26379), ("s2", 26380)), "mymaster", 2, False),
    ("redis+sentinel://127.0.0.1:26379/zccp-main", "sentinel", (("127.0.0.1", 26379),), "zccp-main", 0, False),
])
def test_url_forms(url, topology, nodes, service, db, tls):
    t = parse_redis_url(url)
    assert (t.topology, t.nodes, t.service, t.db, t.tls) == (topology, nodes, service, db, tls)


def test_credentials_are_split_and_never_described():
    t = parse_redis_url("redis+sentinel://app:p%40ss@s1:26379/main/1?sentinel_username=mon&sentinel_password=s3")
    assert (t.username, t.password, t.sentinel_username, t.sentinel_password) == ("app", "p@ss", "mon", "s3")
    assert t.describe() == "redis+sentinel://s1:26379/main/1"
    assert "p%40ss" not in repr(t) and "p@ss" not in repr(t) and "s3" not in repr(t)
    assert parse_redis_url("redis://:hunter2@h:6379/0").describe() == "redis://h:6379/0"
    assert parse_redis_url("redis+cluster://u:hunter2@h1,h2:7000").describe() == "redis+cluster://h1:6379,h2:7000"


@pytest.mark.parametrize("url,needle", [
    ("localhost:6379", "expected a URL such as redis://host:6379/0"),
    ("http://h:6379", "unknown scheme 'http'"),
    ("redis+cluser://h:7000", "unknown scheme 'redis+cluser'"),
    ("redis://h1:7000,h2:7001/0", "use redis+cluster://"),
    ("redis://h:99999/0", "the port is not a number"),
    ("redis://h/zero", "database 'zero' is not a number"),
    ("redis:///0", "the host is missing"),
    ("redis://h/0?db=x", "Invalid value for 'db'"),
    ("redis://:p#w@h/0", "percent-encode it as %23"),
    ("redis+cluster://h:7000/1", "only database 0"),
    ("redis+cluster://h:7000,,h2", "a host is missing"),
    ("redis+cluster://h:x", "'h:x': the port is not a number"),
    ("redis+cluster://h:7000?read_from_replicas=1", "unknown option 'read_from_replicas'"),
    ("redis+sentinel://s1:26379", "needs the master's name"),
    ("redis+sentinel://s1:26379/m/0/1", "expected /<name>/<db>"),
    ("redis+sentinel://s1:26379/m/x", "database 'x' is not a number"),
    ("redis+sentinel://s1:26379/m?password=x", "unknown option 'password'"),
])
def test_bad_urls_are_refused_at_config_load_by_name(url, needle):
    with pytest.raises(ConfigError) as exc:
        parse_config({"cache": {"redis_url": url}}, "my.yaml")
    assert str(exc.value).startswith("my.yaml: cache.redis_url: ") and needle in str(exc.value)
    assert "hunter2" not in str(exc.value)


def test_each_topology_gets_redis_pys_own_client_with_the_cache_timeout():
    async def made():
        single = connect(parse_redis_url("redis://127.0.0.1:6379/4"), 0.25)
        cluster = connect(parse_redis_url("redis+cluster://u:pw@10.0.0.1:7000,10.0.0.2"), 0.25)
        sentinel = connect(parse_redis_url("redis+sentinel://s1,s2:26380/main/3?sentinel_password=sp"), 0.25)
        try:
            assert type(single.client) is Redis
            kw = single.client.connection_pool.connection_kwargs
            assert (kw["db"], kw["socket_timeout"], kw["retry"].get_retries()) == (4, 0.25, 0)

            assert isinstance(cluster.client, RedisCluster)
            startup = list(cluster.client.nodes_manager.startup_nodes.values())
            assert [(n.host, n.port) for n in startup] == [("10.0.0.1", 7000), ("10.0.0.2", 6379)]
            node_kw = startup[0].connection_kwargs
            assert (node_kw["username"], node_kw["password"], node_kw["socket_timeout"]) == ("u", "pw", 0.25)
            assert cluster.client.retry.get_retries() == 0      # the cache retries, after a second

            pool = sentinel.client.connection_pool
            assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "main"
            kw = pool.connection_kwargs
            assert (kw["db"], kw["socket_timeout"], kw["retry"].get_retries()) == (3, 0.25, 0)
            sentinels = [s.connection_pool.connection_kwargs for s in pool.sentinel_manager.sentinels]
            assert [(k["port"], k["password"], k["socket_timeout"], k["retry"].get_retries()) for k in sentinels] == \
                [(26379, "sp", 0.25, 0), (26380, "sp", 0.25, 0)]
        finally:
            for c in (single, cluster, sentinel):
                await c.aclose()

    asyncio.run(made())
