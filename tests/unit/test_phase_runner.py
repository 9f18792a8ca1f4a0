"""zccp.core.pipeline's phase runners (zccp.core.phase_runner), run by a standalone LuaJIT
(the one nginx's Lua module loads) with a stub ngx: over 1,200 requests, so LuaJIT has
compiled the phases long before the last, a plugin in the MIDDLE of each phase raises or
answers (DONE) on some requests, and every request's result is checked against the
contract (docs/plugins.md): in prepare (a "run" phase) a raise is that request's 500 and a
DONE ends the chain, the plugins after it skipped; in wants_body ("any") the first true
wins and a raise ends it; in log ("every") a raise is counted and every later plugin still
runs, in order; each raise counted once under its plugin's name. Then the same with
LuaJIT's jit.v on: in the phases run as one segment (prepare, log) no trace aborts where a
plugin returns into the runner (the per-plugin pcall's "return to lower frame"), and the
plugins' code gets traces of its own."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from zccp.config.paths import lua_dir

N = 1200

DRIVER = """
package.path = "{lua}/?.lua;" .. package.path
local stub = setmetatable({{}}, {{ __index = function() return function() end end }})
ngx = setmetatable({{ ERR = 4, WARN = 5, headers_sent = false, shared = {{}}, header = {{}}, var = {{}},
                     socket = {{ tcp = stub }}, worker = stub, timer = stub, config = stub }}, {{ __index = stub }})
errs, sent = {{}}, 0
package.loaded["zccp.lib.metrics"] = {{ plugin_error = function(name) errs[name] = (errs[name] or 0) + 1 end }}
package.loaded["zccp.errors"] = {{ send = function() sent = sent + 1 end }}
local p = require "zccp.core.pipeline"
p.init({{ chain = {{ "first", "mid", "last" }}, dir = "{dir}" }})
if "{jitv}" ~= "" then require("jit.v").on("{jitv}") end
local out = {{}}
-- content_by_lua's request runs under the handler's xpcall; log_by_lua's from C
local function content(r)
    r.wants = p.any("wants_body", r)
    if r.wants ~= p.DONE then
        r.prepared = p.run("prepare", r, "a1")
    end
end
local n = 0
local function request()
    n = n + 1
    local r = {{ api = "anthropic", n = n, seen = {{}} }}
    ngx.ctx.zccp = r
    xpcall(content, debug.traceback, r)
    p.log("anthropic")   -- ngx.ctx.zccp: the stub's ngx.ctx
    out[n] = {{ r.wants == p.DONE and "DONE" or r.wants, r.prepared == p.DONE and "DONE" or false,
               table.concat(r.seen, ","), r.failed or false, r.pipeline_at or false }}
