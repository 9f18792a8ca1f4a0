"""nginx's L1 (lua/zccp/plugins/l1/cache.lua, docs/cache.md "L1 in nginx") through the real stack: an exact
hit the engine replayed once is then answered by nginx alone, byte for byte the engine's
replay but for the response id and `created`; never across tenants, after its TTL, after a
purge, for no-cache / no-store, nor for an answer carrying a masked value; and the engine
never sees it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.support.cache_requests import ENGINE_ENV, NULL, PATHS, metric, req

ID = {"anthropic": re.compile(r'"id":"msg_[0-9A-Za-z]{24}"'),
      "openai": re.compile(r'"id":"chatcmpl-[0-9A-Za-z]{29}"')}
CREATED = re.compile(r'"created":(\d+)')
ANN = "Write to ann@north.com about invoice 123456789 being late"
# Above nginx's decode limit (64 KiB of JSON: \u escapes make it), within a slot's 65,536 tokens.
BIG = "Zürich, Köln, Malmö, Århus, Göteborg, Düsseldorf. " * 900


@pytest.fixture
def lstack(make_stack):
    return make_stack({"model": NULL, "cache": {"ttl_s": 600}}, with_redis=True)


@pytest.fixture
def lstack_any(make_stack, protocol):
    """lstack over HTTP/1.1, and over HTTP/2 + TLS."""
    return make_stack({"model": NULL, "cache": {"ttl_s": 600}}, with_redis=True, tls=protocol == "h2tls")


def post(s, api, body: dict | bytes, **headers) -> httpx.Response:
    """body: a request (sent as json.dumps writes it: ASCII, escapes) or its raw bytes."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    h = {"content-type": "application/json", **{k.replace("_", "-"): v for k, v in headers.items()}}
    r = s.client().post(PATHS[api], content=raw, headers=h)
    assert r.status_code == 200, r.text
    return r


def eventually(s, api, body, **headers) -> str:
    """The first answer other than MISS within 2 s (a store lands just after its answer), else MISS."""
    for _ in range(100):
        got = post(s, api, body, **headers).headers["x-zccp-cache"]
        if got != "MISS":
            return got
        time.sleep(0.02)
    return "MISS"


def layer(r: httpx.Response) -> str:
    return f'{r.headers["x-zccp-cache"]}/{r.headers.get("x-zccp-cache-layer", "-")}'


def to_l1(s, api, body, missed: bool = False, **headers) -> tuple[httpx.Response, httpx.Response]:
    """A MISS (unless `missed` already), then the engine's replay of the stored answer (L2:
    nginx keeps it), then L1's; returns an engine replay and an L1 one."""
    if not missed:
        assert layer(post(s, api, body, **headers)) == "MISS/-"
    assert eventually(s, api, body, **headers) == "HIT"          # the engine's replay, which nginx keeps
    l1 = post(s, api, body, **headers)
    l2 = post(s, api, body, **dict(headers, cache_control="no-store"))   # the engine's replay again, past L1
    assert layer(l2) == "HIT/L2" and layer(l1) == "HIT/L1"
    return l2, l1


def unique(api: str, text: str) -> tuple[str, list[str]]:
    """The body with its response id and `created` taken out, and the ids it had."""
    ids = ID[api].findall(text)
    out = ID[api].sub('"id":"<id>"', text)
    if api == "openai":
        out = CREATED.sub('"created":<created>', out)
    return out, ids


@pytest.mark.parametrize("api,extra", [
    ("anthropic", {}), ("anthropic", {"stream": True}),
    ("openai", {}), ("openai", {"stream": True}),
    ("openai", {"stream": True, "stream_options": {"include_usage": True}}),
])
def test_an_l1_hit_is_the_engines_replay_with_a_fresh_id_and_created(lstack, api, extra):
    body = req(api, [{"role": "user", "content": "What is the capital of France?"}], **extra)
    l2, l1 = to_l1(lstack, api, body)
    t0 = int(time.time())
    again = post(lstack, api, body)
    t1 = int(time.time())
    (a, ids2), (b, ids1), (c, ids3) = unique(api, l2.text), unique(api, l1.text), unique(api, again.text)
    assert a == b == c                                            # byte for byte, but for id and created
    assert l2.headers["content-type"] == l1.headers["content-type"]
    assert "age" in l1.headers and l1.headers.get("content-length") == l2.headers.get("content-length")
    assert ids2 and len(ids1) == len(ids2) and len(set(ids1)) == 1   # the one id, everywhere it stood
    assert len({ids1[0], ids2[0], ids3[0]}) == 3                  # a fresh id for every replay
    if api == "openai":
        assert {int(x) for x in CREATED.findall(again.text)} <= set(range(t0, t1 + 1))
    if extra.get("stream"):
        assert l1.headers["content-type"].startswith("text/event-stream")
        assert "[DONE]" in l1.text if api == "openai" else "message_stop" in l1.text
    # a streamed request and a plain one are kept apart (their bytes differ); and so are
    # OpenAI streams with and without the usage chunk
    if api == "openai" and extra.get("stream"):
        other = dict(body)
        if "stream_options" in other:
            del other["stream_options"]
        else:
            other["stream_options"] = {"include_usage": True}
        assert layer(post(lstack, api, other)) == "HIT/L2"


