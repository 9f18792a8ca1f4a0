"""config.yaml `plugins:` (docs/plugins.md): the nginx request path's plugin chain.

chain names the plugins in order (default: the built-in chain, today's request path);
dir is where operators' own plugins live (NAME.lua); settings maps a plugin's name to its
own settings (scalars), handed to its phases as their second argument.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The built-in plugins (lua/zccp/plugins/NAME.lua), in the default order: the request path
# as it was before plugins. nginx gets the chain from here (settings.plugins.chain), always
# rendered: zccp.core.pipeline keeps no copy and refuses to start without it.
BUILTIN = ("metrics", "auth", "limits", "ratelimit_headers", "l1", "fingerprint", "tenancy", "router", "usage")
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


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
    known = {"chain", "dir", "settings"}
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
        if name not in BUILTIN and not (d and (Path(d) / f"{name}.lua").is_file()):
            raise PluginsError(f"{w}: {name} is not a built-in plugin ({', '.join(BUILTIN)}) "
                               f"and plugins.dir has no {name}.lua")
        chain.append(name)
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
            if isinstance(v, bool) or not isinstance(v, (int, float, str)):
                raise PluginsError(f"{w}.{k}: expected a string, number or true/false, got {v!r}")
        settings[name] = dict(conf)
    return PluginsConfig(chain=tuple(chain), dir=d, settings=settings)


def _lua_value(v: Any, what: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
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
