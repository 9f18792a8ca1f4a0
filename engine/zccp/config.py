"""config.yaml: one file for both sides, validated strictly at start-up.

Every section is a dataclass; a number's bounds sit beside its field
(`bounded(default, lo, hi)`). Unknown keys and ill-typed or out-of-range values
are refused with the file name and the dotted key in the message, so a typo
never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from zccp.plugins_config import PluginsConfig, PluginsError, parse_plugins
from zccp.redis_url import parse_redis_url

_N = TypeVar("_N", int, float)


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and key."""


def bounded(default: _N, lo: float, hi: float) -> _N:
    """A number field's default and its inclusive bounds [lo, hi], checked at load."""
    return field(default=default, metadata={"bounds": (lo, hi)})


@dataclass(frozen=True)
class TlsConfig:
    """server.tls: ZCCP's own listener speaks HTTPS (PEM files, read by nginx's master)."""
    certificate: str                         # the certificate chain, leaf first
    key: str                                 # its private key


@dataclass(frozen=True)
class ServerConfig:
    listen: str = "127.0.0.1:8080"          # nginx listen address (loopback by default)
    workers: int = bounded(2, 1, 64)   # nginx worker processes
    socket_path: str | None = None           # None: derived from the run directory (zccp.runtime)
    connect_timeout_ms: int = bounded(500, 1, 60_000)   # nginx -> engine doorbell connect
    doorbell_pool_size: int = bounded(64, 1, 4096)   # keepalive cosockets per nginx worker
    user: str | None = None                  # nginx workers' user when started as root (None: www-data)
    # Who may GET /metrics on the admin listener: nginx `allow` arguments (addresses, CIDRs,
    # "unix:", "all"), space separated; everyone else gets 403.
    metrics_allow: str = "127.0.0.1 ::1 unix:"
    # The kernel send buffer of each client connection of the standalone nginx (listen
    # sndbuf=), in KiB; 0: the kernel's autotuning (on loopback it grows to megabytes). A
    # fixed one bounds the kernel memory a client that stops reading can pin.
    send_buffer_kb: int = bounded(0, 0, 1 << 16)
    # The admin listener (purge, warmup, L1 purge, keys, /metrics; docs/keys.md): a unix
    # socket ("unix:/path") or an address; None: unix:<socket dir>/admin.sock. The public
    # listener never serves those paths.
    admin_listen: str | None = None
    # A file holding the admin token (Authorization: Bearer <token> on the admin listener).
    # Required when admin_listen is an address; optional on a unix socket (its file mode guards it).
    admin_token_file: str | None = None
    tls: TlsConfig | None = None             # None: plain HTTP on `listen`
    # HTTP/2 on the TLS listener (ALPN h2, HTTP/1.1 still offered). None: on with tls. Needs
    # tls: nginx 1.22 speaks cleartext HTTP/2 only to prior-knowledge clients, and then no
    # HTTP/1.1 on that port.
    http2: bool | None = None

    @property
    def speaks_http2(self) -> bool:
        return self.tls is not None and self.http2 is not False


@dataclass(frozen=True)
class GpuConfig:
    enabled: Literal["auto", "on", "off"] = "auto"
    device_id: int = bounded(0, 0, 64)
    register_host_memory: bool = True        # pin the arena once and read tokens in place


@dataclass(frozen=True)
class L1Config:
    """nginx's own copy of exact hits (cache.l1, docs/cache.md "L1 in nginx")."""
    enabled: bool = True
    size_mb: int = bounded(64, 1, 1 << 16)   # the lua_shared_dict (least recently used entries go first)
    max_entries: int = bounded(10000, 1, 1 << 24)   # dict entries: one per key of an answer (bytes, exact key)
    max_entry_kb: int = bounded(256, 1, 1 << 20)   # a larger answer is not kept
    ttl_s: int = bounded(300, 1, 30 * 86400)   # at most this long, whatever the engine allows


