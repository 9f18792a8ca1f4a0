"""The plugin chain (config.yaml plugins:, docs/plugins.md) through the real nginx and
engine: the shipped example plugins and operators' plugins from a temporary directory, in
order and by phase; a refusal from a plugin in both APIs' shapes and over HTTP/2; a plugin
that raises (that request's 500, the next one fine, counted); a plugin that fails to load
on reload (refused with its file and line, the last good copy stays, /health names it); a
client gone while a plugin waits is never sent to the engine."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.cache_requests import NULL, metric, metric_samples
from tests.support.h2conn import H2Conn
from tests.support.harness import anthropic_body, dumps
from tests.support.keys_helpers import keys_cli, status
from zccp.config.plugins import BUILTIN as BUILTIN_CHAIN

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "plugins"
A = {"max_tokens": 4, "model": "model-a"}   # engine a serves model-a, b model-b
BUILTIN = list(BUILTIN_CHAIN)

# Records name:phase into the request, and answers it all in X-Trace (headers phase).
TRACE = '''local _M = {{ name = "{name}" }}
local function add(r, p)
    r.trace = (r.trace and r.trace .. "," or "") .. "{name}:" .. p
end
function _M.access(r) add(r, "access") end
function _M.prepare(r) add(r, "prepare") end
function _M.keys(r) add(r, "keys") end
function _M.route(r) add(r, "route") end
function _M.filled(r) add(r, "filled") end
function _M.headers(r) add(r, "headers"); ngx.header["X-Trace"] = r.trace end
return _M
'''
# Refuses a body that says BLOCKME (403, naming the field); raises on one that says BOOM.
GATE = '''local pipeline = require "zccp.core.pipeline"
local _M = { name = "gate", schema = { word = { type = "string", required = true } } }
function _M.prepare(r, conf)
    if r.body and r.body:find("BOOM", 1, true) then
        error("gate exploded")
    end
    if r.body and r.body:find(conf.word, 1, true) then
        return pipeline.refuse(r, 403, "permission_error", "messages: the gate refuses " .. conf.word)
    end
end
return _M
'''


# Waits in prepare, as a plugin's Redis call or lookup would.
SLOW = '''local _M = { name = "slow" }
function _M.prepare(r) ngx.sleep(1.5) end
return _M
'''


def plugin_dir(tmp_path: Path) -> Path:
    d = tmp_path / "plugins"
    d.mkdir()
    for f in EXAMPLES.glob("*.lua"):
        shutil.copy(f, d / f.name)
    (d / "trace_a.lua").write_text(TRACE.format(name="trace_a"))
    (d / "trace_b.lua").write_text(TRACE.format(name="trace_b"))
    (d / "gate.lua").write_text(GATE)
    return d


def reload(s) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zccp.ops.cli", "stack", "reload", "--config", str(s.config_path),
                           "--run-dir", str(s.run_dir)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO / "engine")))


def admin_health(s) -> dict:
    return s.admin_client().get("/health").json()


def test_operator_plugins_order_phases_refusals_errors_and_a_failed_load(make_stack, tmp_path):
    d = plugin_dir(tmp_path)
    chain = ["trace_b", *BUILTIN, "model_hint", "gate", "trace_a"]
    s = make_stack({"model": {"backend": "null"},
                    "engines": [{"name": "a", "model": {"name": "model-a", "null_reply": "from a"}},
                                {"name": "b", "model": {"name": "model-b", "null_reply": "from b"}}],
                    "plugins": {"chain": chain, "dir": str(d), "settings": {"gate": {"word": "BLOCKME"}}}},
                   tls=True)
    in_force = [p["name"] for p in admin_health(s)["plugins"]["chain"]]
    assert in_force == chain and not admin_health(s)["plugins"]["errors"]   # {} or []: nothing refused
    with s.client() as c:
        # order and phases: each phase runs the chain in order, phase after phase
        r = c.post("/v1/messages", json=anthropic_body("trace me", **A))
        assert r.status_code == 200, r.text
        assert r.headers["x-trace"] == ("trace_b:access,trace_a:access,trace_b:prepare,trace_a:prepare,"
                                        "trace_b:keys,trace_a:keys,trace_b:route,trace_a:route,"
                                        "trace_b:filled,trace_a:filled,trace_b:headers,trace_a:headers")
        # one core call refuses in either API's shape
        r = c.post("/v1/messages", json=anthropic_body("please BLOCKME", **A))
        assert r.status_code == 403
        assert r.json() == {"type": "error", "error": {"type": "permission_error",
                                                       "message": "messages: the gate refuses BLOCKME"}}
        r = c.post("/v1/chat/completions", json={"model": "model-a", "max_tokens": 4,
                                                  "messages": [{"role": "user", "content": "BLOCKME"}]})
        assert r.status_code == 403 and r.json()["error"]["message"] == "messages: the gate refuses BLOCKME"
        assert "x-trace" not in r.headers          # the chain stopped at the gate
        # the model hint (examples/plugins/model_hint.lua): an unknown model is the client's 400
        r = c.post("/v1/messages", json=anthropic_body("hinted", **A), headers={"x-model-hint": "nope"})
        assert r.status_code == 400 and "x-model-hint" in r.json()["error"]["message"], r.text
        r = c.post("/v1/messages", json=anthropic_body("hinted", **A),
                   headers={"x-model-hint": "model-b"})
        # the hint, not the body, picked engine b (which refuses the body's model-a itself)
        assert r.headers["x-zccp-engine"] == "b" and "model-a" in r.text, r.text
        r = c.post("/v1/messages", json=anthropic_body("hinted", **A))
        assert r.status_code == 200 and r.headers["x-zccp-engine"] == "a", r.text
        # a plugin that raises: that request's 500, the next is fine, the metric counts it
        before = metric(s, "zccp_nginx_plugin_errors_total", plugin="gate")
        r = c.post("/v1/messages", json=anthropic_body("BOOM", **A))
        assert r.status_code == 500 and r.json()["error"]["type"] == "api_error"
        assert "plugin gate" in r.json()["error"]["message"]
        assert c.post("/v1/messages", json=anthropic_body("after the boom", **A)).status_code == 200
    assert metric(s, "zccp_nginx_plugin_errors_total", plugin="gate") == before + 1
    # over HTTP/2: the same refusal on its stream
    conn = H2Conn(s)
    try:
        st = conn.response(conn.request("/v1/messages", dumps(anthropic_body("BLOCKME", **A))))
        assert st["status"] == 403 and json.loads(st["body"])["error"]["type"] == "permission_error", st
    finally:
        conn.close()
    s.assert_no_leaks()
    # a plugin that no longer loads: `zccp-stack reload` refuses it with file and line before
    # nginx is signalled; a bare HUP keeps its last good copy in force, and /health on the
    # admin listener names it
    (d / "trace_a.lua").write_text('local _M = { name = "trace_a" }\nfunction _M.access(r)\n  return r +\nend\n')
    done = reload(s)
    assert done.returncode == 1 and "trace_a.lua:4:" in done.stderr, done.stderr   # refused: not a clean reload
    assert "not reloaded" in done.stderr and not admin_health(s)["plugins"]["errors"]   # nothing reloaded
    s.hup_nginx()
    health = admin_health(s)
    errs = health["plugins"]["errors"]
    assert [e["plugin"] for e in errs] == ["trace_a"], health   # refused, by name
    assert errs[0]["file"] == str(d / "trace_a.lua") and "trace_a.lua:4:" in errs[0]["message"], errs
    r = s.client().post("/v1/messages", json=anthropic_body("still traced", **A))
    assert r.status_code == 200 and r.headers["x-trace"].endswith("trace_a:headers")


def test_the_tag_plugin_adds_a_field_to_the_usage_record(make_stack, tmp_path):
    d = plugin_dir(tmp_path)
    chain = BUILTIN[:3] + ["tag"] + BUILTIN[3:]
    s = make_stack({"model": NULL, "auth": {"mode": "keys", "cache_ttl_s": 1, "negative_ttl_s": 1},
                    "plugins": {"chain": chain, "dir": str(d)}}, with_redis=True)
    k = keys_cli(s, "create", "--tenant", "acme")["key"]
    body = {"model": "zccp-tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "tag me"}]}
    assert status(s, "anthropic", body, x_api_key=k, x_team="search").status_code == 200
    assert status(s, "anthropic", body, x_api_key=k).status_code == 200
    path = Path(s.cfg.auth.usage_log)
    for _ in range(50):   # the lines are written by the limits flush (every 50 ms)
        lines = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
        if len(lines) >= 2:
            break
        time.sleep(0.1)
    assert [x.get("team") for x in lines if x["tenant"] == "acme"] == ["search", None], lines


def test_a_chain_naming_an_unknown_plugin_is_refused_by_name(tmp_path):
    from zccp.config import ConfigError, parse_config
    try:
        parse_config({"plugins": {"chain": ["auth", "nosuch"], "dir": str(tmp_path)}}, "c.yaml")
    except ConfigError as exc:
        assert "plugins.chain[1]: nosuch is not a built-in plugin" in str(exc)
    else:
        raise AssertionError("accepted")


def test_without_ratelimit_headers_admitted_answers_go_without_them_and_429s_keep_them(make_stack):
    chain = [p for p in BUILTIN if p != "ratelimit_headers"]
    assert len(chain) == len(BUILTIN) - 1   # the default chain has it
    s = make_stack({"model": NULL, "auth": {"mode": "keys", "cache_ttl_s": 1, "negative_ttl_s": 1},
                    "plugins": {"chain": chain}}, with_redis=True)
    if time.time() % 60 > 45:   # one minute window for the whole test
        time.sleep(61 - time.time() % 60)
    k = keys_cli(s, "create", "--tenant", "acme", "--rpm", "1")["key"]
    body = {"model": "zccp-tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "quiet"}]}
    r = status(s, "anthropic", body, x_api_key=k, cache_control="no-store")
    assert r.status_code == 200 and not [h for h in r.headers if "ratelimit" in h], dict(r.headers)
    r = status(s, "anthropic", body, x_api_key=k, cache_control="no-store")
    assert r.status_code == 429, r.text
    assert r.headers["anthropic-ratelimit-requests-limit"] == "1"
    assert r.headers["anthropic-ratelimit-requests-remaining"] == "0"


def _sum(s, prefix: str) -> float:
    return sum(metric_samples(s, prefix))   # 0 before the series' first sample


def test_a_client_gone_while_a_plugin_waits_is_not_sent_to_the_engine(make_stack, tmp_path):
    d = tmp_path / "plugins"
    d.mkdir()
    (d / "slow.lua").write_text(SLOW)
    s = make_stack({"model": {"backend": "null"}, "plugins": {"chain": [*BUILTIN, "slow"], "dir": str(d)}})
    engine0, nginx0 = _sum(s, "zccp_engine_requests_total"), _sum(s, "zccp_nginx_requests_total")
    body = dumps(anthropic_body("a question nobody waits for"))
    host, port = s.cfg.server.listen.rsplit(":", 1)
    conn = socket.create_connection((host, int(port)), timeout=10)
    conn.sendall((f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
    time.sleep(0.3)   # the request is in the plugin's wait
    conn.close()
    deadline = time.monotonic() + 10
    while _sum(s, "zccp_nginx_requests_total") == nginx0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _sum(s, "zccp_nginx_requests_total") == nginx0 + 1   # its log phase ran
    time.sleep(2)         # past the plugin's wait: had the request gone on, the engine has it now
    assert _sum(s, "zccp_engine_requests_total") == engine0
    assert _sum(s, "zccp_engine_abandoned_total") == 0
    s.assert_no_leaks()
    r = s.client().post("/v1/messages", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert _sum(s, "zccp_engine_requests_total") == engine0 + 1