end
ngx.ctx = {{}}
string.gsub(string.rep("x", {n}), "x", function()
    request()
end)
print(require("cjson").encode({{ out = out, errs = errs, sent = sent }}))
"""

# Each adds "name:phase" to r.seen; mid raises or answers in the middle of each phase.
FIRST_LAST = """local _M = {{ name = "{name}" }}
local function add(r, p) r.seen[#r.seen + 1] = "{name}:" .. p end
function _M.wants_body(r) add(r, "w") return false end
function _M.prepare(r, conf, a1) add(r, "p" .. a1) end
function _M.log(r) add(r, "l") end
return _M
"""
MID = """local DONE = require("zccp.core.pipeline").DONE
local _M = { name = "mid" }
local function add(r, p) r.seen[#r.seen + 1] = "mid:" .. p end
function _M.wants_body(r)
    if r.n % 13 == 0 then error("mid raised in wants_body") end
    add(r, "w")
    return r.n % 4 == 0
end
function _M.prepare(r, conf, a1)
    if r.n % 3 == 0 then error("mid raised in prepare") end
    if r.n % 5 == 0 then add(r, "done") return DONE end
    add(r, "p" .. a1)
end
function _M.log(r)
    if r.n % 2 == 0 then error("mid raised in log") end
    add(r, "l")
end
return _M
"""


def expected(n: int) -> tuple[list, dict[str, int]]:
    """Each request's (wants, prepared, seen, failed) by the contract, and mid's raises."""
    rows, raises = [], 0
    for i in range(1, n + 1):
        seen, failed = ["first:w"], False
        if i % 13 == 0:   # any: a raise ends the phase, the request's 500
            wants, failed = "DONE", "mid"
        else:
            seen.append("mid:w")
            wants = i % 4 == 0
            if not wants:   # first and last never want the body
                seen.append("last:w")
        prepared = False
        if wants != "DONE":
            seen.append("first:pa1")
            if i % 3 == 0:
                prepared, failed = "DONE", "mid"
            elif i % 5 == 0:
                prepared = "DONE"
                seen.append("mid:done")
            else:
                seen += ["mid:pa1", "last:pa1"]
        raises += (i % 13 == 0) + (i % 13 != 0 and i % 3 == 0) + (i % 2 == 0)
        seen.append("first:l")
        if i % 2 == 0:
            failed = "mid"
        else:
            seen.append("mid:l")
        seen.append("last:l")   # log runs every plugin: after mid's raise too
        rows.append([wants, prepared, ",".join(seen), failed, False])
    return rows, {"mid": raises}


def run(tmp_path: Path, jitv: str = "") -> dict:
    d = tmp_path / "plugins"
    d.mkdir(exist_ok=True)
    (d / "first.lua").write_text(FIRST_LAST.format(name="first"))
    (d / "last.lua").write_text(FIRST_LAST.format(name="last"))
    (d / "mid.lua").write_text(MID)
    script = DRIVER.format(lua=lua_dir(), dir=d, jitv=jitv, n=N)
    done = subprocess.run(["luajit", "-e", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_raise_or_done_in_the_middle_of_each_phase_over_many_requests(tmp_path: Path) -> None:
    got = run(tmp_path)
    rows, raises = expected(N)
    for i, (g, e) in enumerate(zip(got["out"], rows, strict=True), start=1):
        assert g == e, (i, g, e)
    assert got["errs"] == raises
    # each 500 sent once (a raise in log sends nothing: the answer is out), each DONE of mid
    # answered by mid itself (the stub's refuse is not called: it returned DONE)
    assert got["sent"] == sum(1 for i in range(1, N + 1) if i % 13 == 0 or i % 3 == 0)


def wants_body_lines(src: str) -> set[int]:
    """The lines of a plugin file's wants_body (a phase that keeps one pcall per plugin)."""
    out, inside = set(), False
    for i, line in enumerate(src.splitlines(), start=1):
        starts = line.startswith("function _M.wants_body")
        inside = inside or starts
        if inside:
            out.add(i)
            inside = not (line == "end" or starts and line.endswith(" end"))
    return out


def test_plugins_return_into_compiled_code_not_into_a_pcall(tmp_path: Path) -> None:
    """prepare and log (phases with a stop): no trace aborts where a plugin returns."""
    log = tmp_path / "jitv.txt"
    got = run(tmp_path, str(log))
    assert got["errs"] == expected(N)[1]   # the same answers with jit.v on
    lines = log.read_text().splitlines()
    sources = {"first.lua": FIRST_LAST.format(name="first"), "mid.lua": MID, "last.lua": FIRST_LAST.format(name="last")}
    skip = {f: wants_body_lines(src) for f, src in sources.items()}
    at_plugin = []
    for x in lines:
        m = re.search(r"return to lower frame at (\w+\.lua):(\d+)", x)
        if m and m.group(1) in sources and int(m.group(2)) not in skip[m.group(1)]:
            at_plugin.append(x)
    assert not at_plugin, at_plugin
    # the plugins' own traces complete (start lines without an abort: "[TRACE   3 mid.lua:9 return]")
    traced = [x for x in lines if x.startswith("[TRACE ") and not x.startswith("[TRACE ---")
              and any(f" {p}:" in x for p in sources)]
    assert traced, lines[:50]