@dataclass(frozen=True)
class CacheConfig:
    enabled: bool = True
    # redis://host:port/db (one server), redis+cluster://h1:p1,h2:p2 (a Redis Cluster) or
    # redis+sentinel://h1:p1,h2:p2/<master name>/db (Sentinels): docs/cache.md
    redis_url: str = "redis://127.0.0.1:6379/0"
    # The Redis zccp-stack starts (cache.redis_url on loopback): its memory bound and what it
    # evicts at the bound. allkeys-lru: everything in it is a cache entry or an index of them,
    # rebuilt by a miss, and a key without a TTL can never make writes fail (volatile-* would
    # refuse them). Your own Redis: set the same (docs/cache.md).
    redis_maxmemory_mb: int = bounded(256, 1, 1 << 20)
    redis_maxmemory_policy: Literal["allkeys-lru", "allkeys-lfu", "volatile-lru", "volatile-lfu",
                                    "volatile-ttl"] = "allkeys-lru"
    ttl_s: int = bounded(3600, 1, 30 * 86400)
    near_duplicate: bool = True
    similarity_threshold: float = bounded(0.85, 0.01, 1.0)
    timeout_ms: int = bounded(100, 1, 60_000)   # per Redis call; includes the engine's own queueing
    # An identical request (same exact key) arriving while the first is generated waits
    # for it up to this long, then runs on its own; 0: never wait (zccp.cache.inflight).
    coalesce_wait_ms: int = bounded(30000, 0, 3_600_000)
    # Who may be served whose answers: "tenant" (nothing crosses tenants; "isolated" is the
    # same), opt-in sharing: "shared_exact" (exact unmasked hits shared) or "global" (all).
    scope: Literal["tenant", "isolated", "shared_exact", "global"] = "tenant"
    # Where the tenant comes from: the API key (x-api-key or Authorization: Bearer), the
    # end user the body names (metadata.user_id / user), or the header tenant_header.
    tenant_source: Literal["api_key", "user", "header"] = "api_key"
    tenant_header: str | None = None
    mask_patterns: str | None = None        # the operator's mask file (None: lua/zccp/mask_patterns.lua)
    # Sampled requests (temperature > 0, no seed): "off" neither reads nor writes the cache
    # (two calls, two samples), "store" writes but serves only requests that ask with
    # X-ZCCP-Cache-Sampled: on, "on" caches them like any other (docs/cache.md).
    sampled: Literal["off", "store", "on"] = "off"
    l1: L1Config = field(default_factory=L1Config)


@dataclass(frozen=True)
class SharedMemoryConfig:
    name: str = "/zccp.default"
    segment_count: int = bounded(128, 1, 65_536)
    segment_size_kb: int = bounded(1024, 16, 1 << 20)
    tokens_kb: int = bounded(256, 4, 1 << 20)   # token array region per slot
    response_kb: int = bounded(64, 4, 1 << 20)   # response ring per slot
    # sweeper period; a slot with no job is checked after this long
    cleanup_interval_ms: int = bounded(30000, 100, 86_400_000)
    group: str | None = None                 # arena + socket become 0660 with this group


@dataclass(frozen=True)
class ModelConfig:
    backend: Literal["tiny", "null", "hf", "upstream"] = "tiny"   # upstream: forward to an HTTP server (upstream:)
    name: str = "zccp-tiny"
    path: str | None = None                  # hf: the local checkpoint directory
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"   # hf; auto: checkpoint's on GPU, fp32 on CPU
    seed: int = 0
    d_model: int = bounded(128, 8, 8192)
    n_layers: int = bounded(2, 1, 128)
    n_heads: int = bounded(4, 1, 128)
    d_ff: int = bounded(512, 8, 65_536)
    max_context: int = bounded(8192, 16, 1 << 22)
    prefill_chunk: int = bounded(0, 0, 1 << 22)   # cap on prompt tokens per prefill forward; 0: planned from memory
    threads: int = bounded(1, 1, 256)   # torch intra-op threads
    kv_cache_mb: int = bounded(512, 1, 1 << 22)   # KV memory of the running batch (admission bound)
    prefix_cache_mb: int = bounded(256, 0, 1 << 22)   # KV memory kept for prompt-prefix reuse; 0: off
    prefix_block: int = bounded(16, 1, 4096)   # tokens per prefix block
    max_batch: int = bounded(32, 1, 4096)   # sequences decoded together
    max_queue: int = bounded(64, 1, 1 << 20)   # sequences waiting for the model; beyond: 429
    tool_parser: Literal["hermes", "none"] = "hermes"   # <tool_call> JSON in the output -> tool calls
    null_reply: str = "Hello from the ZCCP null backend."
    null_token_delay_ms: float = bounded(0.0, 0, 10_000)   # null backend: simulated time per token
    null_fail_after: int = bounded(-1, -1, 1 << 20)   # null backend: raise after this many tokens (-1: never; tests)


