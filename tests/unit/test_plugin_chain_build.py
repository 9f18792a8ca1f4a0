"""How zccp.core.pipeline builds the chain (run here by a standalone LuaJIT with a stub
ngx, as bench/plugins_cost.lua does): no chain is refused (the default lives only in
engine/zccp/plugins_config.py), a plugin whose _active says false is in no phase, and an
_active that raises refuses the chain (fails closed) naming the file."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from zccp.paths import lua_dir

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
