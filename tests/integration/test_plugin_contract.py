"""The plugin contract (docs/plugins.md) through the real nginx, engine and Redis: a plugin
inserted by position (plugins.add), its settings against its _M.schema (a list setting;
an unknown key refused, named by config file and key under `zccp-stack up`), its declared
order (a violation refused with both names), the response phase on an L1 hit, a refusal
and an error, r's parsed request on both APIs and all four endpoints (decoded once for two
plugins), `zccp-stack reload` applying a changed chain (one without l1 never touches L1),
and failing closed: a plugin that never loaded refuses the start and the reload (exit
status, file and line) and, under a bare HUP, makes its requests a 503 naming it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.cache_requests import NULL, metric_samples
from tests.support.harness import Stack, StackProcess, anthropic_body
from zccp.config.plugins import BUILTIN

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "plugins"

# Sets X-Stamp on every answer (the response phase).
STAMP = '''local _M = { name = "stamp", schema = { value = { type = "string", default = "on" } } }
function _M.response(r, conf) ngx.header["X-Stamp"] = conf.value .. ":" .. tostring(ngx.status) end
return _M
'''
# Two plugins reading the parsed request: the same decoded table for both (decoded once),
# and the prompt's text and model in headers.
PEEK_A = '''local _M = { name = "peek_a" }
function _M.wants_body() return true end
function _M.prepare(r) r.peek_doc = r:body_json() end
return _M
'''
PEEK_B = '''local _M = { name = "peek_b", after = { "peek_a" } }
function _M.prepare(r)
    local doc = r:body_json()
    ngx.header["X-Same-Doc"] = (doc ~= nil and rawequal(doc, r.peek_doc)) and "1" or "0"
    ngx.header["X-Prompt"] = (r:prompt_text():gsub("\\n", "|"))
    ngx.header["X-Model"] = r:model_name() or "-"
end
return _M
'''
# A syntax error on line 3: a plugin that never loaded.
BROKEN = 'local _M = { name = "{name}" }\nfunction _M.access(r)\n  return r +\nend\nreturn _M\n'


def plugin_dir(tmp_path: Path) -> Path:
    d = tmp_path / "plugins"
    d.mkdir()
    (d / "blocklist.lua").write_text((EXAMPLES / "blocklist.lua").read_text())
    (d / "stamp.lua").write_text(STAMP)
    (d / "peek_a.lua").write_text(PEEK_A)
    (d / "peek_b.lua").write_text(PEEK_B)
    return d


def reload(s) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zccp.ops.cli", "stack", "reload", "--config", str(s.config_path),
                           "--run-dir", str(s.run_dir)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO / "engine")))


def rewrite_plugins(s, plugins: dict) -> None:
    raw = yaml.safe_load(s.config_path.read_text())
    raw["plugins"] = plugins
    s.config_path.write_text(yaml.safe_dump(raw))


def post(s, path: str, body: dict, **headers) -> httpx.Response:
    return s.client().post(path, json=body, headers={k.replace("_", "-"): v for k, v in headers.items()})


def l1_lookups(s) -> float:
    return sum(metric_samples(s, "zccp_nginx_l1_total"))


def cache_layer(r: httpx.Response) -> str:
    return f'{r.headers["x-zccp-cache"]}/{r.headers.get("x-zccp-cache-layer", "-")}'


ENDPOINTS = [   # path, body, the prompt's text as r:prompt_text() joins it
    ("/v1/messages", {"model": "zccp-tiny", "max_tokens": 4, "system": "be brief",
                      "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]},
                                   {"role": "assistant", "content": [{"type": "tool_use", "id": "t1",
                                                                      "name": "f", "input": {}}]},
                                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                                 "content": "tool says 42"}]}]},
     "be brief|hello|tool says 42"),
    ("/v1/chat/completions", {"model": "zccp-tiny", "max_tokens": 4,
                              "messages": [{"role": "system", "content": "sys"},
                                           {"role": "user", "content": "hi there"}]}, "sys|hi there"),
    ("/v1/completions", {"model": "zccp-tiny", "max_tokens": 4, "prompt": "once upon"}, "once upon"),
    ("/v1/responses", {"model": "zccp-tiny", "max_output_tokens": 16, "instructions": "terse",
                       "input": [{"role": "user", "content": [{"type": "input_text", "text": "ask"}]}]},
     "terse|ask"),
]


def test_the_contract_through_nginx_then_reload_and_a_bare_hup(make_stack, tmp_path):
    d = plugin_dir(tmp_path)
    add = [{"name": "stamp", "after": "metrics"}, {"name": "blocklist", "before": "l1"},
           {"name": "peek_a", "after": "router"}, {"name": "peek_b", "after": "peek_a"}]
    s = make_stack({"model": NULL, "cache": {"ttl_s": 600},
                    "plugins": {"add": add, "dir": str(d),
                                "settings": {"blocklist": {"words": ["forbidden", "Secret Plan"]},
                                             "stamp": {"value": "v1"}}}}, with_redis=True)
    health = s.admin_client().get("/health").json()["plugins"]
    names = [p["name"] for p in health["chain"]]
    # inserted by position, the built-ins not re-listed
    assert names == ["metrics", "stamp", "auth", "limits", "ratelimit_headers", "blocklist", "l1", "fingerprint",
                     "tenancy", "router", "peek_a", "peek_b", "usage"], names
    assert list(BUILTIN) == [n for n in names if n not in ("stamp", "blocklist", "peek_a", "peek_b")]
    assert not health["errors"]
    # a list setting: either word refuses, on either API; the response phase stamps the refusal
    r = post(s, "/v1/messages", anthropic_body("the forbidden word"))
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error", r.text
    assert r.headers["x-stamp"] == "v1:403"
    r = post(s, "/v1/chat/completions", {"model": "zccp-tiny", "max_tokens": 4,
                                         "messages": [{"role": "user", "content": "our SECRET plan"}]})
    assert r.status_code == 403 and "blocked word" in r.json()["error"]["message"], r.text
    # ... an error nginx's core answers (405) ...
    r = s.client().get("/v1/messages")
    assert r.status_code == 405 and r.headers["x-stamp"] == "v1:405"
    # ... and an L1 hit (nothing after l1 runs in prepare on a hit; the response phase does)
    body = anthropic_body("an answer for L1")
    assert cache_layer(post(s, "/v1/messages", body)) == "MISS/-"
    for _ in range(100):
        r = post(s, "/v1/messages", body)
        if cache_layer(r) == "HIT/L1":
            break
        time.sleep(0.02)
    assert cache_layer(r) == "HIT/L1" and r.headers["x-stamp"] == "v1:200", dict(r.headers)
    # r's parsed request on both APIs and every endpoint, one decoded table for both plugins
    for path, req, text in ENDPOINTS:
        r = post(s, path, req, cache_control="no-store")
        assert r.status_code == 200, (path, r.text)
        assert r.headers["x-prompt"] == text and r.headers["x-same-doc"] == "1", (path, dict(r.headers))
        assert r.headers["x-model"] == "zccp-tiny", path
        assert r.headers["x-stamp"] == "v1:200"

    # zccp-stack reload applies a changed chain and settings: l1 out, other words
    chain = [n for n in names if n != "l1"]
    settings = {"blocklist": {"words": ["other"]}, "stamp": {"value": "v2"}}
    rewrite_plugins(s, {"chain": chain, "dir": str(d), "settings": settings})
    done = reload(s)
    assert done.returncode == 0, done.stderr
    assert [p["name"] for p in s.admin_client().get("/health").json()["plugins"]["chain"]] == chain
    r = post(s, "/v1/messages", anthropic_body("the forbidden word"))
    assert r.status_code == 200 and r.headers["x-stamp"] == "v2:200", r.text
    assert post(s, "/v1/messages", anthropic_body("the other word")).status_code == 403
    # the chain without l1 never touches L1: the same request again and again, no lookup
    before = l1_lookups(s)
    for _ in range(3):
        r = post(s, "/v1/messages", body)
        assert r.status_code == 200 and r.headers.get("x-zccp-cache-layer") != "L1", dict(r.headers)
    assert l1_lookups(s) == before

    # a plugin that never loaded: the reload refuses it (exit status, file and line) and the
    # chain in force stays
    (d / "fresh.lua").write_text(BROKEN.replace("{name}", "fresh"))
    rewrite_plugins(s, {"chain": [*chain, "fresh"], "dir": str(d), "settings": settings})
    done = reload(s)
    assert done.returncode == 1 and f"{d / 'fresh.lua'}:4:" in done.stderr, done.stderr
    assert "fresh" not in [p["name"] for p in s.admin_client().get("/health").json()["plugins"]["chain"]]
    assert post(s, "/v1/messages", anthropic_body("still served")).status_code == 200

    # a bare HUP with a plugin that cannot be loaded and has no last good copy: its requests
    # are a 503 naming it, never served without it
    (d / "blocklist.lua").unlink()
    (Path(s.cfg.server.socket_path).parent / "plugins.last_good" / "blocklist.lua").unlink()
    s.hup_nginx()
    h = s.admin_client().get("/health").json()
    assert [e["plugin"] for e in h["plugins"]["errors"]] == ["blocklist"], h["plugins"]
    for path, req, _ in ENDPOINTS[:2]:
        r = post(s, path, req)
        assert r.status_code == 503 and "plugin blocklist is not loaded" in r.text, r.text
        assert r.headers["x-stamp"] == "v2:503"


@pytest.mark.parametrize("case", ["never_loaded", "unknown_key", "order", "builtin_name"])
def test_a_chain_that_cannot_be_in_force_refuses_the_start(make_stack, tmp_path, case):
    d = plugin_dir(tmp_path)
    (d / "ghost.lua").write_text(BROKEN.replace("{name}", "ghost"))
    plugins = {
        "never_loaded": ({"chain": [*BUILTIN, "ghost"]}, f"{d / 'ghost.lua'}:4:"),
        "unknown_key": ({"chain": [*BUILTIN[:4], "blocklist", *BUILTIN[4:]],
                         "settings": {"blocklist": {"words": ["x"], "wrods": ["y"]}}},
                        "plugins.settings.blocklist.wrods: unknown setting (known: status, words)"),
        "order": ({"chain": [*BUILTIN, "blocklist"], "settings": {"blocklist": {"words": ["x"]}}},
                  "blocklist must come before l1"),
        "builtin_name": ({"chain": BUILTIN}, f"{d / 'auth.lua'} takes the built-in plugin auth's name"),
    }[case]
    if case == "builtin_name":
        (d / "auth.lua").write_text('local _M = { name = "auth" }\nreturn _M\n')
    with pytest.raises(Exception) as refused:
        make_stack({"model": NULL, "plugins": {**plugins[0], "dir": str(d)}})
    said = str(refused.value)
    assert plugins[1] in said, said
    if case != "builtin_name":   # that one is config.yaml's refusal, before nginx
        assert "exit status 1" in said, said


def test_zccp_stack_up_names_the_config_file_and_key_of_a_setting_the_schema_refuses(tmp_path):
    d = plugin_dir(tmp_path)
    s = Stack(tmp_path / "s", {"model": NULL, "plugins": {
        "dir": str(d), "add": [{"name": "blocklist", "before": "l1"}],
        "settings": {"blocklist": {"words": ["x"], "wrods": ["y"]}}}})
    up = StackProcess(s).start(wait=False)
    try:
        assert up.proc.wait(120) == 1
    finally:
        up.stop()
    want = (f"{s.config_path}: plugins.settings.blocklist.wrods: unknown setting (known: status, words) "
            f"({d / 'blocklist.lua'}'s schema)")
    assert want in up.text(), up.text()
