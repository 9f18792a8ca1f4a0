"""Limits by cost (auth.mode: keys) through the real nginx, engine and Redis: requests per
minute, tokens per minute and concurrency per key and per tenant, held across two stacks
sharing one Redis; 429 in each API's shape with retry-after and the API's rate-limit
headers, parsed by the official SDKs; a cache hit counts as a request and zero tokens; the
usage is metered (zccp-keys usage, the JSON-lines log)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import anthropic
import openai
import pytest

from tests.support.cache_requests import NULL, metric, req
from tests.support.keys_helpers import keys_cli, status

AUTH = {"mode": "keys", "cache_ttl_s": 1, "negative_ttl_s": 1}


def fresh_minute() -> None:
    """Per-minute windows: start a counting test well inside one (a window that turns over
    mid-test would reset the counters it checks)."""
    if time.time() % 60 > 45:
        time.sleep(61 - time.time() % 60)


@pytest.fixture
def lstack(make_stack):
    return make_stack({"model": NULL, "auth": AUTH}, with_redis=True)


def test_requests_per_minute_with_each_apis_headers_and_errors(lstack):
    s = lstack
    fresh_minute()
    k = keys_cli(s, "create", "--tenant", "acme", "--rpm", "3")["key"]
    body = req("anthropic", [{"role": "user", "content": "hi"}])
    for left in (2, 1, 0):
        r = status(s, "anthropic", body, x_api_key=k, cache_control="no-store")
        assert r.status_code == 200, r.text
        assert r.headers["anthropic-ratelimit-requests-limit"] == "3"
        assert r.headers["anthropic-ratelimit-requests-remaining"] == str(left)
        assert r.headers["anthropic-ratelimit-requests-reset"].endswith("Z")
    r = status(s, "anthropic", body, x_api_key=k)
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
    assert 1 <= int(r.headers["retry-after"]) <= 60
    with pytest.raises(anthropic.RateLimitError):
        anthropic.Anthropic(base_url=s.base_url, api_key=k, max_retries=0).messages.create(
            model="zccp-tiny", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    o = keys_cli(s, "create", "--tenant", "acme", "--rpm", "2", "--otpm", "100")["key"]
    client = openai.OpenAI(base_url=s.base_url + "/v1", api_key=o, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="zccp-tiny", max_tokens=8,
                                                           messages=[{"role": "user", "content": "hi"}])
    assert raw.headers["x-ratelimit-limit-requests"] == "2" and raw.headers["x-ratelimit-remaining-requests"] == "1"
    assert raw.headers["x-ratelimit-limit-tokens"] == "100" and int(raw.headers["x-ratelimit-remaining-tokens"]) <= 92
    assert raw.headers["x-ratelimit-reset-requests"].endswith("s")
    client.chat.completions.create(model="zccp-tiny", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.RateLimitError) as e:
        client.chat.completions.create(model="zccp-tiny", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert e.value.code == "rate_limit_exceeded" and e.value.response.headers["retry-after"]
    s.assert_no_leaks()


def test_tenant_limits_hold_over_all_its_keys(lstack):
    s = lstack
    fresh_minute()
    keys_cli(s, "tenant", "--tenant", "initech", "--rpm", "3")
    a = keys_cli(s, "create", "--tenant", "initech")["key"]
    b = keys_cli(s, "create", "--tenant", "initech")["key"]
    body = req("anthropic", [{"role": "user", "content": "hi"}])
    assert [status(s, "anthropic", body, x_api_key=k).status_code for k in (a, b, a)] == [200, 200, 200]
    r = status(s, "anthropic", body, x_api_key=b)
    assert r.status_code == 429 and "tenant initech" in r.json()["error"]["message"]
    other = keys_cli(s, "create", "--tenant", "globex")["key"]
    assert status(s, "anthropic", body, x_api_key=other).status_code == 200


def test_concurrent_requests(make_stack):
    s = make_stack({"model": dict(NULL, null_token_delay_ms=100), "auth": AUTH}, with_redis=True)
    k = keys_cli(s, "create", "--tenant", "acme", "--concurrency", "1")["key"]
    body = req("anthropic", [{"role": "user", "content": "slow one"}], max_tokens=10)   # ~1 s of tokens
    first: list = []
    t = threading.Thread(target=lambda: first.append(status(s, "anthropic", body, x_api_key=k,
                                                             cache_control="no-store")))
    t.start()
    seen = []
    deadline = time.time() + 5
    while time.time() < deadline and t.is_alive():
        seen.append(status(s, "anthropic", body, x_api_key=k, cache_control="no-store"))
        if seen[-1].status_code == 429:
            break
        time.sleep(0.05)
    t.join()
    codes = [r.status_code for r in first + seen]
    assert 200 in codes and 429 in codes, codes      # one in flight, the other refused
    refused = next(r for r in first + seen if r.status_code == 429)
    assert "concurrent requests 1" in refused.json()["error"]["message"]
    # the slot is given back when the answer ends (settled in the log phase)
    for _ in range(50):
        if status(s, "anthropic", body, x_api_key=k, cache_control="no-store").status_code == 200:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the concurrency count was never given back")


def _output_tokens(r) -> int:
    return r.json()["usage"]["output_tokens"]


def test_a_token_limit_holds_across_two_stacks_and_hits_cost_no_tokens(make_stack):
    a = make_stack({"model": NULL, "auth": AUTH}, with_redis=True)
    b = make_stack({"model": NULL, "auth": AUTH, "cache": {"enabled": True, "redis_url": a.cfg.cache.redis_url}})
    fresh_minute()
    limit = 40
    k = keys_cli(a, "create", "--tenant", "acme", "--otpm", str(limit))["key"]
    served = refused = 0
    for i in range(20):
        s = (a, b)[i % 2]
        body = req("anthropic", [{"role": "user", "content": f"question {i}"}], max_tokens=8)
        r = status(s, "anthropic", body, x_api_key=k)
        if r.status_code == 200:
            served += _output_tokens(r)
        else:
            assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
            refused += 1
        time.sleep(0.05)
    assert served <= limit and refused > 0
    # a hit costs no tokens: after a miss that used 8 of 16 tokens a minute, there is room for one
    # more reservation of max_tokens 8 only; hits are served again and again (each reserves 8,
    # then is settled at 0)
    h = keys_cli(a, "create", "--tenant", "hits", "--otpm", "16", "--daily-tokens", "100000")["key"]
    body = req("anthropic", [{"role": "user", "content": "the same question"}], max_tokens=8)
    assert status(a, "anthropic", body, x_api_key=h).status_code == 200
    time.sleep(0.3)
    got = []
    for _ in range(6):
        got.append(status(a, "anthropic", body, x_api_key=h))
        time.sleep(0.2)     # each worker sends its settlements every 50 ms: the refund lands meanwhile
    assert [r.status_code for r in got].count(200) >= 5
    assert all(r.headers.get("x-zccp-cache") == "HIT" for r in got if r.status_code == 200)
    # metered: requests, tokens, hits and the tokens they saved; and one JSON line per request
    time.sleep(0.3)
    usage = keys_cli(a, "usage", "--tenant", "hits")
    assert usage["tenant"]["requests"] >= 7 and usage["tenant"]["cache_hits"] >= 5
    # the engine's replays and L1's hits (from the counts its entry kept) meter what they saved
    assert usage["tenant"]["saved_tokens"] >= 8 * 5 and usage["tenant"]["output_tokens"] == 8
    lines = [json.loads(x) for x in Path(a.cfg.auth.usage_log).read_text().splitlines()]
    mine = [x for x in lines if x["tenant"] == "hits"]
    assert len(mine) >= 7 and {x["cache"] for x in mine} >= {"MISS", "HIT"}
    assert all(x["output_tokens"] == 0 and x["saved_tokens"] >= 8 for x in mine if x["cache"] == "HIT")
    # Prometheus: bounded series (labels from fixed sets, never a key or a tenant)
    assert metric(a, "zccp_nginx_limited_total", api="anthropic", limit="otpm") \
        + metric(b, "zccp_nginx_limited_total", api="anthropic", limit="otpm") == refused
    assert metric(a, "zccp_nginx_metered_tokens_total", api="anthropic", kind="saved") >= 8
    assert metric(a, "zccp_nginx_auth_total", api="anthropic", result="ok") >= 7
    text = a.admin_client().get("/metrics").text
    assert "acme" not in text and "key_" not in text