@dataclass(frozen=True)
class UpstreamConfig:
    """model.backend: upstream: an OpenAI- or Anthropic-compatible HTTP server answers the
    misses (zccp.upstream; docs/upstreams.md). The key is named by its environment variable,
    never written here."""

    urls: tuple[str, ...] = ()              # base URLs up to /v1 (http://h:8000/v1), in order: the fallback list
    api: Literal["openai", "anthropic"] = "openai"   # what the upstream speaks
    model: str | None = None                 # the upstream's model name (None: model.name)
    api_key_env: str | None = None           # the environment variable holding the upstream's key
    connect_timeout_ms: int = bounded(2000, 1, 600_000)
    read_timeout_ms: int = bounded(60000, 1, 3_600_000)   # between two reads of the answer
    retries: int = bounded(2, 0, 16)         # further attempts (next URL) before the first byte of an answer
    max_connections: int = bounded(256, 1, 65_536)   # pooled, reused connections (all URLs)
    health_interval_ms: int = bounded(2000, 50, 3_600_000)   # probes of a URL in cool-down
    cooldown_ms: int = bounded(5000, 0, 3_600_000)   # a failed URL is skipped this long, then probed


@dataclass(frozen=True)
class LimitsConfig:
    max_body_kb: int = bounded(512, 1, 1 << 20)
    max_tokens_cap: int = bounded(4096, 1, 1 << 20)
    default_max_tokens: int = bounded(256, 1, 1 << 20)
    request_timeout_ms: int = bounded(60000, 100, 3_600_000)
    # Streams (SSE) nginx relays: a client that reads nothing for stream_stall_timeout_ms
    # is ended and its slot freed (nginx's send_timeout on ZCCP's locations); a stream is
    # also ended after stream_max_duration_ms or stream_max_bytes_kb (0: no such limit;
    # request_timeout_ms still bounds every request). zccp_nginx_streams_ended_total counts each.
    stream_stall_timeout_ms: int = bounded(30000, 100, 3_600_000)
    stream_max_duration_ms: int = bounded(0, 0, 86_400_000)
    stream_max_bytes_kb: int = bounded(0, 0, 1 << 30)


@dataclass(frozen=True)
class LoggingConfig:
    level: Literal["debug", "info", "warning", "error"] = "info"
    file: str | None = None                  # None = stderr


@dataclass(frozen=True)
class AuthConfig:
    """API keys, checked by nginx (lua/zccp/auth.lua; docs/keys.md)."""
    # off: every caller is served and the tenant comes from cache.tenant_source (anyone who
    # can reach the listener is served); keys (or on): a key `zccp-keys` made is required
    mode: Literal["off", "on", "keys"] = "off"
    redis_url: str | None = None             # where the key records live; None: cache.redis_url
    cache_ttl_s: int = bounded(5, 1, 3600)   # a verified key is re-read after this: the revocation bound
    negative_ttl_s: int = bounded(2, 1, 3600)   # an unknown key is asked again after this
    timeout_ms: int = bounded(200, 1, 60_000)   # nginx's Redis calls for keys and limits
    # One host's keys in a file (hashes only; zccp-keys create --keys-file), read by nginx at
    # start and reload, looked up before Redis; limits are still counted in Redis
    keys_file: str | None = None
    # One JSON line per request answered with a key (billing); None: usage.jsonl beside the
    # doorbell socket (a directory nginx's workers can write), "" : none
    usage_log: str | None = field(default=None, metadata={"empty_ok": True})

    @property
    def on(self) -> bool:
        return self.mode != "off"


