"""Renders the nginx templates in nginx/ from config.yaml (nginx's share of the one file)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from zccp.transport.abi import HEADER_PATH
from zccp.cache.redis_target import parse_redis_url
from zccp.config import Config, auth_redis_url, check_tls_files, mask_state_path, model_names
from zccp.ops.admin_client import admin_socket_dir
from zccp.config.plugins import lua_settings
from zccp.config.own_dirs import check_stack_dirs, own_dir, stack_dirs
from zccp.config.paths import lua_dir, lua_file, lua_package_path, lua_vendor_dir, make_dirs, nginx_template
from zccp.config.runtime import worker_user
from zccp.shared_types import MAX_CHOICES

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
_LEVELS = {"debug": "info", "info": "warn", "warning": "warn", "error": "error"}
# Rendered into double-quoted nginx/Lua strings: anything that could break out is refused.
_UNSAFE = set('"\\\n\r;{}$\'')


@dataclass(frozen=True)
class RenderedNginx:
    out: Path
    http_conf: Path
    server_conf: Path
    admin_conf: Path                 # the admin surface's server {} include (server.admin_listen)
    nginx_conf: Path | None
    prefix: Path | None


def _fill(template: str, values: dict[str, str], name: str) -> str:
    def sub(m: re.Match[str]) -> str:
        key = m.group(1)
        if key not in values:
            raise KeyError(f"{name}: no value for {{{{{key}}}}}")
        return values[key]

    return _PLACEHOLDER.sub(sub, template)


def _safe(value: str, what: str) -> str:
    if _UNSAFE & set(value):
        raise ValueError(f"{what}: {value!r} contains characters not allowed here")
    return value


def lua_path() -> str:
    """lua_package_path's value (zccp.config.paths), its directories checked: `;` separates its
    entries, so it may not be in them."""
    _safe(str(lua_dir()), "lua dir")
    _safe(str(lua_vendor_dir()), "lua vendor dir")
    return lua_package_path()


def _lua_str(value: str, what: str) -> str:
    return '"' + _safe(value, what) + '"'


# nginx's Redis passwords (auth.redis_url), owner-only beside the rendered config
PASSWORD_FILE = "zccp_redis_password"
SENTINEL_PASSWORD_FILE = "zccp_redis_sentinel_password"


def _secret_file(out: Path, name: str, secret: str | None) -> str | None:
    """`secret` written owner-only to out/name (removed when None); the Lua expression that
    reads it in nginx's master at init (zccp.lib.redis.read_secret), or None. The rendered
    config, which every local user may read, names the file, never the secret."""
    path = out / name
    if not secret:
        path.unlink(missing_ok=True)
        return None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)   # an older file of another mode: owner-only whatever the umask
        os.write(fd, secret.encode())
    finally:
        os.close(fd)
    return f'require("zccp.lib.redis").read_secret({_lua_str(str(path), name)})'


def _auth_settings(cfg: Config, out: Path) -> str:
    """auth = {...} for init_by_lua (zccp.plugins.auth.keys, zccp.lib.redis): where the keys live. The Redis
    passwords go to owner-only files in `out` (read by nginx's master at init)."""
    a = cfg.auth
    if not a.on:
        for name in (PASSWORD_FILE, SENTINEL_PASSWORD_FILE):
            _secret_file(out, name, None)
        return '{ mode = "off" }'
    from urllib.parse import unquote, urlsplit

    t = parse_redis_url(auth_redis_url(cfg))
    parts = [f"timeout_ms = {a.timeout_ms}", f"db = {t.db}"]
    if t.topology == "cluster":
        host, port = t.nodes[0]
        parts += [f"host = {_lua_str(host, 'auth redis host')}", f"port = {port}", "cluster = true"]
        user, password = t.username, t.password
    elif t.topology == "sentinel":   # zccp.lib.redis asks them for the master (lua-resty-redis-connector)
        nodes = ", ".join(f"{{ host = {_lua_str(h, 'auth redis sentinel host')}, port = {p} }}" for h, p in t.nodes)
        parts += [f"sentinels = {{ {nodes} }}", f"master_name = {_lua_str(t.service, 'auth redis master name')}"]
        user, password = t.username, t.password
    else:
        u = urlsplit(t.url)
        if u.scheme == "unix":
            parts.append(f"path = {_lua_str(u.path, 'auth redis socket')}")
        else:
            parts += [f"host = {_lua_str(u.hostname or '127.0.0.1', 'auth redis host')}", f"port = {u.port or 6379}"]
        user = unquote(u.username) if u.username else None
        password = unquote(u.password) if u.password else None
    sentinel = _secret_file(out, SENTINEL_PASSWORD_FILE, t.sentinel_password if t.topology == "sentinel" else None)
    if sentinel:
        parts.append(f"sentinel_password = {sentinel}")
    secret = _secret_file(out, PASSWORD_FILE, password)
    if secret:
        parts.append(f"password = {secret}")
        if user:
            parts.append(f"username = {_lua_str(user, 'auth redis user')}")
    usage = _lua_str(a.usage_log, "auth.usage_log") if a.usage_log else '""'
    keys_file = _lua_str(a.keys_file, "auth.keys_file") if a.keys_file else '""'
    return (f'{{ mode = "keys", cache_ttl_s = {a.cache_ttl_s}, negative_ttl_s = {a.negative_ttl_s}, '
            f'usage_log = {usage}, keys_file = {keys_file}, redis = {{ {", ".join(parts)} }} }}')


def _redis_host(cfg: Config) -> str | None:
    """The host name nginx's Redis client must resolve (auth on, a TCP URL naming a host, not an
    address), else None."""
    from urllib.parse import urlsplit

    if not cfg.auth.on:
        return None
    t = parse_redis_url(auth_redis_url(cfg))
    if t.topology == "cluster":
        host = t.nodes[0][0]
    elif t.topology == "sentinel":
        host = next((h for h, _ in t.nodes if not _is_address(h)), t.nodes[0][0])
    else:
        u = urlsplit(t.url)
        if u.scheme == "unix":
            return None
        host = u.hostname or "127.0.0.1"
    return None if _is_address(host) else host


def _is_address(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def nameservers(resolv_conf: Path = Path("/etc/resolv.conf")) -> list[str]:
    """resolv.conf's nameserver addresses, in order (zone ids dropped); [] if unreadable.
    nginx's resolver here, and the front tier's DNS client (ops/front_conf.py)."""
    out = []
    try:
        for line in resolv_conf.read_text(encoding="utf-8", errors="replace").splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "nameserver":
                out.append(parts[1].split("%")[0])
    except OSError:
        pass
    return out


def resolver_line(cfg: Config, resolv_conf: Path = Path("/etc/resolv.conf")) -> str:
    """nginx's `resolver` when auth.redis_url names a host: a Lua cosocket resolves names only
    through it (the system's resolver is not used). The name servers are this machine's
    (/etc/resolv.conf at render time: Docker's 127.0.0.11 in a compose container); answers
    are kept 10 s, so a Redis that comes back at another address is found again."""
    host = _redis_host(cfg)
    if host is None:
        return "# (no resolver: nginx's Redis address is not a host name)"
    servers = [f"[{addr}]" if ":" in addr else addr for addr in nameservers(resolv_conf)]
    if not servers:
        raise ValueError(f"auth.redis_url names the host {host!r}, but {resolv_conf} lists no nameserver "
                         f"for nginx's resolver: give Redis's address instead")
    return (f"resolver {' '.join(_safe(s, 'nameserver') for s in servers)} valid=10s ipv6=off;"
            f"   # auth.redis_url names {_safe(host, 'auth redis host')}")


def _admin_digest_file(cfg: Config, out: Path) -> str:
    """The file nginx reads the admin token's SHA-256 (hex) from at init ("" when there is no
    server.admin_token_file): written owner-only (nginx's master reads it as root), so no
    rendered config, which every local user may read, holds the secret or its digest."""
    import hashlib

    from zccp.ops.admin_client import read_admin_token

    digest_file = out / "zccp_admin_token.sha256"
    path = cfg.server.admin_token_file
    if path is None:
        digest_file.unlink(missing_ok=True)
        return ""
    digest = hashlib.sha256(read_admin_token(path).encode()).hexdigest()
    fd = os.open(digest_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, digest.encode() + b"\n")
    finally:
        os.close(fd)
    return _safe(str(digest_file), "admin digest file")


def listen_flags(cfg: Config) -> str:
    """What follows the address on the standalone server's `listen` line (server.tls, http2,
    server.send_buffer_kb)."""
    sndbuf = f" sndbuf={cfg.server.send_buffer_kb}k" if cfg.server.send_buffer_kb else ""
    if cfg.server.tls is None:
        return sndbuf
    return (" ssl http2" if cfg.server.speaks_http2 else " ssl") + sndbuf


def tls_lines(cfg: Config, indent: str = "        ") -> str:
    """The standalone server's TLS directives (none without server.tls); the files are
    checked first (config.check_tls_files), so nginx -t never meets a missing one."""
    tls = cfg.server.tls
    if tls is None:
        return ""
    check_tls_files(cfg)
    lines = [
        f'ssl_certificate "{_safe(tls.certificate, "server.tls.certificate")}";',
        f'ssl_certificate_key "{_safe(tls.key, "server.tls.key")}";',
        "ssl_protocols TLSv1.2 TLSv1.3;",
        "ssl_session_cache shared:zccp_tls:10m;   # resumed handshakes skip the key exchange",
        "ssl_session_timeout 1h;",
    ]
    return "\n".join(indent + ln for ln in lines)


_MODEL_ID = re.compile(r"[A-Za-z0-9._:-]+")


def _model_paths(cfg: Config) -> list[str]:
    return [f"/v1/models/{name}" for name in model_names(cfg) if _MODEL_ID.fullmatch(name)]


_MODELS_LOCATION = """location = /v1/models {
    lua_socket_log_errors off;
    error_page 400 429 500 502 503 504 @zccp_error_models;
    content_by_lua_block { require("zccp.handler").serve_models() }
    log_by_lua_block { require("zccp.handler").log(nil) }   # a request for the key's limits and usage
    header_filter_by_lua_block { require("zccp.handler").response() }
}"""


def models_locations(cfg: Config, standalone: bool = False) -> str:
    """`location = /v1/models` and `location = /v1/models/<name>` (GET one model) for each
    model served, or a comment for a name that is not a single path segment of letters,
    digits and ._:- (then only /v1/models lists it). None in the includes with
    server.paths.models false (the site keeps those paths)."""
    if not (standalone or cfg.server.paths.models):
        return "# (no /v1/models locations: server.paths.models is false, the server's own answer them)"
    out = [_MODELS_LOCATION]
    for name in model_names(cfg):
        if not _MODEL_ID.fullmatch(name):
            out.append(f"# (none: model name {name!r} is not a path segment of letters, digits and ._:-)")
            continue
        out.append(f"location = /v1/models/{name} {{\n"
                   "    lua_socket_log_errors off;\n"
                   "    error_page 400 429 500 502 503 504 @zccp_error_models;\n"
                   '    content_by_lua_block { require("zccp.handler").serve_models() }\n'
                   '    log_by_lua_block { require("zccp.handler").log(nil) }\n'
                   "}")
    return "\n\n".join(out)


API_PATHS = ("/v1/messages", "/v1/chat/completions", "/v1/completions", "/v1/responses",
             "/v1/messages/count_tokens")
# The server-level error_page's target for what nginx refuses before it picks a location
# (zccp_server.conf); a client's own request there is answered 404.
REQUEST_ERROR_PATH = "/zccp/request-error"


def health_path(cfg: Config, standalone: bool) -> str:
    """The public health check's path: server.paths.health, else /health on the standalone
    stack and /zccp/health in an existing server (whose own /health stays its own)."""
    return cfg.server.paths.health or ("/health" if standalone else "/zccp/health")


def server_paths(cfg: Config, standalone: bool = False) -> list[str]:
    """Every exact path zccp_server.conf adds to the server that includes it."""
    models = ["/v1/models", *_model_paths(cfg)] if standalone or cfg.server.paths.models else []
    return [*API_PATHS, *models, health_path(cfg, standalone), REQUEST_ERROR_PATH]


def engines_settings(cfg: Config, nodes: dict[str, int | None] | None = None) -> str:
    """engines = {...} for init_by_lua (zccp.lib.engines): each engine's name, model, arena,
    doorbell and planned NUMA node (`nodes`, zccp.process.placement.locality; routing prefers a
    worker's own node); "nil" without `engines:` (one engine: shm_name and socket_path)."""
    if not cfg.engines:
        return "nil"
    nodes = nodes or {}
    rows = []
    for e in cfg.engines:
        if e.socket_path is None:
            raise ValueError("engines: socket paths are not resolved (zccp.config.runtime.resolve)")  # programmer error
        rows.append(f'{{ name = {_lua_str(e.name, "engines.name")}, '
                    f'model = {_lua_str(e.model.name, f"engines.{e.name}.model.name")}, '
                    f'shm_name = {_lua_str(e.shared_memory.name, f"engines.{e.name}.shared_memory.name")}, '
                    f'socket_path = {_lua_str(e.socket_path, f"engines.{e.name} socket")}'
                    + (f", node = {node}" if (node := nodes.get(e.name)) is not None else "") + " }")
    return "{ " + ", ".join(rows) + " }"


def worker_nodes_settings(cfg: Config, standalone: bool) -> tuple[str, str]:
    """(engines, worker_nodes) for init_by_lua: the engines with their planned nodes, and each
    nginx worker's node (worker id + 1 -> node) where ZCCP places the workers (the standalone
    stack's worker_cpu_affinity; an existing nginx's workers are the site's: "nil")."""
    from zccp.process.placement import locality

    engine_nodes, workers = locality(cfg) if cfg.engines else ({}, [])
    known = [n for n in workers if n is not None]
    if not standalone or len(known) != len(workers) or not known:
        return engines_settings(cfg, engine_nodes), "nil"
    return engines_settings(cfg, engine_nodes), "{ " + ", ".join(str(n) for n in known) + " }"


def _affinity_line(cfg: Config) -> str:
    """The workers beside the engines they serve (zccp.process.placement), when an engine is placed."""
    from zccp.process.placement import nginx_affinity

    mask = nginx_affinity(cfg)
    return f"worker_cpu_affinity {mask};" if mask else ""


def render(cfg: Config, out: Path, standalone: bool = False, prefix: Path | None = None,
           log_dir: Path | None = None) -> RenderedNginx:
    """cfg must be resolved for its run directory (zccp.config.runtime.resolve). log_dir: where the
    standalone nginx.conf puts error and access logs (default <prefix>/logs)."""
    if cfg.server.socket_path is None:
        raise ValueError("server.socket_path is not resolved (zccp.config.runtime.resolve)")  # programmer error
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    # sockets, last-good copies, the usage log: made (0755: nginx's master writes the copies,
    # nobody else may) or found ours; plugins.dir ours too (zccp.config.own_dirs)
    check_stack_dirs(cfg)
    for d, what, private in stack_dirs(cfg):
        own_dir(d, what, private, cfg.shared_memory.group)
    values = {
        "lua_package_path": lua_path(),
        # the plugin chain; good operator plugins are copied beside the masks' last good set
        "plugins": lua_settings(cfg.plugins, Path(cfg.server.socket_path).parent / "plugins.last_good"),
        "abi_header": _safe(str(HEADER_PATH), "ABI header"),
        "shm_name": _safe(cfg.shared_memory.name, "shared_memory.name"),
        "socket_path": _safe(cfg.server.socket_path, "server.socket_path"),
        "connect_timeout_ms": str(cfg.server.connect_timeout_ms),
        "request_timeout_ms": str(cfg.limits.request_timeout_ms),
        "stream_stall_timeout_ms": str(cfg.limits.stream_stall_timeout_ms),
        "stream_max_duration_ms": str(cfg.limits.stream_max_duration_ms),
        "stream_max_bytes": str(cfg.limits.stream_max_bytes_kb * 1024),
        "max_body": str(cfg.limits.max_body_kb * 1024),
        "pool_size": str(cfg.server.doorbell_pool_size),
        "mask_last_good": _safe(str(mask_state_path(cfg)), "mask state path"),
        "mask_patterns": _safe(cfg.cache.mask_patterns or str(lua_file("mask_patterns.lua")), "cache.mask_patterns"),
        "tenant_source": cfg.cache.tenant_source,
        "tenant_header": cfg.cache.tenant_header or "",
        "dict": "zccp_slots",
        "dict_size": "1m",
        "l1_enabled": "true" if cfg.cache.enabled and cfg.cache.l1.enabled else "false",
        "l1_dict": "zccp_l1",
        "l1_dict_size": f"{cfg.cache.l1.size_mb}m" if cfg.cache.enabled and cfg.cache.l1.enabled else "64k",
        "l1_max_entries": str(cfg.cache.l1.max_entries),
        "l1_max_entry": str(cfg.cache.l1.max_entry_kb * 1024),
        "l1_ttl_s": str(cfg.cache.l1.ttl_s),
        "out": str(out),
        "auth": _auth_settings(cfg, out),
        "resolver": resolver_line(cfg),
        "default_max_tokens": str(cfg.limits.default_max_tokens),
        "max_tokens_cap": str(cfg.limits.max_tokens_cap),
        "max_choices": str(MAX_CHOICES),
        "admin_digest_file": _admin_digest_file(cfg, out),
        "models_locations": models_locations(cfg, standalone),
        "model_log_path": " ".join(f"{p} 1;" for p in _model_paths(cfg)) or "# (no /v1/models/{id} location)",
        "health_path": health_path(cfg, standalone),
        "metrics_path": cfg.server.paths.metrics,
        "engines": "",         # below, with the workers' nodes
        "routing_policy": cfg.routing.policy,
        "routing_spill_load": repr(cfg.routing.spill_load),
        "metrics_allow": " ".join(f"allow {a};" for a in cfg.server.metrics_allow.split()),
    }
    values["engines"], values["worker_nodes"] = worker_nodes_settings(cfg, standalone)
    admin_dir = admin_socket_dir(cfg)   # only its owner may enter it: nginx makes the socket 0666
    # nginx's master makes it again at init when it is ZCCP's (<socket dir>/admin): /run is
    # empty at boot, and nginx may run as another user than the renderer (containers)
    default_dir = Path(cfg.server.socket_path).parent / "admin"
    values["admin_socket_dir"] = _safe(str(admin_dir), "admin socket directory") if admin_dir == default_dir else ""
    listen = cfg.server.admin_listen or ""
    values["admin_socket"] = _safe(listen[5:], "server.admin_listen") if listen.startswith("unix:") else ""
    http_conf = out / "zccp_http.conf"
    server_conf = out / "zccp_server.conf"
    http_conf.write_text(_fill(nginx_template("zccp_http.conf").read_text(), values, "zccp_http.conf"))
    server_conf.write_text(_fill(nginx_template("zccp_server.conf").read_text(), values, "zccp_server.conf"))
    admin_conf = out / "zccp_admin.conf"
    admin_conf.write_text(_fill(nginx_template("zccp_admin.conf").read_text(), values, "zccp_admin.conf"))
    nginx_conf = None
    if standalone:
        prefix = (prefix or out).resolve()
        logs = (log_dir or prefix / "logs").resolve()
        logs.mkdir(parents=True, exist_ok=True)
        # Started as root, the workers (they parse untrusted input) drop to an unprivileged
        # user in the group the arena and the sockets are 0660 to. Their temp files (a
        # chunked body spills over the buffer) then go beside the socket, a directory they
        # can reach (zccp.config.runtime), not under a run directory they may not enter.
        user = worker_user(cfg)
        temp = Path(cfg.server.socket_path or "").parent / "nginx-tmp" if user else prefix / "tmp"
        for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            make_dirs(temp / sub)
        values.update(
            prefix=str(prefix),
            temp_dir=_safe(str(temp), "nginx temp directory"),
            log_dir=_safe(str(logs), "log directory"),
            workers=str(cfg.server.workers),
            worker_cpu_affinity=_affinity_line(cfg),
            listen=_safe(cfg.server.listen, "server.listen"),
            admin_listen=_safe(cfg.server.admin_listen or "", "server.admin_listen"),
            listen_flags=listen_flags(cfg),
            tls_lines=tls_lines(cfg),
            error_log_level=_LEVELS[cfg.logging.level],
            access_log_buffer=(f" buffer=64k flush={cfg.logging.access_flush_ms}ms"
                               if cfg.logging.access_flush_ms else ""),
            user_line=(f"user {_safe(user, 'server.user')} "
                       f"{_safe(cfg.shared_memory.group or user, 'shared_memory.group')};") if user else "",
        )
        nginx_conf = out / "nginx.conf"
        nginx_conf.write_text(_fill(nginx_template("nginx.conf").read_text(), values, "nginx.conf"))
    return RenderedNginx(out, http_conf, server_conf, admin_conf, nginx_conf, prefix)
