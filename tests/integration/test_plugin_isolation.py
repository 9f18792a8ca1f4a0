"""A plugin's failure stays with it, through the real nginx, engine and Redis: a plugin
placed before limits that raises in any phase ends only its request (a 500 with nothing
after it), and the built-ins that meter, settle and release still run for it (the request
counted, its usage line written with the engine's tokens when it had any, no slot or lease
left); and a plugin cannot forge the usage line's own fields, whose values are written as
valid UTF-8 whatever bytes a header holds."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

from tests.support.cache_requests import NULL, metric, metric_samples
from tests.support.keys_helpers import keys_cli, status

REPO = Path(__file__).resolve().parents[2]

# Raises in the phase the x-boom header names; placed before limits.
BOOM = '''local _M = { name = "boom", before = { "limits" } }
local function maybe(p)
    if ngx.var.http_x_boom == p then error("boom in " .. p) end
end
for _, p in ipairs({ "access", "prepare", "keys", "route", "filled", "headers", "relayed" }) do
    _M[p] = function() maybe(p) end
end
return _M
'''
# Tries to write the line's own "tenant" field; says what it was told in a header.
FORGE = '''local usage_fields = require "zccp.lib.usage_fields"
local _M = { name = "forge", after = { "limits" } }
function _M.prepare(r)
    local ok, err = usage_fields.add(r, "tenant", "evil")
    ngx.header["X-Forge"] = ok and "written" or err
end
return _M
'''
PHASES = ("access", "prepare", "keys", "route", "filled", "headers", "relayed")


def usage_lines(path: Path, n: int) -> list[dict]:
    lines: list[dict] = []
    for _ in range(50):   # the lines are written by the limits flush (every 50 ms)
        raw = path.read_bytes() if path.exists() else b""
        lines = [json.loads(x.decode("utf-8")) for x in raw.splitlines()]   # valid UTF-8, or this raises
        if len(lines) >= n:
            break
        time.sleep(0.1)
    return lines


def test_a_raise_in_any_phase_before_limits_is_still_metered_and_settled(make_stack, tmp_path):
    d = tmp_path / "plugins"
    d.mkdir()
    (d / "boom.lua").write_text(BOOM)
    (d / "forge.lua").write_text(FORGE)
    shutil.copy(REPO / "examples" / "plugins" / "tag.lua", d / "tag.lua")
    s = make_stack({"model": NULL, "auth": {"mode": "keys", "cache_ttl_s": 1, "negative_ttl_s": 1},
                    "plugins": {"add": [{"name": "boom", "after": "auth"}, {"name": "forge", "after": "limits"},
                                        {"name": "tag", "after": "limits"}], "dir": str(d)}}, with_redis=True)
    k = keys_cli(s, "create", "--tenant", "acme")["key"]
    body = {"model": "zccp-tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "phase by phase"}]}
    counted0 = sum(metric_samples(s, "zccp_nginx_requests_total"))
    for p in PHASES:
        r = status(s, "anthropic", body, x_api_key=k, x_boom=p, cache_control="no-store")
        if p == "relayed":   # after the relay the answer is out: it stands, the raise is counted
            assert r.status_code == 200, r.text
            continue
        # the request ends with its 500 and nothing after it (headers: before the engine is rung)
        assert r.status_code == 500 and r.json()["error"]["message"].endswith("(plugin boom)"), (p, r.text)
    assert sum(metric_samples(s, "zccp_nginx_plugin_errors_total")) == len(PHASES)
    for _ in range(50):
        if sum(metric_samples(s, "zccp_nginx_requests_total")) - counted0 == len(PHASES):
            break
        time.sleep(0.1)
    assert sum(metric_samples(s, "zccp_nginx_requests_total")) - counted0 == len(PHASES)   # every one metered
    # settled: a line for each request limits admitted (keys on), with the engine's tokens
    # for the one whose relayed phase raised; none left holding a slot or a lease
    lines = usage_lines(Path(s.cfg.auth.usage_log), 5)
    assert [x["status"] for x in lines] == [500, 500, 500, 500, 200], lines
    assert lines[-1]["output_tokens"] > 0, lines[-1]
    s.assert_no_leaks()
    # the usage line's own fields cannot be forged; a header's raw bytes are written as UTF-8
    r = status(s, "anthropic", body, x_api_key=k, x_team=b"caf\xe9 \xff", cache_control="no-store")
    assert r.status_code == 200 and "the usage line's own" in r.headers["x-forge"], dict(r.headers)
    last = usage_lines(Path(s.cfg.auth.usage_log), 6)[-1]
    assert last["tenant"] == "acme" and last["team"] == "caf\ufffd \ufffd", last
    raw = Path(s.cfg.auth.usage_log).read_bytes().splitlines()[-1]
    assert raw.count(b'"tenant"') == 1, raw


# In the middle of the chain (after auth, before limits): answers by itself (DONE) in prepare
# or raises in relayed and log, as the x-mid header says.
MID = '''local pipeline = require "zccp.core.pipeline"
local _M = { name = "mid" }
function _M.prepare(r)
    if ngx.var.http_x_mid == "done" then
        return pipeline.refuse(r, 403, "permission_error", "x-mid: mid answers this one")
    end
end
function _M.relayed() if ngx.var.http_x_mid == "raise" then error("mid raised in relayed") end end
function _M.log() if ngx.var.http_x_mid == "raise" then error("mid raised in log") end end
return _M
'''
# Last in the chain: what it saw, in the response header and in its log line.
TAIL = '''local _M = { name = "tail" }
function _M.prepare(r) r.tail_prepared = true end
function _M.relayed(r) r.tail_relayed = true end
function _M.response(r) ngx.header["X-Tail"] = r.tail_prepared and "prepared" or "skipped" end
function _M.log(r)
    ngx.log(ngx.WARN, "zccp-test tail: ", r.request_id, " relayed=", tostring(r.tail_relayed == true))
end
return _M
'''


def test_a_plugin_in_the_middle_that_raises_or_answers_over_hundreds_of_requests(make_stack, tmp_path):
    """Enough requests that LuaJIT has compiled the phases (the runner's segments): a raise
    in the middle of relayed and log is counted and every plugin after it still runs
    (limits settles, the last plugin runs its relayed and log); a DONE in the middle of
    prepare ends the chain there (the plugins after it skipped, nothing admitted)."""
    d = tmp_path / "plugins"
    d.mkdir()
    (d / "mid.lua").write_text(MID)
    (d / "tail.lua").write_text(TAIL)
    s = make_stack({"model": NULL, "auth": {"mode": "keys", "cache_ttl_s": 1, "negative_ttl_s": 1},
                    "plugins": {"add": [{"name": "mid", "after": "auth"}, {"name": "tail", "after": "usage"}],
                                "dir": str(d)}}, with_redis=True)
    k = keys_cli(s, "create", "--tenant", "acme", "--rpm", "100000", "--otpm", "10000000")["key"]
    body = {"model": "zccp-tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "in the middle"}]}
    kinds = ("plain", "raise", "done")
    n = 330
    rids: dict[str, str] = {}
    with s.client() as c:
        for i in range(n):
            kind = kinds[i % 3]
            r = c.post("/v1/messages", json=body, headers={"x-api-key": k, "x-mid": kind, "cache-control": "no-store"})
            if kind == "done":
                assert r.status_code == 403 and r.json()["error"]["message"].startswith("x-mid:"), (i, r.text)
                assert r.headers["x-tail"] == "skipped", i   # prepare stopped at mid; response ran every plugin
            else:   # a raise after the relay: the answer stands
                assert r.status_code == 200, (i, r.text)
                assert r.headers["x-tail"] == "prepared", i
                assert "anthropic-ratelimit-requests-limit" in r.headers, dict(r.headers)
            rids[r.headers["x-request-id"]] = kind
    raises = sum(1 for i in range(n) if kinds[i % 3] == "raise")
    tail: dict[str, str] = {}
    for _ in range(100):   # the log phase runs after each answer is out
        tail = dict(x.split(" relayed=") for x in re.findall(r"zccp-test tail: (\S+ relayed=\w+)", s.error_log()))
        if len(tail) >= n:
            break
        time.sleep(0.1)
    assert set(tail) == set(rids)   # every request's log phase reached the last plugin
    for rid, kind in rids.items():   # relayed too, after mid's raise there
        assert tail[rid] == ("false" if kind == "done" else "true"), (rid, kind)
    assert metric(s, "zccp_nginx_plugin_errors_total", plugin="mid") == 2 * raises   # relayed and log
    # limits (after mid) admitted and settled every request that reached it, raised or not
    lines = usage_lines(Path(s.cfg.auth.usage_log), n - n // 3)
    assert len(lines) == n - n // 3 and {x["status"] for x in lines} == {200}, lines[-3:]
    assert all(x["output_tokens"] > 0 for x in lines)
    s.assert_no_leaks()