@dataclass(frozen=True)
class RoutingConfig:
    """How nginx picks among the engines that serve a request's model (docs/engines.md)."""
    # affinity: rendezvous hash of the request's route key (a conversation stays on one replica,
    # whose prefix cache holds it); round_robin and least_loaded: for comparison (bench/routing.py)
    policy: Literal["affinity", "round_robin", "least_loaded"] = "affinity"
    # The load bound: a replica with at least this fraction of its slots claimed is past it; a
    # request whose preferred replica is past it goes to the least-loaded replica instead (spilled).
    spill_load: float = bounded(0.75, 0.01, 1.0)


@dataclass(frozen=True)
class EngineEntry:
    """One engine process of `engines:` (several engines under one nginx, docs/engines.md):
    its model, arena and device. The doorbell socket is derived (runtime.resolve):
    doorbell-<name>.sock beside server.socket_path."""
    name: str
    model: ModelConfig
    shared_memory: SharedMemoryConfig
    gpu: GpuConfig
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)   # model.backend: upstream
    socket_path: str | None = None           # set by runtime.resolve


@dataclass(frozen=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    shared_memory: SharedMemoryConfig = field(default_factory=SharedMemoryConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    # engines: several engine processes under one nginx; () (no `engines:`): one engine, the
    # top-level model / shared_memory / gpu (what every config before it meant).
    engines: tuple[EngineEntry, ...] = ()
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    plugins: PluginsConfig = field(default_factory=PluginsConfig)   # zccp.plugins_config
    path: str = "<defaults>"                 # where it was loaded from (not a YAML key)


def _check_value(where: str, hint: Any, value: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin is Literal:
        if isinstance(value, bool) and {"on", "off"} <= set(typing.get_args(hint)):
            return "on" if value else "off"   # YAML 1.1 reads a bare on/off/yes/no as a boolean
        if value is None and "null" in typing.get_args(hint):
            raise ConfigError(f"{where}: YAML read null as nothing; write 'null' in quotes")
        if value not in typing.get_args(hint):
            allowed = ", ".join(repr(a) for a in typing.get_args(hint))
            raise ConfigError(f"{where}: {value!r} is not one of {allowed}")
        return value
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _check_value(where, inner, value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        # a subsection (cache.l1): `where` ends with its dotted name
        path, _, name = where.rpartition(": ")
        return _build_section(path, name, hint, value)
    if origin is tuple:   # a list of strings (upstream.urls)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (inner, _) = typing.get_args(hint)
        return tuple(_check_value(f"{where}[{i}]", inner, v) for i, v in enumerate(value))
    if hint is str:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}: expected a non-empty string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {hint!r}")  # programmer error


def _build_section(path: str, name: str, cls: type, raw: Any) -> Any:
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: {name}: expected a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    bounds_of = {f.name: f.metadata.get("bounds") for f in dataclasses.fields(cls)}
    known = set(bounds_of)
    for key in raw:
        if key not in known:
            raise ConfigError(f"{path}: {name}.{key}: unknown key (known: {', '.join(sorted(known))})")
    values = {}
    empty_ok = {f.name for f in dataclasses.fields(cls) if f.metadata.get("empty_ok")}
    for key, value in raw.items():
        where = f"{path}: {name}.{key}"
        checked = "" if value == "" and key in empty_ok else _check_value(where, hints[key], value)
        bounds = bounds_of[key]
        if bounds is not None and checked is not None and not bounds[0] <= checked <= bounds[1]:
            raise ConfigError(f"{where}: {checked!r} is outside [{bounds[0]}, {bounds[1]}]")
        values[key] = checked
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    for key in required:
        if key not in values:
            raise ConfigError(f"{path}: {name}.{key}: required")
    return cls(**values)


def _check_consistency(cfg: Config, given: frozenset[str] = frozenset()) -> None:
    """given: the shared_memory keys the file set (so an error names the one the user wrote)."""
    shm = cfg.shared_memory
    where = f"{cfg.path}: shared_memory"
    if shm.segment_size_kb % 4:
        raise ConfigError(f"{where}.segment_size_kb: {shm.segment_size_kb} is not a multiple of 4")
    for key in ("tokens_kb", "response_kb"):
        if getattr(shm, key) % 4:
            raise ConfigError(f"{where}.{key}: {getattr(shm, key)} is not a multiple of 4")
    payload_kb = shm.segment_size_kb - 4 - shm.tokens_kb - shm.response_kb
    if payload_kb < 4:
        regions = [k for k in ("tokens_kb", "response_kb") if k in given]
        key = max(regions, key=lambda k: getattr(shm, k)) if regions else "segment_size_kb"
        raise ConfigError(
            f"{where}.{key}: {getattr(shm, key)} leaves no room for a payload: a slot of segment_size_kb "
            f"{shm.segment_size_kb} KiB holds the 4 KiB header page, tokens_kb {shm.tokens_kb} and "
            f"response_kb {shm.response_kb}, and needs at least 4 KiB more"
        )
    if cfg.limits.max_body_kb > payload_kb:
        raise ConfigError(
            f"{cfg.path}: limits.max_body_kb: {cfg.limits.max_body_kb} exceeds the slot payload "
            f"capacity of {payload_kb} KiB (raise shared_memory.segment_size_kb)"
        )
    if shm.segment_count * shm.segment_size_kb > 64 * 1024 * 1024:
        raise ConfigError(f"{where}: the arena would exceed 64 GiB")
    if not shm.name.startswith("/") or "/" in shm.name[1:] or len(shm.name) > 200:
        raise ConfigError(f"{where}.name: {shm.name!r} must look like /name (one leading slash)")
    if cfg.server.socket_path is not None and len(cfg.server.socket_path.encode()) >= 108:
        raise ConfigError(f"{cfg.path}: server.socket_path: longer than 107 bytes")
    for token in cfg.server.metrics_allow.split():
        if not re.fullmatch(r"all|unix:|[0-9A-Fa-f.:]+(/[0-9]{1,3})?", token):
            raise ConfigError(f"{cfg.path}: server.metrics_allow: {token!r} is not an address, a CIDR, "
                              "'unix:' or 'all'")
    admin = cfg.server.admin_listen
    if admin is not None:
        if admin == cfg.server.listen:
            raise ConfigError(f"{cfg.path}: server.admin_listen: the same as server.listen; the admin "
                              "surface needs a listener of its own")
        if not admin.startswith("unix:") and cfg.server.admin_token_file is None:
            raise ConfigError(f"{cfg.path}: server.admin_token_file: required when server.admin_listen is an "
                              "address (a unix socket may go without)")
    if cfg.auth.on:
        try:
            t = parse_redis_url(auth_redis_url(cfg))
        except ValueError as exc:
            raise ConfigError(f"{cfg.path}: auth.redis_url: {exc}") from None
        if t.tls or t.topology == "sentinel":
            raise ConfigError(f"{cfg.path}: auth.redis_url: nginx reads keys over redis://, unix:// or "
                              "redis+cluster:// only (no TLS, no Sentinel): name one in auth.redis_url")
        if cfg.auth.keys_file is not None:
            from zccp.keystore import load_keys_file

            try:
                load_keys_file(cfg.auth.keys_file)
            except ValueError as exc:
                raise ConfigError(f"{cfg.path}: auth.keys_file: {exc}") from None
    if cfg.server.http2 and cfg.server.tls is None:
        raise ConfigError(f"{cfg.path}: server.http2: true needs server.tls (certificate and key): nginx "
                          "speaks cleartext HTTP/2 only to prior-knowledge clients, and no HTTP/1.1 beside it")
    if cfg.limits.default_max_tokens > cfg.limits.max_tokens_cap:
        raise ConfigError(f"{cfg.path}: limits.default_max_tokens: exceeds limits.max_tokens_cap")
    cache = cfg.cache
    try:
        parse_redis_url(cache.redis_url)
    except ValueError as exc:
        raise ConfigError(f"{cfg.path}: cache.redis_url: {exc}") from None
    if cache.tenant_source == "header" and cache.tenant_header is None:
        raise ConfigError(f"{cfg.path}: cache.tenant_header: required when cache.tenant_source is 'header'")
    if cache.tenant_header is not None:
        if cache.tenant_source != "header":
            raise ConfigError(f"{cfg.path}: cache.tenant_header: set, but cache.tenant_source is "
                              f"{cache.tenant_source!r}, not 'header'")
        if not re.fullmatch(r"[A-Za-z0-9-]{1,64}", cache.tenant_header):
            raise ConfigError(f"{cfg.path}: cache.tenant_header: {cache.tenant_header!r} is not a header name "
                              f"(letters, digits and '-')")
    if cfg.model.d_model % cfg.model.n_heads or (cfg.model.d_model // cfg.model.n_heads) % 2:
        raise ConfigError(f"{cfg.path}: model.d_model: must split into n_heads heads of even size")
    checked = [("", cfg.model, cfg.upstream)] if not cfg.engines else \
        [(f"engines.{e.name}.", e.model, e.upstream) for e in cfg.engines]
    for where, model, upstream in checked:
        if model.backend != "upstream":
            continue
        if not upstream.urls:
            raise ConfigError(f"{cfg.path}: {where}upstream.urls: required when model.backend is 'upstream'")
        for i, url in enumerate(upstream.urls):
            if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
                raise ConfigError(f"{cfg.path}: {where}upstream.urls[{i}]: {url!r} is not an http:// or https:// URL")
    if cfg.model.backend == "hf" and cfg.model.path is None:
        raise ConfigError(f"{cfg.path}: model.path: required when model.backend is 'hf' "
                          "(a local checkpoint directory)")


def check_tls_files(cfg: Config) -> None:
    """nginx's start-up check (the engine never reads them): server.tls's files are regular,
    readable PEM files, else a ConfigError naming the key. Relative paths are refused: nginx
    would read them against its own prefix, not against the config file."""
    tls = cfg.server.tls
    if tls is None:
        return
    for key, marker in (("certificate", "CERTIFICATE"), ("key", "PRIVATE KEY")):
        path = Path(getattr(tls, key))
        where = f"{cfg.path}: server.tls.{key}: {path}"
        if not path.is_absolute():
            raise ConfigError(f"{where}: must be an absolute path")
        try:
            with path.open("rb") as f:
                head = f.read(1 << 16)
        except OSError as exc:
            raise ConfigError(f"{where}: cannot read: {exc.strerror}") from None
        if not path.is_file():
            raise ConfigError(f"{where}: not a regular file")
        if b"-----BEGIN " not in head or marker.encode() not in head:
            raise ConfigError(f"{where}: not a PEM file holding a {marker.lower()} (-----BEGIN ...{marker}-----)")


_SECTIONS = {f.name: f.type for f in dataclasses.fields(Config) if f.name not in ("path", "engines", "plugins")}
_ENGINE_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
# each but name: overrides of the top-level section
_ENGINE_KEYS = ("name", "model", "shared_memory", "gpu", "upstream")


def _overlay(base: Any, over: Any, where: str) -> dict[str, Any]:
    """An entry's section: the top-level one's keys, then the entry's own."""
    if over is not None and not isinstance(over, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(over).__name__}")
    return {**(base if isinstance(base, dict) else {}), **(over or {})}


def _parse_engines(raw: dict[str, Any], path: str) -> tuple[EngineEntry, ...]:
    items = raw.get("engines")
    if items is None:
        return ()
    if not isinstance(items, list) or not items:
        raise ConfigError(f"{path}: engines: expected a non-empty list of engines")
    out: list[EngineEntry] = []
    for n, item in enumerate(items):
        if not isinstance(item, dict):
            raise ConfigError(f"{path}: engines[{n}]: expected a mapping (name, model, shared_memory, gpu, upstream)")
        for key in item:
            if key not in _ENGINE_KEYS:
                raise ConfigError(f"{path}: engines[{n}].{key}: unknown key (known: {', '.join(_ENGINE_KEYS)})")
        name = item.get("name")
        if not isinstance(name, str) or not _ENGINE_NAME.fullmatch(name):
            raise ConfigError(f"{path}: engines[{n}].name: {name!r} must be 1-32 of a-z, 0-9, _ and - "
                              "(it names the engine's socket, log and metrics)")
        if any(e.name == name for e in out):
            raise ConfigError(f"{path}: engines[{n}].name: {name!r} is listed twice")
        where = f"engines.{name}"
        shm_raw = _overlay(raw.get("shared_memory"), item.get("shared_memory"), f"{path}: {where}.shared_memory")
        if not isinstance(item.get("shared_memory"), dict) or "name" not in item["shared_memory"]:
            shm_raw["name"] = f"{shm_raw.get('name', SharedMemoryConfig.name)}.{name}"
        out.append(EngineEntry(
            name=name,
            model=_build_section(path, f"{where}.model", ModelConfig,
                                 _overlay(raw.get("model"), item.get("model"), f"{path}: {where}.model")),
            shared_memory=_build_section(path, f"{where}.shared_memory", SharedMemoryConfig, shm_raw),
            gpu=_build_section(path, f"{where}.gpu", GpuConfig,
                               _overlay(raw.get("gpu"), item.get("gpu"), f"{path}: {where}.gpu")),
            upstream=_build_section(path, f"{where}.upstream", UpstreamConfig,
                                    _overlay(raw.get("upstream"), item.get("upstream"), f"{path}: {where}.upstream")),
        ))
    shm_names = [e.shared_memory.name for e in out]
    for n, e in enumerate(out):
        if shm_names.index(e.shared_memory.name) != n:
            raise ConfigError(f"{path}: engines.{e.name}.shared_memory.name: {e.shared_memory.name!r} is "
                              "another engine's too (each engine has an arena of its own)")
    return tuple(out)


def for_engine(cfg: Config, name: str) -> Config:
    """The config one engine process of `engines:` runs with: its model, arena, device and
    doorbell in the places every engine reads them (cfg.engines kept: /v1/models lists them all)."""
    for e in cfg.engines:
        if e.name == name:
            return dataclasses.replace(cfg, model=e.model, shared_memory=e.shared_memory, gpu=e.gpu,
                                       upstream=e.upstream,
                                       server=dataclasses.replace(cfg.server, socket_path=e.socket_path
                                                                  or cfg.server.socket_path))
    known = ", ".join(e.name for e in cfg.engines) or "none: config.yaml has no engines list"
    raise ConfigError(f"{cfg.path}: engines: no engine named {name!r} (known: {known})")


def model_names(cfg: Config) -> list[str]:
    """Every model the stack serves, each once, in config order (GET /v1/models)."""
    names = [e.model.name for e in cfg.engines] or [cfg.model.name]
    return list(dict.fromkeys(names))


def auth_redis_url(cfg: Config) -> str:
    """The Redis the key records and the limits' counters live in."""
    return cfg.auth.redis_url or cfg.cache.redis_url


def parse_config(raw: Any, path: str = "<string>") -> Config:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections")
    hints = typing.get_type_hints(Config)
    for key in raw:
        if key not in _SECTIONS and key not in ("engines", "plugins"):
            raise ConfigError(f"{path}: {key}: unknown section (known: {', '.join(_SECTIONS)}, engines, plugins)")
    sections = {name: _build_section(path, name, hints[name], raw.get(name)) for name in _SECTIONS}
    try:
        plugins = parse_plugins(raw.get("plugins"), path)
    except PluginsError as exc:
        raise ConfigError(str(exc)) from None
    cfg = Config(**sections, engines=_parse_engines(raw, path), plugins=plugins, path=path)
    shm_raw = raw.get("shared_memory")
    _check_consistency(cfg, frozenset(shm_raw) if isinstance(shm_raw, dict) else frozenset())
    for e in cfg.engines:   # each engine's arena and model, as its own process will check them
        given = raw["engines"][cfg.engines.index(e)].get("shared_memory") or {}
        try:
            _check_consistency(for_engine(cfg, e.name), frozenset(given))
        except ConfigError as exc:
            msg = str(exc).removeprefix(f"{path}: ")
            raise ConfigError(f"{path}: engines.{e.name}: {msg}") from None
    return cfg


def mask_state_path(cfg: Config) -> Path:
    """Where nginx keeps the mask patterns in force (beside the doorbell socket)."""
    if cfg.server.socket_path is None:
        raise ValueError("server.socket_path is not resolved (zccp.runtime.resolve)")  # programmer error
    return Path(cfg.server.socket_path).parent / "mask_patterns.last_good.lua"


def load_config(path: str | Path) -> Config:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror}") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from exc
    return parse_config(raw, str(p))