def test_l1_answers_over_http2_like_over_http1(make_stack):
    """The same L1 path over HTTP/2 + TLS (one stack for both APIs, streamed and not; the
    other L1 tests run over HTTP/1.1, and the large-body one over both)."""
    s = make_stack({"model": NULL, "cache": {"ttl_s": 600}}, with_redis=True, tls=True)
    for api, extra in (("anthropic", {"stream": True}), ("openai", {})):
        body = req(api, [{"role": "user", "content": f"Over HTTP/2, {api}"}], **extra)
        l2, l1 = to_l1(s, api, body)
        assert l1.http_version == "HTTP/2"
        assert unique(api, l2.text)[0] == unique(api, l1.text)[0]
        assert l1.headers["x-zccp-context-id"] == l2.headers["x-zccp-context-id"]
    s.assert_no_leaks()


def test_other_bytes_of_the_same_request_hit_by_the_exact_key_masked_ones_do_not(lstack):
    s = lstack
    body = req("openai", [{"role": "user", "content": "Same request, other spacing"}])
    to_l1(s, "openai", body)
    spaced = json.dumps(body, indent=2).encode()        # other bytes, the same exact key
    assert layer(post(s, "openai", spaced)) == "HIT/L1"
    # a masked request: other values are one exact key for the engine (a HIT), but their
    # prompt counts differ (usage): L1 keeps it by its bytes only
    a = req("anthropic", [{"role": "user", "content": "Order #123456789 status?"}])
    b = req("anthropic", [{"role": "user", "content": "Order #98765432100 status?"}])
    to_l1(s, "anthropic", a)
    r = post(s, "anthropic", b)
    assert layer(r) == "HIT/L2"
    assert r.json()["usage"]["input_tokens"] != post(s, "anthropic", a).json()["usage"]["input_tokens"]


def test_an_l1_hit_never_reaches_the_engine(lstack):
    s = lstack
    body = req("anthropic", [{"role": "user", "content": "Name three rivers"}])
    to_l1(s, "anthropic", body)
    engine_hits = metric(s, "zccp_engine_cache_total", result="HIT", reason="exact")
    l1_hits = metric(s, "zccp_nginx_l1_total", api="anthropic", result="hit")
    os.kill(s.engine.pid, signal.SIGSTOP)
    try:
        with s.client(timeout=10) as c:
            for _ in range(5):
                r = c.post(PATHS["anthropic"], json=body)
                assert r.status_code == 200 and layer(r) == "HIT/L1"
    finally:
        os.kill(s.engine.pid, signal.SIGCONT)
    assert metric(s, "zccp_engine_cache_total", result="HIT", reason="exact") == engine_hits
    assert metric(s, "zccp_nginx_l1_total", api="anthropic", result="hit") == l1_hits + 5
    s.assert_no_leaks()


def test_l1_never_serves_across_tenants(lstack):
    s = lstack
    # masked: the engine keeps it within the tenant (cache_scope 1)
    masked = req("anthropic", [{"role": "user", "content": "Order #123456789 status?"}])
    to_l1(s, "anthropic", masked, x_api_key="tenant-a")
    assert layer(post(s, "anthropic", masked, x_api_key="tenant-b")) == "MISS/-"
    assert layer(post(s, "anthropic", masked)) == "MISS/-"                        # anonymous
    assert layer(post(s, "anthropic", masked, x_api_key="tenant-a")) == "HIT/L1"
    # unmasked: the tenant's too under the default scope
    plain = req("anthropic", [{"role": "user", "content": "A plain question"}])
    to_l1(s, "anthropic", plain, x_api_key="tenant-a")
    assert layer(post(s, "anthropic", plain, x_api_key="tenant-b")) == "MISS/-"


