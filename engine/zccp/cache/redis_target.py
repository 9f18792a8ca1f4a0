"""A redis-py client for `cache.redis_url` (one server, a Redis Cluster, or the master a
Redis Sentinel names); the URL itself is parsed by zccp.config.redis_url (docs/cache.md, "Redis
topologies").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zccp.config.redis_url import RedisTarget, parse_redis_url

# redis-py's asyncio Redis or RedisCluster. Any to the type checker: types-redis's stubs
# shadow redis-py's own (py.typed) and predate its async API (aclose, the cluster's
# commands), so they would refuse calls that work.
RedisClient = Any

__all__ = ["RedisConnection", "RedisTarget", "connect", "parse_redis_url"]


@dataclass
class RedisConnection:
    """The client the cache uses, and what else has to be closed with it (the Sentinels)."""

    target: RedisTarget
    client: RedisClient
    _also: list[Any] = field(default_factory=list)      # the Sentinels' clients

    async def aclose(self) -> None:
        await self.client.aclose()
        for c in self._also:
            await c.aclose()


def connect(target: RedisTarget, timeout_s: float) -> RedisConnection:
    """A client for the target (no connection is opened until the first command). Every
    socket operation, the Sentinels' included, gives up after timeout_s, and a failed
    command is not retried inside the client: the caller decides when to try again (the
    cache waits a second) and the cluster client re-reads the slot map on its next command."""
    # redis-py is imported when a client is made, not when a config file is checked
    from redis.asyncio import Redis
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.asyncio.retry import Retry
    from redis.asyncio.sentinel import Sentinel
    from redis.backoff import NoBackoff

    # one attempt per command: redis-py's clients otherwise retry with backoff (seconds)
    sock: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s,
                            "health_check_interval": 0, "retry": Retry(NoBackoff(), 0)}
    if target.topology == "single":
        return RedisConnection(target, Redis.from_url(target.url, **sock))
    auth: dict[str, Any] = {"username": target.username, "password": target.password, "ssl": target.tls}
    if target.topology == "cluster":
        nodes = [ClusterNode(h, p) for h, p in target.nodes]
        return RedisConnection(target, RedisCluster(startup_nodes=nodes, **auth, **sock))
    sentinel = Sentinel(target.nodes, sentinel_kwargs={
        "username": target.sentinel_username, "password": target.sentinel_password, "ssl": target.tls, **sock})
    client = sentinel.master_for(target.service, db=target.db, **auth, **sock)
    return RedisConnection(target, client, list(sentinel.sentinels))
