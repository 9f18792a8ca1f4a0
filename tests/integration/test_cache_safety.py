"""A cache that never serves an answer meant for someone else, through the live gateway:
every must-miss category of docs/fingerprint.md (image and document bytes, tool results,
the next agent step, OpenAI tool-call rounds, masked values across tenants) on both APIs,
the controls that must still hit, the masked-literal guard, tenants, another model,
purge and the L1 verdict nginx will read (meta.cache_ttl_s / cache_scope)."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import time

import httpx
import pytest

from tests.support.cache_requests import (
    ENGINE_ENV,
    CHAT,
    NULL,
    Q,
    REWORDED,
    cache_of,
    eventually,
    metric,
    post,
    req,
    reworded,
    stored,
)
from zccp.transport.abi import CacheReason, ffi
from zccp.ops.stack import free_port


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture
def nstack(make_stack):
    return make_stack({"model": NULL}, with_redis=True)


# ------------------------------------------------------------------------------------- bodies

def image_turn(api, data: bytes, text="What is in this picture?"):
    if api == "anthropic":
        blk = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(data)}}
    else:
        blk = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(data)}}
    return [{"role": "user", "content": [{"type": "text", "text": text}, blk]}]


def document_turn(api, data: bytes):
    if api == "anthropic":
        blk = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": b64(data)}}
    else:
        blk = {"type": "file", "file": {"filename": "report.pdf", "file_data": b64(data)}}
    return [{"role": "user", "content": [{"type": "text", "text": "Summarise this report in three lines."}, blk]}]


def agent(api, results: list[str], args: list[dict] | None = None, then: str | None = None):
    """An agent loop: a task, then one tool round per result (call, result)."""
    args = args or [{"path": f"src/m{i}.py"} for i in range(len(results))]
    msgs: list = [{"role": "user", "content": "Fix the failing test in tests/test_app.py"}]
    for i, (res, arg) in enumerate(zip(results, args, strict=True)):
        if api == "anthropic":
            msgs.append({"role": "assistant", "content": [
                {"type": "text", "text": "Let me read the file."},
                {"type": "tool_use", "id": f"toolu_{i}", "name": "read_file", "input": arg}]})
            msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}",
                                                      "content": res}]})
        else:
            msgs.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{i}", "type": "function",
                 "function": {"name": "read_file", "arguments": json.dumps(arg)}}]})
            msgs.append({"role": "tool", "tool_call_id": f"call_{i}", "content": res})
    if then is not None:
        msgs.append({"role": "assistant", "content": "I read the files."})
        msgs.append({"role": "user", "content": then})
    tools = ([{"name": "read_file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
             if api == "anthropic" else
             [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}])
    return req(api, msgs, tools=tools)


R1 = "def add(a, b):\n    return a - b\n"
R2 = "def test_add():\n    assert add(2, 2) == 4\n"


# ------------------------------------------------------------------------------------- must-miss

@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_must_miss_categories(nstack, api):
    s = nstack
    step2 = agent(api, [R1, R2], [{"path": "src/m0.py"}, {"path": "tests/t.py"}])
    cases = [   # (what, stored first, must miss); each case in a scope of its own (max_tokens)
        ("image bytes", req(api, image_turn(api, b"\x89PNG one picture")),
         req(api, image_turn(api, b"\x89PNG another"))),
        ("document bytes", req(api, document_turn(api, b"%PDF-1.4 report A")),
         req(api, document_turn(api, b"%PDF-1.4 report B"))),
        ("tool_result content", agent(api, [R1]), agent(api, [R1.replace("a - b", "a + b")])),
        ("next agent step", agent(api, [R1]), step2),
        ("tool-call round", agent(api, [R1], [{"path": "src/app.py"}]), agent(api, [R1], [{"path": "src/lib.py"}])),
    ]
    for n, (what, first, second) in enumerate(cases):
        stored(s, api, dict(first, max_tokens=30 + n))
        assert cache_of(s, api, dict(second, max_tokens=30 + n)) == "MISS", what
    # the controls: an identical agent request is an exact HIT, a reworded final question after
    # the same history a NEAR (or HIT)
    assert eventually(s, api, dict(step2, max_tokens=33)) == "HIT"
    stored(s, api, req(api, CHAT))
    assert cache_of(s, api, req(api, REWORDED)) == "NEAR"
    # ... but not after another history
    other = [{"role": "user", "content": "What is the capital of Austria?"}] + REWORDED[1:]
    assert cache_of(s, api, req(api, other)) == "MISS"
    s.assert_no_leaks()


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_masked_values_never_cross_tenants(nstack, api):
    s = nstack
    ann = req(api, [{"role": "user", "content": "Write to ann@north.com about invoice 123456789"}])
    bob = req(api, [{"role": "user", "content": "Write to bob@south.org about invoice 987654321"}])
    stored(s, api, ann, x_api_key="key-ann")
    assert cache_of(s, api, bob, x_api_key="key-bob") == "MISS"
    assert cache_of(s, api, bob, authorization="Bearer key-carol") == "MISS"
    # within one tenant the masked hit is served (the null reply carries no masked value)
    assert cache_of(s, api, bob, x_api_key="key-ann") == "HIT"
    assert cache_of(s, api, bob, authorization="Bearer key-ann") == "HIT"   # the same key, as a bearer token


def test_near_hits_never_cross_tenants_but_exact_unmasked_ones_may(make_stack):
    s = make_stack({"model": NULL, "cache": {"scope": "shared_exact"}}, with_redis=True)   # opt-in
    stored(s, "anthropic", req("anthropic", CHAT), x_api_key="key-a")
    assert cache_of(s, "anthropic", req("anthropic", CHAT), x_api_key="key-b") == "HIT"     # exact, unmasked
    # whitespace variants of the final turn: the same shingles, a certain near-duplicate
    assert cache_of(s, "anthropic", req("anthropic", reworded(Q + " ")), x_api_key="key-b") == "MISS"
    assert cache_of(s, "anthropic", req("anthropic", reworded(Q + "\n"))) == "MISS"          # anonymous
    r = post(s, "anthropic", req("anthropic", reworded(Q + "\t")), x_api_key="key-a")
    assert r.headers["x-zccp-cache"] == "NEAR" and float(r.headers["x-zccp-similarity"]) == 1.0


def test_isolated_scope_shares_nothing_and_global_everything(make_stack):
    iso = make_stack({"model": NULL, "cache": {"scope": "isolated"}}, with_redis=True)
    stored(iso, "anthropic", req("anthropic", CHAT), x_api_key="key-a")
    assert cache_of(iso, "anthropic", req("anthropic", CHAT), x_api_key="key-b") == "MISS"
    assert cache_of(iso, "anthropic", req("anthropic", CHAT), x_api_key="key-a") == "HIT"
    glob = make_stack({"model": NULL, "cache": {"scope": "global"}}, with_redis=True)
    masked = req("anthropic", [{"role": "user", "content": "Status of order #123456789, please"}])
    stored(glob, "anthropic", masked, x_api_key="key-a")
    other = req("anthropic", [{"role": "user", "content": "Status of order #987654321, please"}])
    assert cache_of(glob, "anthropic", other, x_api_key="key-b") == "HIT"


def test_tenant_from_the_body_user_and_from_a_header(make_stack):
    # room in the token array for a prompt past nginx's decode limit
    s = make_stack({"model": NULL, "cache": {"tenant_source": "user"},
                    "shared_memory": {"segment_size_kb": 1536, "tokens_kb": 768}}, with_redis=True)
    a = req("anthropic", [{"role": "user", "content": "Summarise patient_id: P123456789"}],
            metadata={"user_id": "u-1"})
    b = req("anthropic", [{"role": "user", "content": "Summarise patient_id: P555555555"}],
            metadata={"user_id": "u-2"})
    stored(s, "anthropic", a)
    assert cache_of(s, "anthropic", b) == "MISS"
    assert cache_of(s, "anthropic", dict(b, metadata={"user_id": "u-1"})) == "HIT"
    o = req("openai", [{"role": "user", "content": "Summarise patient_id: P123456789"}], user="u-1")
    stored(s, "openai", o)
    assert cache_of(s, "openai", dict(o, user="u-2")) == "MISS"
    # above nginx's decode limit the engine reads the body's user itself: the same rule
    big = "word " * 14000
    a = req("anthropic", [{"role": "user", "content": big + "patient_id: P123456789"}], metadata={"user_id": "u-1"})
    assert len(json.dumps(a)) > 65536
    stored(s, "anthropic", a)
    b = dict(a, messages=[{"role": "user", "content": big + "patient_id: P444444444"}])
    assert cache_of(s, "anthropic", dict(b, metadata={"user_id": "u-2"})) == "MISS"
    assert cache_of(s, "anthropic", dict(b, metadata={"user_id": "u-1"})) == "HIT"
    h = make_stack({"model": NULL, "cache": {"tenant_source": "header", "tenant_header": "X-Team"}}, with_redis=True)
    m = req("anthropic", [{"role": "user", "content": "Summarise patient_id: P123456789"}])
    stored(h, "anthropic", m, x_team="red")
    n = req("anthropic", [{"role": "user", "content": "Summarise patient_id: P222222222"}])
    assert cache_of(h, "anthropic", n, x_team="blue") == "MISS"
    assert cache_of(h, "anthropic", n, x_api_key="ignored", x_team="red") == "HIT"


def test_another_model_never_hits(make_stack):
    """Two gateways serving two models on one Redis: the same conversation never crosses."""
    a = make_stack({"model": dict(NULL, name="zccp-model-a", null_reply="from model a")}, with_redis=True)
    b = make_stack({"model": dict(NULL, name="zccp-model-b", null_reply="from model b"),
                    "cache": {"enabled": True, "redis_url": a.cfg.cache.redis_url}})
    body = {"max_tokens": 16, "messages": CHAT}
    stored(a, "anthropic", dict(body, model="zccp-model-a"))
    r = post(b, "anthropic", dict(body, model="zccp-model-b"))
    assert r.headers["x-zccp-cache"] == "MISS" and r.json()["content"][0]["text"] == "from model b"
    # each gateway keeps answering its own model from the shared Redis
    assert eventually(b, "anthropic", dict(body, model="zccp-model-b")) == "HIT"
    r = post(a, "anthropic", dict(body, model="zccp-model-a"))
    assert r.headers["x-zccp-cache"] == "HIT" and r.json()["content"][0]["text"] == "from model a"
    assert post(b, "anthropic", dict(body, model="zccp-model-b")).json()["content"][0]["text"] == "from model b"


# ------------------------------------------------------------------------------------- the guard

ANN = "Write a short reminder to ann@north.com about the unpaid invoice 123456789 from last month"
BOB = "Write a short reminder to bob@south.org about the unpaid invoice 987654321 from last month"


def test_masked_literal_guard_refuses_an_answer_carrying_the_other_users_address(make_stack):
    # within one tenant (the anonymous one here): the guard is what keeps ann's values from bob
    s = make_stack({"model": dict(NULL, null_reply="Dear ann@north.com, invoice 123456789 is still unpaid.")},
                   with_redis=True)
    ann = req("anthropic", [{"role": "user", "content": ANN}])
    bob = req("anthropic", [{"role": "user", "content": BOB}])
    stored(s, "anthropic", ann)                         # ann's own repeat is served: it carries her values
    before = metric(s, "zccp_engine_cache_total", result="MISS", reason="masked_literal")
    # a near-duplicate of ann's request from someone else is refused ...
    carol = req("anthropic", [{"role": "user", "content": ANN.replace("ann@north.com", "carol@east.net")
                               .replace("123456789", "555555555") + " please"}])
    r = post(s, "anthropic", carol)
    assert r.headers["x-zccp-cache"] == "MISS" and r.headers["x-zccp-cache-reason"] == "masked_literal"
    # ... and so is the exact (masked) hit
    r = post(s, "anthropic", bob)
    assert r.headers["x-zccp-cache"] == "MISS" and r.headers["x-zccp-cache-reason"] == "masked_literal"
    assert metric(s, "zccp_engine_cache_total", result="MISS", reason="masked_literal") == before + 2
    # bob's fresh answer was stored over ann's: it carries none of bob's values, so it is served
    for _ in range(100):
        r = post(s, "anthropic", bob)
        if r.headers["x-zccp-cache"] == "HIT":
            break
        time.sleep(0.02)
    assert r.headers["x-zccp-cache"] == "HIT" and "x-zccp-cache-reason" not in r.headers
    s.assert_no_leaks()


def test_masked_literal_guard_allows_an_answer_without_masked_values(make_stack):
    s = make_stack({"model": dict(NULL, null_reply="The reminder was sent.")}, with_redis=True)
    stored(s, "anthropic", req("anthropic", [{"role": "user", "content": ANN}]))
    r = post(s, "anthropic", req("anthropic", [{"role": "user", "content": BOB}]))
    assert r.headers["x-zccp-cache"] == "HIT" and "x-zccp-cache-reason" not in r.headers
    assert r.json()["content"][0]["text"] == "The reminder was sent."


# ------------------------------------------------------------------------------------- L1 verdict

def _meta_of(s, body: dict):
    raw = json.dumps(body).encode()
    reader = s.arena()
    try:
        (slot,) = [x for x in reader.slots() if x.sha256 == hashlib.sha256(raw).digest()]
        m = reader.meta(slot.index)
        return int(m.cache_status), int(m.cache_ttl_s), int(m.cache_scope), int(m.cache_reason)
    finally:
        reader.close()


def test_what_nginx_may_keep(make_stack):
    s = make_stack({"model": dict(NULL, null_reply="Dear ann@north.com, done."), "cache": {"ttl_s": 600},
                    "shared_memory": {"segment_count": 1}}, with_redis=True)

    def send(body, **h):
        r = s.client().post("/v1/messages", content=json.dumps(body).encode(),
                            headers={"content-type": "application/json", **h})
        assert r.status_code == 200
        return _meta_of(s, body)

    plain = req("anthropic", [{"role": "user", "content": "A plain question with nothing masked"}])
    assert send(plain)[1:3] == (600, 1)                  # MISS stored: the tenant's (the default scope), full TTL
    time.sleep(0.2)
    status, ttl, scope, _ = send(plain)
    assert status == 1 and 590 <= ttl <= 600 and scope == 1
    masked = req("anthropic", [{"role": "user", "content": "Order #123456789 status?"}])
    assert send(masked, **{"x-api-key": "k"})[1:3] == (600, 1)   # masked, no masked value in the text: tenant
    carrying = req("anthropic", [{"role": "user", "content": "Mail ann@north.com now"}])
    assert send(carrying)[1:3] == (0, 1)                # the text carries a masked value: never in L1
    assert send(plain, **{"cache-control": "no-store"})[1] == 0
    time.sleep(0.2)
    refused = req("anthropic", [{"role": "user", "content": "Mail bob@south.org now"}])
    assert send(refused)[3] == CacheReason.MASKED_LITERAL


# ------------------------------------------------------------------------------------- purge

def test_purge_endpoint_and_cli(nstack):
    s = nstack
    ka = req("anthropic", CHAT)
    kb = req("anthropic", [{"role": "user", "content": "Order #123456789 status?"}])
    kc = req("anthropic", [{"role": "user", "content": "Another plain question"}], max_tokens=9)
    stored(s, "anthropic", ka)
    stored(s, "anthropic", kb, x_api_key="tenant-b")
    stored(s, "anthropic", kc)
    purge = s.admin_client().post("/v1/zccp/purge", json={"tenant": "tenant-b"})
    assert purge.status_code == 200 and purge.json()["purged"] >= 1
    assert cache_of(s, "anthropic", kb, x_api_key="tenant-b") == "MISS"
    assert cache_of(s, "anthropic", ka) == "HIT" and cache_of(s, "anthropic", kc) == "HIT"
    # one exact key (the slot tells which; no-store: past nginx's L1, and nothing stored again)
    raw = json.dumps(kc).encode()
    s.client().post("/v1/messages", content=raw, headers={"content-type": "application/json",
                                                          "cache-control": "no-store"})
    reader = s.arena()
    try:
        slot = next(x for x in reader.slots() if x.sha256 == hashlib.sha256(raw).digest())
        exact = bytes(ffi.buffer(reader.meta(slot.index).exact_key, 32)).hex()
    finally:
        reader.close()
    assert s.admin_client().post("/v1/zccp/purge", json={"key": exact}).json()["purged"] == 2   # entry + near record
    assert cache_of(s, "anthropic", kc) == "MISS" and cache_of(s, "anthropic", ka) == "HIT"
    # bad requests name the field; the method and the content type are checked as for the APIs
    bad = s.admin_client().post("/v1/zccp/purge", json={"scope": "mine"})
    assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("scope:")
    assert s.admin_client().get("/v1/zccp/purge").status_code == 405
    # the CLI, straight to Redis
    out = subprocess.run([sys.executable, "-m", "zccp.ops.cli", "cache", "purge", "--all", "--config",
                          str(s.config_path)], capture_output=True, text=True, timeout=60, env=ENGINE_ENV)
    assert out.returncode == 0 and out.stdout.startswith("purged "), out.stderr
    assert int(out.stdout.split()[1]) >= 2
    assert "emptied nginx's L1" in out.stdout   # ka was in L1 (served twice from Redis): gone too
    assert cache_of(s, "anthropic", ka) == "MISS"
    s.assert_no_leaks()


def test_the_public_listener_never_serves_the_admin_surface(make_stack, tmp_path):
    """Purge, warm-up, L1 purge, keys and /metrics answer on the admin listener only: the
    public one says 404 whatever address the connection comes from (behind a TLS terminator
    or a sidecar on this host every client is 127.0.0.1). On an admin address the token is
    required (issue 18)."""
    token = tmp_path / "admin.token"
    token.write_text("admin-token-for-the-test-0123456789\n")
    token.chmod(0o600)                   # only its owner may read it (or the stack refuses to start)
    s = make_stack({"model": NULL, "server": {"admin_listen": f"127.0.0.1:{free_port()}",
                                              "admin_token_file": str(token)}}, with_redis=True)
    stored(s, "anthropic", req("anthropic", CHAT))
    for local in ("127.0.0.1", "127.0.0.2"):
        with httpx.Client(base_url=s.base_url, transport=httpx.HTTPTransport(local_address=local)) as c:
            for path in ("/v1/zccp/purge", "/v1/zccp/l1/purge", "/v1/zccp/warmup", "/v1/zccp/keys"):
                r = c.post(path, json={"all": True})
                assert r.status_code == 404, (local, path, r.text)
            m = c.get("/metrics")
            assert m.status_code != 200 and "zccp_" not in m.text      # nginx's own 404 (no such location)
            # the same client is served the APIs as usual
            assert c.post("/v1/messages", json=req("anthropic", CHAT)).headers["x-zccp-cache"] == "HIT"
    with httpx.Client(base_url=f"http://{s.cfg.server.admin_listen}") as c:
        assert c.post("/v1/zccp/purge", json={"all": True}).status_code == 401         # no token
        r = c.post("/v1/zccp/purge", json={"all": True}, headers={"authorization": "Bearer wrong-token-xxxxxxxx"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert c.get("/metrics").status_code == 401
    assert cache_of(s, "anthropic", req("anthropic", CHAT)) == "HIT"                     # nothing was purged
    assert s.admin_client().post("/v1/zccp/purge", json={"all": True}).json()["purged"] >= 1   # with the token
    assert "zccp_engine_up 1" in s.admin_client().get("/metrics").text


def test_the_admin_listener_needs_a_token_on_an_address(tmp_path):
    from zccp.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match="admin_token_file: required"):
        parse_config({"server": {"admin_listen": "127.0.0.1:9901"}})
    with pytest.raises(ConfigError, match="the same as server.listen"):
        parse_config({"server": {"listen": "127.0.0.1:9901", "admin_listen": "127.0.0.1:9901",
                                 "admin_token_file": "t"}})