def test_l1_shares_what_the_engine_shares(make_stack):
    # shared_exact (opt-in): an unmasked answer is every tenant's (cache_scope 0), in L1 too
    s = make_stack({"model": NULL, "cache": {"scope": "shared_exact"}}, with_redis=True)
    plain = req("anthropic", [{"role": "user", "content": "A plain question"}])
    assert layer(post(s, "anthropic", plain, x_api_key="tenant-a")) == "MISS/-"
    assert eventually(s, "anthropic", plain, x_api_key="tenant-a") == "HIT"    # the replay nginx keeps
    assert layer(post(s, "anthropic", plain, x_api_key="tenant-b")) == "HIT/L1"


def test_isolated_scope_keeps_every_l1_entry_within_its_tenant(make_stack):
    s = make_stack({"model": NULL, "cache": {"scope": "isolated"}}, with_redis=True)
    plain = req("openai", [{"role": "user", "content": "A plain question"}])
    to_l1(s, "openai", plain, authorization="Bearer tenant-a")
    assert layer(post(s, "openai", plain, authorization="Bearer tenant-b")) == "MISS/-"
    assert layer(post(s, "openai", plain, authorization="Bearer tenant-a")) == "HIT/L1"


def test_l1_forgets_after_its_ttl(make_stack):
    s = make_stack({"model": NULL, "cache": {"ttl_s": 600, "l1": {"ttl_s": 1}}}, with_redis=True)
    body = req("anthropic", [{"role": "user", "content": "Expire me"}])
    to_l1(s, "anthropic", body)
    time.sleep(1.3)
    assert layer(post(s, "anthropic", body)) == "HIT/L2"       # Redis still has it: the engine answers
    assert layer(post(s, "anthropic", body)) == "HIT/L1"       # and nginx keeps it again


def test_a_purge_empties_l1(lstack):
    s = lstack
    a = req("anthropic", [{"role": "user", "content": "First question"}])
    b = req("openai", [{"role": "user", "content": "Second question"}])
    to_l1(s, "anthropic", a)
    to_l1(s, "openai", b)
    # a purge of some other key leaves Redis's entries, and empties L1 all the same
    r = s.admin_client().post("/v1/zccp/purge", json={"key": "ab" * 32})
    assert r.status_code == 200 and r.json()["purged"] == 0
    assert layer(post(s, "anthropic", a)) == "HIT/L2"
    assert layer(post(s, "anthropic", a)) == "HIT/L1"
    assert s.admin_client().post("/v1/zccp/purge", json={"all": True}).status_code == 200
    assert layer(post(s, "anthropic", a)) == "MISS/-" and layer(post(s, "openai", b)) == "MISS/-"
    # L1 alone (what `zccp-cache purge` calls after purging Redis); the admin listener only
    to_l1(s, "openai", b, missed=True)
    assert s.client().post("/v1/zccp/l1/purge").status_code == 404
    assert layer(post(s, "openai", b)) == "HIT/L1"
    assert s.admin_client().get("/v1/zccp/l1/purge").status_code == 405
    assert s.admin_client().post("/v1/zccp/l1/purge").json() == {"purged_l1": True}
    assert layer(post(s, "openai", b)) == "HIT/L2"
    # the CLI: Redis, then this host's L1
    to_l1(s, "openai", b, missed=True)
    out = subprocess.run([sys.executable, "-m", "zccp.ops.cli", "cache", "purge", "--scope", "anonymous",
                          "--config", str(s.config_path)], capture_output=True, text=True, timeout=60,
                         env=ENGINE_ENV)
    assert out.returncode == 0 and "emptied nginx's L1" in out.stdout, out.stderr
    assert layer(post(s, "openai", b)) == "MISS/-"


