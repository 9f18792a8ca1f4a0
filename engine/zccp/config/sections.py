"""config.yaml's sections: one dataclass each, and the strict checker that builds them.

Every section is a dataclass; a number's bounds sit beside its field
(`bounded(default, lo, hi)`). Unknown keys and ill-typed or out-of-range values
are refused with the file name and the dotted key in the message, so a typo
never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar


from zccp.config.plugins import PluginsConfig

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
class PathsConfig:
    """server.paths: the paths that commonly collide with a site's own (docs/existing-nginx.md)."""
    # GET health check on the public server; None: /health on the standalone stack,
    # /zccp/health in the includes for an existing server (a site's /health stays its own).
    health: str | None = None
    metrics: str = "/metrics"                # GET /metrics on the admin listener
    # GET /v1/models and /v1/models/<model.name> in the includes; false: the site keeps
    # them (the standalone stack always serves them).
    models: bool = True


# model backends each engine process can run on its own: no state shared between requests
# beyond the arena and Redis (zccp.process.group)
PER_PROCESS_BACKENDS = ("null", "upstream")
# backends whose prep processes hand their misses to the process that holds the model (zccp.process.handoff)
HANDOFF_BACKENDS = ("tiny", "hf")


@dataclass(frozen=True)
class ServerConfig:
    listen: str = "127.0.0.1:8080"          # nginx listen address (loopback by default)
    workers: int = bounded(2, 1, 64)   # nginx worker processes
    socket_path: str | None = None           # None: derived from the run directory (zccp.config.runtime)
    connect_timeout_ms: int = bounded(500, 1, 60_000)   # nginx -> engine doorbell connect
    doorbell_pool_size: int = bounded(64, 1, 4096)   # keepalive cosockets per nginx worker
    user: str | None = None                  # nginx workers' user when started as root (None: www-data)
    # Each engine's processes: the one owning the model, which makes the arena and binds the
    # doorbell, plus prep processes accepting on the same doorbell (zccp.process.group). 0:
    # sized from the host for the backends every process can run (null, upstream); 1 otherwise.
    engine_processes: int = bounded(0, 0, 64)
    # Who may GET /metrics on the admin listener: nginx `allow` arguments (addresses, CIDRs,
    # "unix:", "all"), space separated; everyone else gets 403.
    metrics_allow: str = "127.0.0.1 ::1 unix:"
    # The kernel send buffer of each client connection of the standalone nginx (listen
    # sndbuf=), in KiB; 0: the kernel's autotuning (on loopback it grows to megabytes). A
    # fixed one bounds the kernel memory a client that stops reading can pin.
    send_buffer_kb: int = bounded(0, 0, 1 << 16)
    # The admin listener (purge, warmup, L1 purge, keys, /metrics; docs/keys.md): a unix
    # socket ("unix:/path") or an address; None: unix:<socket dir>/admin/admin.sock. The public
    # listener never serves those paths.
    admin_listen: str | None = None
    # A file holding the admin token (Authorization: Bearer <token> on the admin listener).
    # Required when admin_listen is an address; optional on a unix socket (its directory, which
    # only its owner may enter, guards it: nginx makes the socket 0666). Mode 0600 or the start fails.
    admin_token_file: str | None = None
    tls: TlsConfig | None = None             # None: plain HTTP on `listen`
    # HTTP/2 on the TLS listener (ALPN h2, HTTP/1.1 still offered). None: on with tls. Needs
    # tls: nginx 1.22 speaks cleartext HTTP/2 only to prior-knowledge clients, and then no
    # HTTP/1.1 on that port.
    http2: bool | None = None
    paths: PathsConfig = field(default_factory=PathsConfig)

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
    # tokens one model step runs: each running row's next token, then prefill chunks in what is
    # left (vLLM's max_num_batched_tokens); it caps the chunk too. 0: 2048 on a GPU, 256 on a CPU
    step_tokens: int = bounded(0, 0, 1 << 22)
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
    # The upstream is not trusted (zccp.upstream.http1.Bounds; docs/upstreams.md): what it may send
    max_body_kb: int = bounded(16384, 1, 1 << 22)    # one answer's body, whole or streamed
    max_header_kb: int = bounded(64, 1, 1024)       # the status line and headers together (any one line too)
    max_event_kb: int = bounded(1024, 1, 1 << 16)   # one SSE line, and one event's lines together
    max_interim: int = bounded(8, 0, 64)             # 1xx answers skipped before the real one


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
    # The standalone nginx's access log: lines kept in a 64 KiB buffer per worker and
    # written at most this many ms later (one write(2) per batch, not per request; flushed
    # at reload and stop); 0: each line written as its request ends
    access_flush_ms: int = bounded(1000, 0, 60_000)


@dataclass(frozen=True)
class TracingConfig:
    """OpenTelemetry traces from the engine over OTLP/HTTP (docs/observability.md). Also on
    when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set in the
    engine's environment, unless OTEL_SDK_DISABLED=true; the SDK's OTEL_* variables win."""
    enabled: bool = False
    # the fraction of traces kept (parent-based: a client's sampled traceparent is kept)
    sample_ratio: float = bounded(1.0, 0.0, 1.0)
    # the collector's traces URL (http://host:4318/v1/traces); "": the SDK's default or OTEL_* env
    endpoint: str = field(default="", metadata={"empty_ok": True})
    # requests' records waiting for the span process; past it a record is dropped (its spans counted)
    max_queue: int = bounded(2048, 16, 1_000_000)


@dataclass(frozen=True)
class AuthConfig:
    """API keys, checked by nginx (lua/zccp/plugins/auth/keys.lua; docs/keys.md)."""
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
class PlacementConfig:
    """placement: where an engine runs (docs/engines.md, "Placement"). In YAML: `auto`,
    `none`, or a mapping: {cpus: "2-7", numa_node: 1} (fixed), {mode: auto, nginx_share: 0.5}."""
    mode: Literal["none", "auto", "fixed"] = "none"
    cpus: str | None = None                  # fixed: a cpulist ("2-7,10")
    numa_node: int | None = field(default=None, metadata={"bounds": (0, 1023)})   # fixed: its memory node
    # auto: the share of each node's online CPUs kept for nginx's workers (at least one, never all)
    nginx_share: float = bounded(0.25, 0.0, 0.9)


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
    placement: PlacementConfig = field(default_factory=PlacementConfig)   # its own, or the top-level one


@dataclass(frozen=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    shared_memory: SharedMemoryConfig = field(default_factory=SharedMemoryConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    # engines: several engine processes under one nginx; () (no `engines:`): one engine, the
    # top-level model / shared_memory / gpu (what every config before it meant).
    engines: tuple[EngineEntry, ...] = ()
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    plugins: PluginsConfig = field(default_factory=PluginsConfig)   # zccp.config.plugins
    placement: PlacementConfig = field(default_factory=PlacementConfig)   # zccp.config.parse_placement
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
