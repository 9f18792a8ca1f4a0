"""API keys' Redis layout has one source (lua/zccp/admin/key_layout.lua): nginx requires it
(run here by a standalone LuaJIT), the engine's zccp.config.keystore reads it with the literal
reader, and no other module spells the layout's keys itself."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from zccp.config import keystore
from zccp.config.paths import lua_dir

ENGINE = Path(keystore.__file__).resolve().parent
LAYOUT = lua_dir() / "zccp" / "admin" / "key_layout.lua"

LUA = """
package.path = "{lua}/?.lua;" .. package.path
local t = require "zccp.admin.key_layout"
local names = {{}}
for i, n in ipairs(t.limit_names) do names[i] = string.format("%q", n) end
print(string.format('{{"record": %q, "index": %q, "tenant": %q, "limit_names": [%s]}}',
      t.record, t.index, t.tenant, table.concat(names, ", ")))
"""


def test_nginx_and_the_engine_read_the_same_layout():
    out = subprocess.run(["luajit", "-e", LUA.format(lua=lua_dir())], capture_output=True, text=True,
                         check=True).stdout
    lua = json.loads(out)
    assert lua["record"] == keystore.RECORD and lua["index"] == keystore.INDEX and lua["tenant"] == keystore.TENANT
    assert tuple(lua["limit_names"]) == keystore.LIMIT_NAMES == tuple(f.name for f in
                                                                     keystore.Limits.__dataclass_fields__.values())


def test_the_admin_api_requires_the_layout():
    src = (lua_dir() / "zccp" / "admin" / "keys.lua").read_text()
    assert re.search(r'require "zccp\.admin\.key_layout"', src)
    assert "RECORD = layout.record" in src and "INDEX = layout.index" in src


def test_no_other_module_spells_the_layout():
    spelled = [keystore.RECORD, keystore.INDEX, keystore.TENANT]
    copies = set()
    for root, pattern in ((lua_dir() / "zccp", "*.lua"), (ENGINE, "*.py")):
        for f in root.rglob(pattern):
            if f != LAYOUT and any(s in f.read_text(errors="replace") for s in spelled):
                copies.add(f)
    assert not copies, sorted(map(str, copies))
