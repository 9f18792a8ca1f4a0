"""`cache.redis_url`: which Redis the cache uses (one server, a Redis Cluster, or the master
a Redis Sentinel names) and a redis-py client for it (docs/cache.md, "Redis topologies").

    redis://[[user]:password@]host[:port][/db]        one server (redis-py's own URL: also
    rediss://...  unix:///path/redis.sock?db=0        rediss:// for TLS, unix:// sockets)
    redis+cluster://[[user]:password@]host[:port][,host[:port]...][/0]
                                                      a Redis Cluster: any of its nodes (the
                                                      client finds the rest); port 6379
    redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/<service>[/db]
                    [?sentinel_username=U&sentinel_password=P]
                                                      the master the Sentinels name <service>
                                                      (port 26379); the user and password are
                                                      the data nodes', the query's the Sentinels'
    rediss+cluster://, rediss+sentinel://             the same over TLS (the system CAs verify)

The same forms as the `redis+sentinel` convention other redis-py users follow (Prefect,
RedisVL); redis-py itself has a client for each topology but a URL only for one server.
parse_redis_url() checks a URL without connecting (config load); connect() makes the client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal
from urllib.parse import parse_qs, unquote, urlsplit

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

    RedisClient = Redis | RedisCluster

Topology = Literal["single", "cluster", "sentinel"]
_DEFAULT_PORT = {"cluster": 6379, "sentinel": 26379}
_SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")
_SCHEMES = "redis, rediss, unix, redis+cluster, rediss+cluster, redis+sentinel, rediss+sentinel"


@dataclass(frozen=True)
class RedisTarget:
    topology: Topology
    url: str = field(repr=False)                   # as configured (single: redis-py parses it)
    nodes: tuple[tuple[str, int], ...] = ()        # cluster: startup nodes; sentinel: the Sentinels
    service: str = ""                              # sentinel: the master's name
    db: int = 0
    tls: bool = False
    username: str | None = None                    # the data nodes' credentials (cluster, sentinel)
    password: str | None = field(default=None, repr=False)
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)

    def describe(self) -> str:
        """Where it points, without credentials (for logs and error messages)."""
        if self.topology == "single":
            u = urlsplit(self.url)
            host = u.hostname or ""
            netloc = f"[{host}]" if ":" in host else host
            return f"{u.scheme}://{netloc}{':' + str(u.port) if u.port else ''}{u.path}"
        nodes = ",".join(_host_port(h, p) for h, p in self.nodes)
        s = "s" if self.tls else ""
        if self.topology == "cluster":
            return f"redis{s}+cluster://{nodes}"
        return f"redis{s}+sentinel://{nodes}/{self.service}/{self.db}"


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _parse_nodes(netloc: str, default_port: int) -> tuple[tuple[str, int], ...]:
    nodes = []
    for item in netloc.split(","):
        if item.startswith("["):                   # [IPv6]:port
            host, _, rest = item[1:].partition("]")
            if rest and not rest.startswith(":"):
                raise ValueError(f"{item!r} is not host:port")
            port_s = rest[1:]
        else:
            host, _, port_s = item.rpartition(":") if ":" in item else (item, "", "")
        if not host:
            raise ValueError(f"{item!r}: a host is missing (hosts are separated by ',')")
        if port_s == "":
            port = default_port
        elif port_s.isdigit() and 1 <= int(port_s) <= 65535:
            port = int(port_s)
        else:
            raise ValueError(f"{item!r}: the port is not a number in 1..65535")
        nodes.append((unquote(host), port))
    return tuple(nodes)


def _parse_db(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"database {text!r} is not a number")
    return int(text)


def _parse_single(url: str) -> RedisTarget:
    u = urlsplit(url)
    scheme = u.scheme.lower()
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"unknown scheme {u.scheme!r} ({_SCHEMES})")
    if "," in u.netloc:
        raise ValueError("several hosts in a redis:// URL: use redis+cluster:// (a Redis Cluster) "
                         "or redis+sentinel:// (Sentinels)")
    db = 0
    if scheme == "unix":
        if not u.path:
            raise ValueError("unix:// needs a socket path, e.g. unix:///run/redis/redis.sock?db=0")
    else:
        try:
            u.port
        except ValueError:
            raise ValueError("the port is not a number in 1..65535") from None
        if not u.hostname:
            raise ValueError("the host is missing")
        if u.path.strip("/"):
            db = _parse_db(u.path.strip("/"))
    if u.query:   # redis-py's own options (?db=, ?ssl_cert_reqs=, ...): its parser checks their values
        from redis.asyncio.connection import parse_url

        db = int(parse_url(url).get("db", db) or 0)
    return RedisTarget("single", url, db=db, tls=scheme == "rediss")


def parse_redis_url(url: str) -> RedisTarget:
    """The target a URL names; ValueError says what is wrong (never echoing a password)."""
    if "#" in url:
        raise ValueError("'#' in the URL (percent-encode it as %23 in a password)")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError("expected a URL such as redis://host:6379/0 (docs/cache.md, \"Redis topologies\")")
    base, plus, topology = scheme.lower().partition("+")
    if not plus:
        return _parse_single(url)
    if base not in ("redis", "rediss") or topology not in ("cluster", "sentinel"):
        raise ValueError(f"unknown scheme {scheme!r} ({_SCHEMES})")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not hosts:
        raise ValueError(f"{scheme}:// needs at least one host:port")
    nodes = _parse_nodes(hosts, _DEFAULT_PORT[topology])
    username = password = None
    if at:
        user, colon, pw = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if colon and pw else None
    options = parse_qs(query, keep_blank_values=True)
    allowed = _SENTINEL_OPTIONS if topology == "sentinel" else ()
    for name in options:
        if name not in allowed:
            known = f" (known: {', '.join(allowed)})" if allowed else ""
            raise ValueError(f"unknown option {name!r} for {scheme}://{known}")
    parts = path.split("/") if path else []
    db, service = 0, ""
    if topology == "cluster":
        if len(parts) > 1 or (parts and parts[0] not in ("", "0")):
            raise ValueError("a Redis Cluster has only database 0 (write /0 or nothing after the hosts)")
    else:
        if not parts or not parts[0]:
            raise ValueError(f"{scheme}:// needs the master's name: {scheme}://host:26379/<name>/<db>")
        if len(parts) > 2:
            raise ValueError(f"{scheme}:// path: expected /<name>/<db>, got /{path}")
        service = unquote(parts[0])
        if len(parts) == 2 and parts[1]:
            db = _parse_db(parts[1])
    return RedisTarget(topology, url, nodes, service, db, base == "rediss", username, password,
                       *(unquote(options[k][0]) if k in options else None for k in _SENTINEL_OPTIONS))


@dataclass
class RedisConnection:
    """The client the cache uses, and what else has to be closed with it (the Sentinels)."""

    target: RedisTarget
    client: RedisClient
    _also: list[Redis] = field(default_factory=list)

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
    sock = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s, "health_check_interval": 0,
            "retry": Retry(NoBackoff(), 0)}
    if target.topology == "single":
        return RedisConnection(target, Redis.from_url(target.url, **sock))
    auth = {"username": target.username, "password": target.password, "ssl": target.tls}
    if target.topology == "cluster":
        nodes = [ClusterNode(h, p) for h, p in target.nodes]
        return RedisConnection(target, RedisCluster(startup_nodes=nodes, **auth, **sock))
    sentinel = Sentinel(target.nodes, sentinel_kwargs={
        "username": target.sentinel_username, "password": target.sentinel_password, "ssl": target.tls, **sock})
    client = sentinel.master_for(target.service, db=target.db, **auth, **sock)
    return RedisConnection(target, client, list(sentinel.sentinels))
