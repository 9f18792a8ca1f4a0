"""How zccp.core.pipeline builds the chain (run here by a standalone LuaJIT with a stub
ngx, as bench/plugins_cost.lua does): no chain is refused (the default lives only in
engine/zccp/config/plugins.py), a plugin whose _active says false is in no phase, and an
_active that raises refuses the chain (fails closed) naming the file."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from zccp.config.paths import lua_dir

STUB = """
package.path = "{lua}/?.lua;" .. package.path
local stub = setmetatable({{}}, {{ __index = function() return function() end end }})
ngx = setmetatable({{ ERR = 4, WARN = 5, shared = {{}}, header = {{}}, var = {{}}, socket = {{ tcp = stub }},
                     worker = stub, timer = stub, config = stub }}, {{ __index = stub }})
local p = require "zccp.core.pipeline"
local out = {{}}
out.no_chain = select(2, pcall(p.init, {{}}))
out.no_opts = select(2, pcall(p.init, nil))
calls = {{}}
out.broken = select(2, pcall(p.init, {{ chain = {{ "on", "off", "broken" }}, dir = "{dir}" }}))
local loaded, errs = p.init({{ chain = {{ "on", "off" }}, dir = "{dir}" }})
out.loaded = {{}}
for _, l in ipairs(loaded) do out.loaded[#out.loaded + 1] = {{ l.name, l.active, #l.phases }} end
out.errors = {{}}
for _, e in ipairs(errs) do out.errors[#out.errors + 1] = e.plugin end
p.run("prepare", {{}})
out.calls = calls
print(require("cjson").encode(out))
"""

PLUGINS = {
    "on": 'local _M = {name = "on"}\nfunction _M._active() return true end\n'
          'function _M.prepare() calls[#calls + 1] = "on" end\nreturn _M\n',
    "off": 'local _M = {name = "off"}\nfunction _M._active() return false end\n'
           'function _M.prepare() calls[#calls + 1] = "off" end\nreturn _M\n',
    "broken": 'local _M = {name = "broken"}\nfunction _M._active() error("no way") end\n'
              'function _M.prepare() calls[#calls + 1] = "broken" end\nreturn _M\n',
}


def test_the_chain_is_built_from_the_rendered_list_and_leaves_inactive_plugins_out(tmp_path: Path) -> None:
    for name, src in PLUGINS.items():
        (tmp_path / f"{name}.lua").write_text(src)
    script = STUB.format(lua=lua_dir(), dir=tmp_path)
    out = json.loads(subprocess.run(["luajit", "-e", script], capture_output=True, text=True,
                                    check=True).stdout)
    for refused in (out["no_chain"], out["no_opts"]):
        assert "no plugins.chain" in refused
    assert "broken.lua: _active:" in out["broken"] and "no way" in out["broken"]
    assert out["loaded"] == [["on", True, 1], ["off", False, 0]]
    assert not out["errors"]   # {}: cjson writes an empty table as an object
    assert out["calls"] == ["on"]   # only the active plugin's phase ran


SCHEMA = """
package.path = "{lua}/?.lua;" .. package.path
local load = require "zccp.core.plugin_load"
local mod = {{ name = "p", schema = {{
    words = {{ type = "array", items = "string", required = true }},
    mode = {{ type = "string", enum = {{ "a", "b" }}, default = "a" }},
    tags = {{ type = "map", values = "number" }},
    n = {{ type = "integer", default = 3 }},
}} }}
local function try(conf)
    local c, err = load.settings(mod, conf, "p.lua")
    return c or err
end
local out = {{
    ok = try({{ words = {{ "x", "y" }}, tags = {{ t = 1.5 }} }}),
    unknown = try({{ words = {{}}, wrods = 1 }}),
    missing = try({{}}),
    enum = try({{ words = {{}}, mode = "c" }}),
    item = try({{ words = {{ 1 }} }}),
    integer = try({{ words = {{}}, n = 1.5 }}),
    no_schema = select(2, load.settings({{ name = "q" }}, {{ k = 1 }}, "q.lua")),
    order = load.order({{ {{ name = "a", after = {{ "b" }} }}, {{ name = "b" }} }}, {{ "a.lua", "b.lua" }}),
    in_order = load.order({{ {{ name = "b" }}, {{ name = "a", after = {{ "b" }} }} }}, {{ "b.lua", "a.lua" }}) or "ok",
}}
print(require("cjson").encode(out))
"""


def test_settings_are_checked_against_the_schema_and_the_chain_against_the_declared_order() -> None:
    out = json.loads(subprocess.run(["luajit", "-e", SCHEMA.format(lua=lua_dir())], capture_output=True, text=True,
                                    check=True).stdout)
    assert out["ok"] == {"words": ["x", "y"], "tags": {"t": 1.5}, "mode": "a", "n": 3}   # defaults filled in
    assert out["unknown"] == "p.lua: plugins.settings.p.wrods: unknown setting (known: mode, n, tags, words)"
    assert out["missing"] == "p.lua: plugins.settings.p.words: required"
    assert out["enum"] == "p.lua: plugins.settings.p.mode: c is not one of a, b"
    assert out["item"] == "p.lua: plugins.settings.p.words.1: expected string, got 1"
    assert out["integer"] == "p.lua: plugins.settings.p.n: expected integer, got 1.5"
    assert "q takes no settings" in out["no_schema"]
    assert out["order"].startswith("a.lua: a must come after b") and out["in_order"] == "ok"
