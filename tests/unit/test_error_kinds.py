"""One error-kind table (lua/zccp/error_kinds.lua) for both sides: nginx's zccp.errors
(run here by a standalone LuaJIT) and the engine's codecs render every kind alike."""

from __future__ import annotations

import json
import subprocess

import orjson
import pytest

from zccp.api import codec_for
from zccp.api.errors import KINDS
from zccp.config.paths import lua_dir
from zccp.shared_types import ApiError

MESSAGE = 'a "quoted" message'

LUA = """
package.path = "{lua}/?.lua;" .. package.path
local errors = require "zccp.errors"
local kinds = require "zccp.error_kinds"
local MSG = {msg}
local out = {{}}
for kind in pairs(kinds) do
    out[#out + 1] = kind .. "\\t" .. errors.body("anthropic", kind, MSG) .. "\\t" .. errors.body("openai", kind, MSG)
end
print(table.concat(out, "\\n"))
"""


@pytest.fixture(scope="module")
def lua_bodies() -> dict[str, tuple[dict, dict]]:
    script = LUA.format(lua=lua_dir(), msg=json.dumps(MESSAGE))   # a JSON string is a Lua string here
    out = subprocess.run(["luajit", "-e", script], capture_output=True, text=True, check=True).stdout
    rows = [line.split("\t") for line in out.strip().splitlines()]
    return {kind: (json.loads(a), json.loads(o)) for kind, a, o in rows}


def test_both_sides_know_the_same_kinds(lua_bodies):
    assert set(lua_bodies) == set(KINDS) and "overloaded_error" in KINDS


def test_lua_and_python_render_every_kind_alike(lua_bodies):
    for name, k in KINDS.items():
        err = ApiError(k.status, name, MESSAGE)
        lua_anthropic, lua_openai = lua_bodies[name]
        assert orjson.loads(codec_for("anthropic").render_error(err)) == lua_anthropic, name
        assert orjson.loads(codec_for("openai").render_error(err)) == lua_openai, name
        assert codec_for("anthropic").http_status(err) == k.status
        assert codec_for("openai").http_status(err) == k.openai_status


def test_openai_overload_is_503_with_its_code(lua_bodies):
    assert KINDS["overloaded_error"].openai_status == 503
    assert lua_bodies["overloaded_error"][1]["error"]["code"] == "server_overloaded"
