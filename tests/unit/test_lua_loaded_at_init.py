"""Every ZCCP Lua module a worker may require is loaded by nginx's master at init.

An operator's workers run as a user that may not read ZCCP's Lua files
(docs/existing-nginx.md): a module first required in a worker fails there (an
admin page answered 500 that way). What the master loads: the modules required by
init_by_lua, by the init function it calls, and every top-level `require` they
lead to (plugins are loaded at init by the pipeline). What a worker may require:
the other *_by_lua blocks' requires and every indented (lazy) require in a module
the master loaded. Read from the source, as a reviewer would; the second test
proves the scan on a made-up tree."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.checkout import REPO

REQUIRE = re.compile(r"""require\s*\(?\s*["'](zccp\.[\w.]+)["']""")
BLOCK = re.compile(r"(\w+)_by_lua_block\s*\{(.*?)\n\s*\}", re.S)
# A throwaway nginx that only checks a config and exits (zccp.ops.nginx_check).
NEVER_IN_WORKERS = {"zccp.check"}


def _code(line: str) -> str:
    return line.split("--", 1)[0]


def _requires(text: str) -> set[str]:
    return {m for line in text.splitlines() for m in REQUIRE.findall(_code(line))}


def _module_file(lua: Path, mod: str) -> Path:
    return lua.parent / (mod.replace(".", "/") + ".lua")


def _split(path: Path) -> tuple[set[str], set[str], set[str]]:
    """A module's requires: top level, inside its init function (run by the master), and
    inside any other function (run by a worker)."""
    top, in_init, lazy = set(), set(), set()
    where = None
    for line in path.read_text().splitlines():
        code = _code(line)
        if re.match(r"function _M\.init\s*\(", code):
            where = in_init
        elif where is in_init and re.match(r"end\b", code):
            where = None
            continue
        mods = set(REQUIRE.findall(code))
        if where is in_init:
            in_init |= mods
        elif line[:1].isspace():
            lazy |= mods
        else:
            top |= mods
    return top, in_init, lazy


def not_loaded_at_init(lua: Path, confs: list[Path], plugins: bool) -> list[str]:
    master: set[str] = set()
    worker: dict[str, str] = {}
    todo: list[str] = []
    for conf in confs:
        for phase, body in BLOCK.findall(conf.read_text()):
            for mod in _requires(body):
                if phase == "init":
                    todo.append(mod)
                else:
                    worker.setdefault(mod, f"{conf.name}: {phase}_by_lua")
    if plugins:
        todo += [f"zccp.plugins.{p.stem}" for p in sorted((lua / "plugins").glob("*.lua"))]
    while todo:
        mod = todo.pop()
        path = _module_file(lua, mod)
        if mod in master or not path.exists():
            continue
        master.add(mod)
        top, in_init, lazy = _split(path)
        todo += sorted(top | in_init)
        for dep in lazy:
            worker.setdefault(dep, f"{path.relative_to(lua.parent)} (inside a function)")
    return sorted(f"{mod}: required by {why}, not loaded at init"
                  for mod, why in worker.items()
                  if mod not in master and mod not in NEVER_IN_WORKERS)


def test_the_scan_finds_a_module_first_required_in_a_worker(tmp_path: Path) -> None:
    lua = tmp_path / "zccp"
    (lua / "plugins").mkdir(parents=True)
    (lua / "init.lua").write_text('local a = require "zccp.a"\nlocal _M = {}\n'
                                  'function _M.init()\n    require("zccp.b")\nend\n'
                                  'function _M.later()\n    return require("zccp.c")\nend\nreturn _M\n')
    for name in ("a", "b", "c", "d", "e"):
        (lua / f"{name}.lua").write_text("return {}\n")
    (lua / "plugins" / "p.lua").write_text('local e = require "zccp.e"\nreturn {}\n')
    conf = tmp_path / "site.conf"
    conf.write_text('init_by_lua_block {\n    require("zccp.init").init()\n}\n'
                    'location / {\n    content_by_lua_block { require("zccp.d").serve()\n}\n'
                    '    log_by_lua_block { require("zccp.a").log()\n}\n}\n')
    assert not_loaded_at_init(lua, [conf], plugins=True) == [
        "zccp.c: required by zccp/init.lua (inside a function), not loaded at init",
        "zccp.d: required by site.conf: content_by_lua, not loaded at init",
    ]


def test_the_gateway_nginx_loads_every_module_at_init() -> None:
    confs = sorted((REPO / "nginx").glob("zccp_*.conf")) + [REPO / "nginx" / "nginx.conf"]
    assert not_loaded_at_init(REPO / "lua" / "zccp", confs, plugins=True) == []


def test_the_front_tier_loads_every_module_at_init() -> None:
    assert not_loaded_at_init(REPO / "lua" / "zccp", [REPO / "nginx" / "front.conf"], plugins=False) == []