def test_no_cache_and_no_store_skip_l1(lstack):
    s = lstack
    body = req("anthropic", [{"role": "user", "content": "Control headers"}])
    to_l1(s, "anthropic", body)
    assert layer(post(s, "anthropic", body, cache_control="no-cache")) == "BYPASS/-"
    assert layer(post(s, "anthropic", body, cache_control="no-store")) == "HIT/L2"
    assert layer(post(s, "anthropic", body, cache_control="no-cache, no-store")) == "BYPASS/-"
    # replays to no-store requests are not kept
    other = req("anthropic", [{"role": "user", "content": "Never kept"}])
    assert layer(post(s, "anthropic", other)) == "MISS/-"
    assert eventually(s, "anthropic", other, cache_control="no-store") == "HIT"
    stores = metric(s, "zccp_nginx_l1_total", api="anthropic", result="store")
    for _ in range(3):
        assert layer(post(s, "anthropic", other, cache_control="no-store")) == "HIT/L2"
    assert metric(s, "zccp_nginx_l1_total", api="anthropic", result="store") == stores
    assert layer(post(s, "anthropic", other)) == "HIT/L2"
    assert layer(post(s, "anthropic", other)) == "HIT/L1"


def test_an_answer_carrying_a_masked_value_never_enters_l1(make_stack):
    s = make_stack({"model": dict(NULL, null_reply="Dear ann@north.com, invoice 123456789 is late.")},
                   with_redis=True)
    body = req("anthropic", [{"role": "user", "content": ANN}])
    assert layer(post(s, "anthropic", body)) == "MISS/-"
    assert eventually(s, "anthropic", body) == "HIT"
    for _ in range(3):
        assert layer(post(s, "anthropic", body)) == "HIT/L2"   # the engine's guard runs every time
    assert metric(s, "zccp_nginx_l1_total", api="anthropic", result="store") == 0


def test_bodies_above_the_decode_limit_are_kept_by_their_bytes(lstack_any):
    s = lstack_any
    body = req("anthropic", [{"role": "user", "content": BIG}])
    assert len(json.dumps(body)) > 64 * 1024 > len(BIG.encode())
    l2, l1 = to_l1(s, "anthropic", body)
    assert unique("anthropic", l2.text)[0] == unique("anthropic", l1.text)[0]
    # other bytes, the same request for the engine (one more space): not L1's to answer
    raw = json.dumps(body).replace('"messages": ', '"messages":  ').encode()
    assert layer(post(s, "anthropic", raw)) == "HIT/L2"
    assert layer(post(s, "anthropic", raw)) == "HIT/L1"
    # and the same bytes from another tenant: not shared (the default scope), as in the engine
    assert layer(post(s, "anthropic", raw, x_api_key="someone-else")) == "MISS/-"
    # those bytes streamed into the slot (Content-Length); chunked, they are read whole: one key
    r = s.client().post(PATHS["anthropic"], content=iter([raw[:1000], raw[1000:]]),
                        headers={"content-type": "application/json"})
    assert r.status_code == 200 and layer(r) == "HIT/L1"
    s.assert_no_leaks()   # a streamed body's L1 hit gave its slot back unrung


def test_l1_switched_off_and_its_entry_cap(make_stack):
    off = make_stack({"model": NULL, "cache": {"l1": {"enabled": False}}}, with_redis=True)
    body = req("anthropic", [{"role": "user", "content": "Not kept"}])
    assert layer(post(off, "anthropic", body)) == "MISS/-"
    assert eventually(off, "anthropic", body) == "HIT"
    for _ in range(3):
        assert layer(post(off, "anthropic", body)) == "HIT/L2"
    # an unmasked answer nginx fingerprinted takes two entries: its bytes', its exact key's
    capped = make_stack({"model": NULL, "cache": {"l1": {"max_entries": 4}}}, with_redis=True)
    for q in ("one", "two"):
        to_l1(capped, "anthropic", req("anthropic", [{"role": "user", "content": q}]))
    third = req("anthropic", [{"role": "user", "content": "three"}])
    assert layer(post(capped, "anthropic", third)) == "MISS/-"
    assert eventually(capped, "anthropic", third) == "HIT"
    for _ in range(3):
        assert layer(post(capped, "anthropic", third)) == "HIT/L2"


def test_an_nginx_reload_empties_l1(lstack):
    from zccp.ops.stack import reload_masks   # the masks may have changed: every key with them

    s = lstack
    body = req("openai", [{"role": "user", "content": "Reload me"}])
    to_l1(s, "openai", body)
    reload_masks(s.cfg, s.run_dir)
    assert layer(post(s, "openai", body)) == "HIT/L2"
    assert layer(post(s, "openai", body)) == "HIT/L1"
