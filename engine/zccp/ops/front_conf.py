"""The front tier's config (a `front:` section in its own small file) and its nginx.conf
(nginx/front.conf): one nginx in front of several ZCCP hosts, routing by the route key
(docs/scale-out.md, "The front tier")."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from zccp.config import ConfigError, _build_section, bounded
from zccp.ops.nginx_conf import _fill, _safe, lua_path, nameservers
from zccp.config.paths import make_dirs, nginx_template
from zccp.config.runtime import default_worker_user

RESOLV_CONF = Path("/etc/resolv.conf")


@dataclass(frozen=True)
class FrontConfig:
    # The DNS name whose A records are the hosts, fully qualified (no search domains): in
    # Kubernetes a headless Service, e.g. zccp-hosts.zccp.svc.cluster.local.
    hosts: str
    port: int = bounded(8080, 1, 65535)            # every host's server.listen port
    listen: str = "0.0.0.0:8080"                   # the front's own listen address
    # "ip" or "ip:port" of the DNS server; None: the first IPv4 nameserver of /etc/resolv.conf.
    resolver: str | None = None
    resolve_interval_s: float = bounded(5.0, 0.2, 3600)   # CoreDNS answers with a 5 s TTL
    resolve_timeout_ms: int = bounded(2000, 10, 30_000)
    workers: int = bounded(2, 1, 64)
    max_body_kb: int = bounded(512, 1, 1 << 20)    # the hosts' limits.max_body_kb
    connect_timeout_ms: int = bounded(1000, 1, 60_000)
    # Longest silence from a host: a stream's next event, or a long answer's first byte.
    read_timeout_ms: int = bounded(600_000, 100, 3_600_000)
    # Hosts one request may try (connect errors; 502/503/504 before the answer starts).
    tries: int = bounded(3, 1, 16)
    # A host whose connection failed (refused, reset, timed out) is skipped this long by
    # every worker (unless all are).
    down_s: float = bounded(10.0, 0, 3600)
    keepalive: int = bounded(64, 1, 4096)          # idle connections to the hosts, per worker
    user: str | None = None                        # workers' user when started as root


def parse_front(raw: Any, path: str = "<string>") -> FrontConfig:
    if not isinstance(raw, dict) or set(raw) != {"front"}:
        raise ConfigError(f"{path}: expected exactly one section, `front:`")
    cfg: FrontConfig = _build_section(path, "front", FrontConfig, raw["front"])
    if cfg.hosts.endswith(".") or not all(part and len(part) <= 63 for part in cfg.hosts.split(".")):
        raise ConfigError(f"{path}: front.hosts: {cfg.hosts!r} is not a DNS name (write it without a final dot)")
    resolver_address(cfg, path)
    return cfg


def load_front(path: str | Path) -> FrontConfig:
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from exc
    return parse_front(raw, str(p))


def resolver_address(cfg: FrontConfig, path: str = "<front>", resolv_conf: Path = RESOLV_CONF) -> tuple[str, int]:
    """(IPv4 address, port) of the DNS server the front asks."""
    spec = cfg.resolver
    if spec is None:
        for addr in nameservers(resolv_conf):
            if _is_ipv4(addr):
                return addr, 53
        raise ConfigError(f"{path}: front.resolver unset and {resolv_conf} names no IPv4 nameserver")
    host, _, port = spec.partition(":")
    if not _is_ipv4(host) or (port and not (port.isdigit() and 1 <= int(port) <= 65535)):
        raise ConfigError(f"{path}: front.resolver: {spec!r} is not an IPv4 address[:port]")
    return host, int(port) if port else 53


def _is_ipv4(s: str) -> bool:
    try:
        ipaddress.IPv4Address(s)
        return True
    except ValueError:
        return False


def render_front(cfg: FrontConfig, out: Path, log_dir: Path | None = None) -> Path:
    """nginx.conf for the front into `out` (also its prefix: pid, temp files; logs in
    log_dir, default <out>/logs). Returns its path."""
    out = out.resolve()
    logs = (log_dir or out / "logs").resolve()
    for d in (out, logs, *(out / "tmp" / s for s in ("body", "proxy", "fastcgi", "uwsgi", "scgi"))):
        make_dirs(d)
    resolver, resolver_port = resolver_address(cfg)
    user = cfg.user or (default_worker_user("front.user") if os.geteuid() == 0 else None)
    values = {
        "user_line": f"user {_safe(user, 'front.user')};" if user else "",
        "workers": str(cfg.workers),
        "prefix": _safe(str(out), "front out directory"),
        "log_dir": _safe(str(logs), "front log directory"),
        "temp_dir": _safe(str(out / "tmp"), "front temp directory"),
        "error_log_level": "warn",
        "lua_package_path": lua_path(),
        "hosts_name": _safe(cfg.hosts, "front.hosts"),
        "hosts_port": str(cfg.port),
        "resolver": resolver,
        "resolver_port": str(resolver_port),
        "resolve_interval_s": repr(cfg.resolve_interval_s),
        "resolve_timeout_ms": str(cfg.resolve_timeout_ms),
        "tries": str(cfg.tries),
        "down_s": repr(cfg.down_s),
        "max_body": str(cfg.max_body_kb * 1024),
        "keepalive": str(cfg.keepalive),
        "listen": _safe(cfg.listen, "front.listen"),
        "connect_timeout_ms": str(cfg.connect_timeout_ms),
        "read_timeout_ms": str(cfg.read_timeout_ms),
    }
    conf = out / "nginx.conf"
    conf.write_text(_fill(nginx_template("front.conf").read_text(), values, "front.conf"))
    return conf
