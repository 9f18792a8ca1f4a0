"""config.yaml `plugins:` (docs/plugins.md): the nginx request path's plugin chain.

chain names the plugins in order (default: the built-in chain, today's request path);
add inserts operators' plugins into it by position ({name, after | before}) instead of
re-listing the built-ins; dir is where operators' own plugins live (NAME.lua); settings
maps a plugin's name to its own settings (scalars, lists and mappings of scalars), handed
to its phases as their second argument. Each plugin's settings are checked against its
own _M.schema (unknown keys, types, enums, required) by zccp.core.plugin_load when nginx
loads the chain (zccp-nginx check, zccp-stack up and reload run it before nginx serves):
in_config() names config.yaml, the key and the plugin file whose schema refused it. That
check is the one schema validator; zccp-engine --check does not run it (the engine's host
need not have nginx: compose runs nginx apart).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zccp.config.paths import lua_dir

# The built-in plugins (lua/zccp/plugins/NAME.lua), in the default order: the request path
# as it was before plugins. nginx gets the chain from here (settings.plugins.chain), always
# rendered: zccp.core.pipeline keeps no copy and refuses to start without it.
BUILTIN = ("metrics", "auth", "limits", "ratelimit_headers", "l1", "fingerprint", "tenancy", "router", "usage")
# Every built-in plugin's name (the files of lua/zccp/plugins/): an operator's plugin takes none.
BUILTIN_FILES = frozenset(p.stem for p in (lua_dir() / "zccp" / "plugins").glob("*.lua")) | frozenset(BUILTIN)
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
# zccp.core.plugin_load's schema refusal: "<plugin file>: plugins.settings.<name>[.<key>]: why"
_SETTINGS_REFUSED = re.compile(r"(\S+\.lua): (plugins\.settings\.[^:\s]+): ([^\n]*)")


def in_config(text: str, config_path: str) -> str:
    """Each schema refusal in text (a report line, nginx's log) as config.yaml's:
    "<config>: plugins.settings.<name>.<key>: why (<plugin file>'s schema)"."""
    return _SETTINGS_REFUSED.sub(lambda m: f"{config_path}: {m[2]}: {m[3]} ({m[1]}'s schema)", text)


class PluginsError(ValueError):
    """A plugins: section that cannot be used; the message names the key."""


@dataclass(frozen=True)
class PluginsConfig:
    chain: tuple[str, ...] = BUILTIN
    dir: str | None = None
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)


def parse_plugins(raw: Any, path: str) -> PluginsConfig:
    where = f"{path}: plugins"
    if raw is None:
        return PluginsConfig()
    if not isinstance(raw, dict):
        raise PluginsError(f"{where}: expected a mapping, got {type(raw).__name__}")
    known = {"chain", "add", "dir", "settings"}
    for key in raw:
        if key not in known:
            raise PluginsError(f"{where}.{key}: unknown key (known: {', '.join(sorted(known))})")
    d = raw.get("dir")
    if d is not None and (not isinstance(d, str) or not d):
        raise PluginsError(f"{where}.dir: expected a non-empty string, got {d!r}")
    if d is not None and not Path(d).is_dir():
        raise PluginsError(f"{where}.dir: {d} is not a directory")
    chain_raw = raw.get("chain", list(BUILTIN))
    if not isinstance(chain_raw, list):
        raise PluginsError(f"{where}.chain: expected a list of plugin names, got {chain_raw!r}")
    chain: list[str] = []
    for i, name in enumerate(chain_raw):
        w = f"{where}.chain[{i}]"
        if not isinstance(name, str) or not _NAME.match(name):
            raise PluginsError(f"{w}: {name!r} is not a plugin name (lower case letters, digits, _)")
        if name in chain:
            raise PluginsError(f"{w}: {name} is named twice")
        _check_name(name, d, w)
        chain.append(name)
    _insert(raw.get("add"), chain, d, f"{where}.add")
    settings_raw = raw.get("settings") or {}
    if not isinstance(settings_raw, dict):
        raise PluginsError(f"{where}.settings: expected a mapping of plugin name to its settings")
    settings: dict[str, dict[str, Any]] = {}
    for name, conf in settings_raw.items():
        w = f"{where}.settings.{name}"
        if name not in chain:
            raise PluginsError(f"{w}: no plugin {name} in plugins.chain")
        if not isinstance(conf, dict):
            raise PluginsError(f"{w}: expected a mapping")
        for k, v in conf.items():
            if not isinstance(k, str) or not _NAME.match(k):
                raise PluginsError(f"{w}.{k}: not a setting name (lower case letters, digits, _)")
            _check_value(v, f"{w}.{k}")
        settings[name] = dict(conf)
    return PluginsConfig(chain=tuple(chain), dir=d, settings=settings)


def _check_name(name: str, d: str | None, w: str) -> None:
    """A built-in, or an operator's plugin in dir; an operator's file never takes a built-in's name."""
    own = Path(d) / f"{name}.lua" if d else None
    if name in BUILTIN_FILES:
        if own is not None and own.exists():
            raise PluginsError(f"{w}: {own} takes the built-in plugin {name}'s name; name it otherwise")
        return
    if own is None or not own.is_file():
        raise PluginsError(f"{w}: {name} is not a built-in plugin ({', '.join(BUILTIN)}) "
                           f"and plugins.dir has no {name}.lua")


def _insert(raw: Any, chain: list[str], d: str | None, where: str) -> None:
    """plugins.add: [{name: X, after: Y} | {name: X, before: Y}], each placed in turn."""
    if raw is None:
        return
    if not isinstance(raw, list):
        raise PluginsError(f"{where}: expected a list of {{name, after | before}}")
    for i, item in enumerate(raw):
        w = f"{where}[{i}]"
        if not isinstance(item, dict) or set(item) - {"name", "after", "before"} or "name" not in item:
            raise PluginsError(f"{w}: expected {{name: NAME, after: NAME}} or {{name: NAME, before: NAME}}")
        name = item["name"]
        if not isinstance(name, str) or not _NAME.match(name):
            raise PluginsError(f"{w}.name: {name!r} is not a plugin name (lower case letters, digits, _)")
        if name in chain:
            raise PluginsError(f"{w}.name: {name} is already in plugins.chain")
        _check_name(name, d, f"{w}.name")
        places = [k for k in ("after", "before") if k in item]
        if len(places) != 1:
            raise PluginsError(f"{w}: give exactly one of after, before")
        anchor = item[places[0]]
        if anchor not in chain:
            raise PluginsError(f"{w}.{places[0]}: {anchor!r} is not in plugins.chain ({', '.join(chain)})")
        at = chain.index(anchor) + (1 if places[0] == "after" else 0)
        chain.insert(at, name)


def _check_value(v: Any, w: str, depth: int = 0) -> None:
    if isinstance(v, (bool, int, float, str)):
        return
    if depth == 0 and isinstance(v, list):
        for i, x in enumerate(v):
            _check_value(x, f"{w}[{i}]", 1)
        return
    if depth == 0 and isinstance(v, dict):
        for k, x in v.items():
            if not isinstance(k, str) or not k:
                raise PluginsError(f"{w}: {k!r}: a mapping's keys are names")
            _check_value(x, f"{w}.{k}", 1)
        return
    raise PluginsError(f"{w}: expected a string, number, true/false, or a list or mapping of those, got {v!r}")


def _lua_value(v: Any, what: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "{ " + ", ".join(_lua_value(x, f"{what}[{i}]") for i, x in enumerate(v)) + " }"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"[{_lua_value(str(k), what)}] = {_lua_value(x, f'{what}.{k}')}"
                                for k, x in v.items()) + " }"
    s = str(v)
    if any(c in s for c in '"\\\n\r') or not s.isprintable():
        raise PluginsError(f"{what}: {s!r} has a character nginx's config cannot carry")
    return f'"{s}"'


def lua_settings(p: PluginsConfig, last_good: Path) -> str:
    """plugins = {...} for init_by_lua (zccp.core.pipeline.init)."""
    chain = ", ".join(f'"{n}"' for n in p.chain)
    confs = []
    for name, conf in p.settings.items():
        fields = ", ".join(f"{k} = {_lua_value(v, f'plugins.settings.{name}.{k}')}" for k, v in conf.items())
        confs.append(f"{name} = {{ {fields} }}")
    d = _lua_value(str(Path(p.dir).resolve()), "plugins.dir") if p.dir else "nil"
    return (f"{{ chain = {{ {chain} }}, dir = {d}, last_good = {_lua_value(str(last_good), 'plugins last good')}, "
            f"config = {{ {', '.join(confs)} }} }}")
