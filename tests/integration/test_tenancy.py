"""Tenancy that cannot be probed (issue 18), through the real nginx, engine and Redis: the
default cache scope tells no tenant anything about another's prompts, by HIT, Age, the
prefix cache's cached-token counts or the masked-literal guard's verdict; an empty
x-api-key is no key; no-store is never a free probe. Each test here is one of the probes
the issue lists, and each one got its signal on the code before it."""

from __future__ import annotations

import pytest

from tests.support.cache_requests import NULL, PATHS, cache_of, eventually, post, req, stored

SAMPLED = "Generate a fresh 16-character password for my new database account, please."


def sampled(api: str) -> dict:
    """A request at the API's default temperature (no `temperature`): its answer is sampled."""
    body = req(api, [{"role": "user", "content": SAMPLED}])
    del body["temperature"]
    return body


@pytest.fixture
def nstack(make_stack):
    return make_stack({"model": NULL}, with_redis=True)


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_another_tenant_learns_nothing_of_a_prompt_by_default(nstack, api):
    s = nstack
    stored(s, api, sampled(api), x_api_key="sk-alice")          # alice's own repeat is a HIT
    for headers in ({"x_api_key": "sk-mallory-1"}, {"authorization": "Bearer sk-mallory-2"},
                    {"x_api_key": "sk-mallory-3", "cache_control": "no-store"}, {}):
        r = post(s, api, sampled(api), **headers)
        assert r.headers["x-zccp-cache"] == "MISS", headers
        assert "age" not in r.headers and "x-zccp-cache-reason" not in r.headers, headers
    # and the unmasked, deterministic request is not shared either (the HIT alone is the signal)
    body = req(api, [{"role": "user", "content": "Summarise the attached board minutes of 3 March"}])
    stored(s, api, body, x_api_key="sk-alice")
    assert cache_of(s, api, body, x_api_key="sk-mallory") == "MISS"
    s.assert_no_leaks()


def test_an_empty_x_api_key_falls_through_to_the_bearer_token(nstack):
    s = nstack
    body = req("openai", [{"role": "user", "content": "Status of order #123456789, please"}])   # masked
    stored(s, "openai", body, x_api_key="", authorization="Bearer sk-A")
    assert cache_of(s, "openai", body, x_api_key="", authorization="Bearer sk-B") == "MISS"
    assert eventually(s, "openai", body, x_api_key="", authorization="Bearer sk-B") == "HIT"     # B's own now
    assert eventually(s, "openai", body, x_api_key="", authorization="Bearer sk-A") == "HIT"     # A's own


def test_no_store_is_no_probe_of_shared_entries(make_stack):
    """Even where the operator opted in to sharing exact answers, a no-store request (which
    leaves no trace) is never served a shared entry: it reads its own tenant's only."""
    s = make_stack({"model": NULL, "cache": {"scope": "shared_exact"}}, with_redis=True)
    body = req("anthropic", [{"role": "user", "content": "What does the onboarding checklist say?"}])
    stored(s, "anthropic", body, x_api_key="sk-alice")
    assert cache_of(s, "anthropic", body, x_api_key="sk-bob") == "HIT"            # opted in: shared
    r = post(s, "anthropic", body, x_api_key="sk-mallory", cache_control="no-store")
    assert r.headers["x-zccp-cache"] == "MISS" and "age" not in r.headers
    r = post(s, "anthropic", body, x_api_key="sk-alice", cache_control="no-store")
    assert r.headers["x-zccp-cache"] == "MISS"      # alice's answer was stored as shared, not hers


ANN = "Write a short reminder to ann@north.com about the unpaid invoice 123456789 from last month"
BOB = "Write a short reminder to bob@south.org about the unpaid invoice 987654321 from last month"


def test_masked_literal_guard_compares_the_masked_fields_not_the_raw_body(make_stack):
    """Candidate values packed into metadata do not pass the guard: only the values the masks
    replaced in this request count. (Before, the raw body was searched, so HIT vs
    X-ZCCP-Cache-Reason: masked_literal told which candidate was the other caller's value.)"""
    s = make_stack({"model": dict(NULL, null_reply="Dear ann@north.com, invoice 123456789 is still unpaid."),
                    "cache": {"scope": "shared_exact"}}, with_redis=True)
    stored(s, "anthropic", req("anthropic", [{"role": "user", "content": ANN}]))
    for guess in ("ann@north.com 123456789", "carol@east.net 123456789"):
        probe = req("anthropic", [{"role": "user", "content": BOB}], metadata={"user_id": guess})
        r = post(s, "anthropic", probe, cache_control="no-store")
        assert r.headers["x-zccp-cache"] == "MISS", guess
        assert r.headers["x-zccp-cache-reason"] == "masked_literal", guess    # the same verdict for both


def _cached_tokens(api: str, r) -> int:
    u = r.json()["usage"]
    return u["cache_read_input_tokens"] if api == "anthropic" else u["prompt_tokens_details"]["cached_tokens"]


SYSTEM = "You are the support assistant of the northern branch; answer in two short sentences. " * 6


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_prefix_kv_cache_is_salted_per_tenant_but_a_warmed_prefix_is_shared(make_stack, api):
    s = make_stack({"model": {"prefix_block": 16}})      # the tiny model: real KV blocks, no Redis

    def send(key: str, question: str):
        if api == "anthropic":
            # cache_control: Anthropic reports cache reads only where the request asks for caching
            body = {"model": "zccp-tiny", "max_tokens": 2, "temperature": 0,
                    "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
                    "messages": [{"role": "user", "content": question}]}
        else:
            body = {"model": "zccp-tiny", "max_tokens": 2, "temperature": 0,
                    "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]}
        r = s.client().post(PATHS[api], json=body, headers={"authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
        return _cached_tokens(api, r)

    assert send("sk-alice", "Where is my parcel?") == 0
    assert send("sk-alice", "When do you open?") >= 64                # her own system prompt: reused
    assert send("sk-mallory", "When do you close?") == 0               # never alice's blocks
    # an operator-declared shared prefix (a warm-up, on the admin side) is every tenant's
    w = s.admin_client().post("/v1/zccp/warmup", json={"model": "zccp-tiny", "system": SYSTEM, "messages": []})
    assert w.status_code == 200, w.text
    assert send("sk-eve", "Do you ship abroad?") >= 64
    s.assert_no_leaks()
