"""The rooms of lua/zccp (docs/ARCHITECTURE.md, docs/plugins.md): few files at the top, a
core that calls no plugin, one home for a request's state. Each rule is read from the
source, as a reviewer would; the second test proves the scan on a made-up tree."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.checkout import REPO

LUA = REPO / "lua" / "zccp"
TOP_MAX = 8
# The loader finds plugins by name; nothing else outside plugins/ may require one.
LOADER = {Path("core/plugin_load.lua")}
REQUIRE_PLUGIN = re.compile(r"""require\s*\(?\s*["']zccp\.plugins\.""")
# Per-request state lives on r (ngx.ctx.zccp holds r itself for the response and log phases).
CTX_FIELD = re.compile(r"ngx\.ctx\.zccp_\w+")


def _code(line: str) -> str:
    return line.split("--", 1)[0]


def violations(root: Path) -> list[str]:
    out = []
    top = sorted(p.name for p in root.glob("*.lua"))
    if len(top) > TOP_MAX:
        out.append(f"{len(top)} files at the top of {root.name}/ (at most {TOP_MAX}): {', '.join(top)}")
    for path in sorted(root.rglob("*.lua")):
        rel = path.relative_to(root)
        in_plugins = rel.parts[0] == "plugins"
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = _code(line)
            if not in_plugins and rel not in LOADER and REQUIRE_PLUGIN.search(code):
                out.append(f"{rel}:{n}: requires a plugin's module outside plugins/")
            if CTX_FIELD.search(code):
                out.append(f"{rel}:{n}: per-request state in ngx.ctx beside r")
    return out


def test_the_scan_finds_each_kind_of_violation(tmp_path: Path) -> None:
    root = tmp_path / "zccp"
    (root / "core").mkdir(parents=True)
    (root / "plugins" / "l1").mkdir(parents=True)
    for i in range(TOP_MAX + 1):
        (root / f"m{i}.lua").write_text("return {}\n")
    (root / "core" / "relay.lua").write_text('local mark = require "zccp.plugins.limits.mark"\n'
                                             "ngx.ctx.zccp_limits = {}\n"
                                             '-- require "zccp.plugins.l1" in a comment is no require\n')
    (root / "plugins" / "l1.lua").write_text('local cache = require("zccp.plugins.l1.cache")\n')
    (root / "core" / "plugin_load.lua").write_text('local ok = pcall(require, "zccp.plugins." .. name)\n'
                                                   'local m = require "zccp.plugins.x"\n')
    got = violations(root)
    assert got[0].startswith(f"{TOP_MAX + 1} files at the top")
    assert got[1:] == ["core/relay.lua:1: requires a plugin's module outside plugins/",
                       "core/relay.lua:2: per-request state in ngx.ctx beside r"]


def test_lua_zccp_keeps_its_rooms() -> None:
    assert violations(LUA) == []
    # each built-in plugin with helpers has them in its own folder, beside its entry file
    for folder in (p for p in (LUA / "plugins").iterdir() if p.is_dir()):
        assert (LUA / "plugins" / f"{folder.name}.lua").is_file(), folder
