"""config.yaml: one file for both sides, validated strictly at start-up.

Every section is a dataclass (zccp.config.sections; plugins: zccp.config.plugins); a
number's bounds sit beside its field (`bounded(default, lo, hi)`). Unknown keys and
ill-typed or out-of-range values are refused with the file name and the dotted key in the
message, so a typo never silently falls back to a default. This module: the checks across
sections, engines:, and loading.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Any

import yaml

from zccp.config.sections import (
    AuthConfig as AuthConfig,
    CacheConfig as CacheConfig,
    Config as Config,
    ConfigError as ConfigError,
    EngineEntry as EngineEntry,
    GpuConfig as GpuConfig,
    L1Config as L1Config,
    LimitsConfig as LimitsConfig,
    LoggingConfig as LoggingConfig,
    ModelConfig as ModelConfig,
    HANDOFF_BACKENDS as HANDOFF_BACKENDS,
    PER_PROCESS_BACKENDS as PER_PROCESS_BACKENDS,
    PlacementConfig as PlacementConfig,
    RoutingConfig as RoutingConfig,
    ServerConfig as ServerConfig,
    SharedMemoryConfig as SharedMemoryConfig,
    TlsConfig as TlsConfig,
    UpstreamConfig as UpstreamConfig,
    _build_section as _build_section,
    bounded as bounded,
)
from zccp.config.plugins import PluginsError, parse_plugins
from zccp.config.redis_url import parse_redis_url


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
    for key in ("health", "metrics"):
        value = getattr(cfg.server.paths, key)
        if value is not None and not re.fullmatch(r"(/[A-Za-z0-9._~-]+)+", value):
            raise ConfigError(f"{cfg.path}: server.paths.{key}: {value!r} must be an absolute path of "
                              "letters, digits and ._~- segments (an exact nginx location)")
        if value is not None and value.startswith("/v1/"):
            raise ConfigError(f"{cfg.path}: server.paths.{key}: {value!r} is under /v1/, the API's own paths")
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
        if t.tls:
            raise ConfigError(f"{cfg.path}: auth.redis_url: nginx's Redis client (lua-resty-redis 0.27) has no "
                              "TLS: name a redis://, unix://, redis+cluster:// or redis+sentinel:// URL")
        if t.sentinel_username:
            raise ConfigError(f"{cfg.path}: auth.redis_url: sentinel_username: nginx's Sentinel client "
                              "(lua-resty-redis-connector 0.06) authenticates to Sentinels with a password only")
        if cfg.auth.keys_file is not None:
            from zccp.config.keystore import load_keys_file

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


_SECTIONS = {f.name: f.type for f in dataclasses.fields(Config)
             if f.name not in ("path", "engines", "plugins", "placement")}
_ENGINE_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
# each but name: overrides of the top-level section
_ENGINE_KEYS = ("name", "model", "shared_memory", "gpu", "upstream", "placement")


def parse_placement(raw: Any, path: str, where: str = "placement") -> PlacementConfig:
    """`auto`, `none` (or absent), or a mapping: cpus / numa_node (a fixed placement), or
    mode: auto with nginx_share."""
    if raw is None or raw in ("none", "auto"):
        return PlacementConfig(mode=raw or "none")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: {where}: expected auto, none or a mapping (cpus, numa_node; or mode: auto, "
                          f"nginx_share), got {raw!r}")
    p = _build_section(path, where, PlacementConfig, raw)
    fixed = p.cpus is not None or p.numa_node is not None
    if "mode" not in raw:
        if not fixed:
            raise ConfigError(f"{path}: {where}: a mapping names cpus or numa_node (or mode: auto)")
        return dataclasses.replace(p, mode="fixed")
    if fixed != (p.mode == "fixed"):
        raise ConfigError(f"{path}: {where}.mode: {p.mode!r} with{'' if fixed else 'out'} cpus/numa_node "
                          f"(cpus and numa_node are a fixed placement's)")
    return p


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
            raise ConfigError(f"{path}: engines[{n}]: expected a mapping ({', '.join(_ENGINE_KEYS)})")
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
            placement=parse_placement(item["placement"], path, f"{where}.placement") if "placement" in item
            else parse_placement(raw.get("placement"), path),
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
                                       upstream=e.upstream, placement=e.placement,
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
        if key not in _SECTIONS and key not in ("engines", "plugins", "placement"):
            raise ConfigError(f"{path}: {key}: unknown section (known: {', '.join(_SECTIONS)}, engines, plugins, "
                              "placement)")
    sections = {name: _build_section(path, name, hints[name], raw.get(name)) for name in _SECTIONS}
    try:
        plugins = parse_plugins(raw.get("plugins"), path)
    except PluginsError as exc:
        raise ConfigError(str(exc)) from None
    cfg = Config(**sections, engines=_parse_engines(raw, path), plugins=plugins,
                 placement=parse_placement(raw.get("placement"), path), path=path)
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
        raise ValueError("server.socket_path is not resolved (zccp.config.runtime.resolve)")  # programmer error
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
