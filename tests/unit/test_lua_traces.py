"""One rule of the request path's Lua (issue 30, a hot path that compiles; docs/plugins.md):
no function of lua/zccp ends in a tail call to a built-in (`return ffi_cast(...)`,
`return str_sub(...)`). Called from code LuaJIT does not compile, a small function becomes
the root of its own trace, and such a trace cannot return through a built-in's tail call:
LuaJIT gives it up ("leaving loop in root trace") and tries again until it blacklists the
function. `local p = ffi_cast(...) return p` compiles. The first test shows that on the
LuaJIT installed here (Debian's luajit2, the library nginx's Lua module loads); the second
proves the scan on a made-up module; the last finds every such tail call in lua/zccp."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.checkout import REPO

LIBS = ("ffi", "string", "math", "bit", "table")
BASE = {"tonumber", "tostring", "type", "select", "rawget", "unpack", "next", "setmetatable",
        "getmetatable", "rawequal", "assert"}
ALIAS = re.compile(r"^local\s+([\w\s,]+?)\s*=\s*(.+?)\s*(--.*)?$")
TAIL = re.compile(r"^\s*return\s+([\w.]+)\((.*)\)\s*(--.*)?$")

PROBE = """
local ffi = require "ffi"
local ffi_cast, str_sub = ffi.cast, string.sub
local buf = ffi.new("uint8_t[64]")
local function tail_cast(i) return ffi_cast("uint8_t *", buf + i) end
local function local_cast(i) local p = ffi_cast("uint8_t *", buf + i) return p end
local function tail_sub(s, i) return str_sub(s, i, i + 3) end
local function local_sub(s, i) local r = str_sub(s, i, i + 3) return r end
local function interpreted(f, a, b) return f(a, b) end
jit.off(interpreted)   -- the caller LuaJIT does not compile: f becomes a trace's root
require("jit.v").on("/dev/stdout")
for i = 1, 2000 do interpreted(tail_cast, i % 8) end
for i = 1, 2000 do interpreted(local_cast, i % 8) end
for i = 1, 2000 do interpreted(tail_sub, "abcdefghijkl", i % 8 + 1) end
for i = 1, 2000 do interpreted(local_sub, "abcdefghijkl", i % 8 + 1) end
"""


def _builtin(expr: str) -> bool:
    expr = expr.strip()
    return expr in BASE or expr.startswith(tuple(lib + "." for lib in LIBS))


def _one_call(args: str) -> bool:
    """Whether `f(` + args + `)` is one call, its last `)` closing its first `(`."""
    depth = 0
    for ch in args:
        depth += (ch == "(") - (ch == ")")
        if depth < 0:
            return False
    return depth == 0


def tail_calls_to_builtins(root: Path, base: Path = REPO) -> list[str]:
    """file:line: text of every line under root that is `return f(...)`, f a built-in or
    a local alias of one (the modules' style: one statement per line)."""
    found = []
    for path in sorted(root.rglob("*.lua")):
        lines = path.read_text().splitlines()
        aliases = set()
        for line in lines:
            m = ALIAS.match(line)
            if m:
                for name, expr in zip(m.group(1).split(","), m.group(2).split(","), strict=False):   # local a, b = f()
                    if _builtin(expr):
                        aliases.add(name.strip())
        for no, line in enumerate(lines, 1):
            m = TAIL.match(line)
            if m and _one_call(m.group(2)) and (_builtin(m.group(1)) or m.group(1) in aliases):
                found.append(f"{path.relative_to(base)}:{no}: {line.strip()}")
    return found


@pytest.mark.skipif(shutil.which("luajit") is None, reason="luajit (Debian's luajit2) not installed")
def test_a_trace_rooted_in_a_function_cannot_return_through_a_tail_call_to_a_builtin(tmp_path: Path) -> None:
    probe = tmp_path / "probe.lua"
    probe.write_text(PROBE)
    out = subprocess.run(["luajit", str(probe)], capture_output=True, text=True, timeout=60, check=True).stdout
    assert re.search(r"TRACE --- probe\.lua:5 -- leaving loop in root trace at ffi\.cast", out), out
    assert re.search(r"TRACE --- probe\.lua:7 -- leaving loop in root trace at string\.sub", out), out
    assert re.search(r"TRACE +\d+ probe\.lua:6 return", out), out   # compiled
    assert re.search(r"TRACE +\d+ probe\.lua:8 return", out), out
    assert not re.search(r"TRACE --- probe\.lua:[68] ", out), out


def test_the_scan_finds_a_tail_call_to_a_builtin_by_its_alias(tmp_path: Path) -> None:
    mod = tmp_path / "m.lua"
    mod.write_text('local ffi = require "ffi"\nlocal ffi_string, concat = ffi.string, table.concat\n'
                   "local function a(p, n)\n    return ffi_string(p, n)\nend\n"
                   "local function b(p, n)\n    return ffi_string(p, n) .. ffi_string(p, 1)\nend\n"
                   "local function c(t)\n    return concat(t)   -- why\nend\n"
                   "local function d(x)\n    return other(x)\nend\n")
    found = tail_calls_to_builtins(tmp_path, tmp_path)
    # a's tail call and c's (through its alias, before a comment); not b's concatenation,
    # not d's call of a function that is not a built-in
    assert found == ["m.lua:4: return ffi_string(p, n)", "m.lua:10: return concat(t)   -- why"], found


def test_no_lua_module_tail_calls_a_builtin() -> None:
    found = tail_calls_to_builtins(REPO / "lua" / "zccp")
    assert found == [], "end these with `local x = f(...) return x` (docs/plugins.md):\n" + "\n".join(found)
