"""`cache.redis_url`: which Redis the cache uses (one server, a Redis Cluster, or the master
a Redis Sentinel names), parsed and checked without connecting (docs/cache.md, "Redis
topologies"). Config loading checks the URL here; zccp.cache.redis_target makes the client.

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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import parse_qs, unquote, urlsplit

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
            _ = u.port          # urlsplit checks the port only when asked
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
    topo: Topology = "cluster" if topology == "cluster" else "sentinel"
    return RedisTarget(topo, url, nodes, service, db, base == "rediss", username, password,
                       *(unquote(options[k][0]) if k in options else None for k in _SENTINEL_OPTIONS))
