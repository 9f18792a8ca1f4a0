"""The Redis cache through the real stack: exact and near hits, scope, masks, headers, Redis faults."""

from __future__ import annotations

import json
import time

import pytest

from tests.support.harness import anthropic_body

LONG = ("The quarterly report covers revenue growth in the northern region, staffing changes in "
        "the support organisation, the migration of billing to the new platform, and a review "
        "of supplier contracts that expire before the end of the fiscal year. ") * 3


@pytest.fixture
def cstack(make_stack):
    return make_stack({"cache": {"ttl_s": 600}}, with_redis=True)


@pytest.fixture
def cstack_any(make_stack, protocol):
    """cstack over HTTP/1.1, and over HTTP/2 + TLS."""
    return make_stack({"cache": {"ttl_s": 600}}, with_redis=True, tls=protocol == "h2tls")


def post(s, body, **headers):
    r = s.client().post("/v1/messages", json=body, headers=headers)
    assert r.status_code == 200, r.text
    return r


def test_exact_hit_replays_the_same_answer(cstack_any):
    cstack = cstack_any
    body = anthropic_body("Tell me a story", max_tokens=30, temperature=1)
    first = post(cstack, body)
    assert first.headers["x-zccp-cache"] == "MISS"
    second = post(cstack, body)
    assert second.headers["x-zccp-cache"] == "HIT"
    assert "age" in second.headers
    a, b = first.json(), second.json()
    # Sampled at temperature 1: only the cache can make the texts equal.
    assert a["content"] == b["content"] and a["stop_reason"] == b["stop_reason"]
    assert a["usage"] == b["usage"] and a["id"] != b["id"]
    cstack.assert_no_leaks()


@pytest.mark.parametrize("change", [
    {"temperature": 0.5}, {"max_tokens": 31}, {"stop_sequences": ["zz"]}, {"system": "be terse"},
    {"top_k": 5}, {"tools": [{"name": "t", "input_schema": {"type": "object"}}]},
])
def test_other_parameters_never_hit(cstack, change):
    base = anthropic_body(LONG, max_tokens=30, temperature=1)
    post(cstack, base)
    assert post(cstack, base).headers["x-zccp-cache"] == "HIT"
    other = dict(base, **change)
    assert post(cstack, other).headers["x-zccp-cache"] == "MISS"


def test_other_model_name_never_hits(make_stack):
    # Two stacks sharing one Redis, each serving its own model name: the same prompt sent
    # to the other model misses, though the entry for the first one is there.
    a = make_stack({"model": {"name": "zccp-tiny-a"}}, with_redis=True)
    b = make_stack({"model": {"name": "zccp-tiny-b"}, "cache": {"enabled": True, "redis_url": a.cfg.cache.redis_url}})
    post(a, anthropic_body("hello", max_tokens=8, temperature=0, model="zccp-tiny-a"))
    r = post(a, anthropic_body("hello", max_tokens=8, temperature=0, model="zccp-tiny-a"))
    assert r.headers["x-zccp-cache"] == "HIT"
    other = post(b, anthropic_body("hello", max_tokens=8, temperature=0, model="zccp-tiny-b"))
    assert other.headers["x-zccp-cache"] == "MISS"
    assert other.json()["model"] == "zccp-tiny-b"
    # b stored its own answer under its own model: now b hits, and a still hits its own.
    r = post(b, anthropic_body("hello", max_tokens=8, temperature=0, model="zccp-tiny-b"))
    assert r.headers["x-zccp-cache"] == "HIT"


def test_a_near_duplicate_is_served_only_when_it_means_the_same(cstack):
    post(cstack, anthropic_body(LONG, max_tokens=20, temperature=0))
    polite = "Please: " + LONG.upper() + " Thanks!"
    r = post(cstack, anthropic_body(polite, max_tokens=20, temperature=0))
    assert r.headers["x-zccp-cache"] == "NEAR"
    assert 0.85 <= float(r.headers["x-zccp-similarity"]) < 1.0
    # one word that changes the answer: a miss, however similar the rest (tests/integration/test_near_meaning.py)
    edited = LONG.replace("northern", "southern", 1)
    assert post(cstack, anthropic_body(edited, max_tokens=20, temperature=0)).headers["x-zccp-cache"] == "MISS"
    unrelated = post(cstack, anthropic_body("Completely different words about gardening tomatoes in spring " * 4,
                                            max_tokens=20, temperature=0))
    assert unrelated.headers["x-zccp-cache"] == "MISS"


def test_near_duplicate_serving_can_be_switched_off(make_stack):
    s = make_stack({"cache": {"near_duplicate": False}}, with_redis=True)
    post(s, anthropic_body(LONG, max_tokens=20))
    r = post(s, anthropic_body("Please: " + LONG, max_tokens=20))
    assert r.headers["x-zccp-cache"] == "MISS"


def test_masked_ids_hit(cstack):
    a = anthropic_body("Summarise the chart of patient_id: P123456789 seen 2024-03-01T10:00:00Z", max_tokens=20)
    b = anthropic_body("Summarise the chart of patient_id: P987654321 seen 2025-11-30T08:15:00Z", max_tokens=20)
    post(cstack, a)
    assert post(cstack, b).headers["x-zccp-cache"] == "HIT"


def test_cache_control_no_cache_and_no_store(cstack):
    body = anthropic_body("control headers", max_tokens=10)
    r = post(cstack, body, **{"cache-control": "no-store"})
    assert r.headers["x-zccp-cache"] == "MISS"
    assert post(cstack, body, **{"cache-control": "no-cache"}).headers["x-zccp-cache"] == "BYPASS"
    # no-cache skipped the lookup but still stored: now it hits.
    assert post(cstack, body).headers["x-zccp-cache"] == "HIT"


def _sse_events(text: str) -> list[str]:
    return [line[len("event: "):] for line in text.splitlines() if line.startswith("event: ")]


def test_streamed_and_plain_share_entries(cstack_any):
    cstack = cstack_any
    body = anthropic_body("stream then plain", max_tokens=25, temperature=1)
    streamed = cstack.client().post("/v1/messages", json=dict(body, stream=True))
    assert streamed.headers["x-zccp-cache"] == "MISS"
    replayed = cstack.client().post("/v1/messages", json=dict(body, stream=True))
    assert replayed.headers["x-zccp-cache"] == "HIT"
    assert _sse_events(replayed.text) == _sse_events(streamed.text)
    assert [ln for ln in replayed.text.splitlines() if "text_delta" in ln] == \
           [ln for ln in streamed.text.splitlines() if "text_delta" in ln]
    plain = post(cstack, body)
    assert plain.headers["x-zccp-cache"] == "HIT"
    text = "".join(json.loads(ln[6:])["delta"]["text"]
                   for ln in streamed.text.splitlines() if "text_delta" in ln)
    assert plain.json()["content"][0]["text"] == text


def test_openai_and_anthropic_do_not_share(cstack):
    msgs = [{"role": "user", "content": "same words"}]
    post(cstack, {"model": "zccp-tiny", "max_tokens": 10, "messages": msgs})
    r = cstack.client().post("/v1/chat/completions", json={"model": "zccp-tiny", "max_tokens": 10, "messages": msgs})
    assert r.headers["x-zccp-cache"] == "MISS"


def test_redis_down_serves_uncached_and_recovers(cstack):
    body = anthropic_body("redis outage", max_tokens=10)
    post(cstack, body)
    cstack.redis.stop()
    r = post(cstack, body)
    assert r.headers["x-zccp-cache"] == "ERROR"
    assert r.json()["type"] == "message"
    metrics = cstack.admin_client().get("/metrics").text
    errors = [ln for ln in metrics.splitlines() if ln.startswith("zccp_engine_cache_errors_total")]
    assert errors and float(errors[0].split()[-1]) >= 1
    cstack.redis.start()
    deadline = time.monotonic() + 20
    status = "ERROR"
    while time.monotonic() < deadline and status != "MISS":
        time.sleep(0.3)
        status = post(cstack, body).headers["x-zccp-cache"]
    assert status == "MISS"   # Redis came back empty: the cache works again
    assert post(cstack, body).headers["x-zccp-cache"] == "HIT"
    cstack.assert_no_leaks()


def test_nginx_writes_the_fingerprint_the_engine_would_compute(make_stack):
    # The null model, and room in the token array for prompts past nginx's decode limit.
    cstack = make_stack({"model": {"backend": "null", "max_context": 200000},
                         "shared_memory": {"segment_size_kb": 1536, "tokens_kb": 768}}, with_redis=True)
    import hashlib
    import json

    from zccp.transport.abi import Flag, ffi
    from zccp.cache.fingerprint import DECODE_LIMIT, compute
    from zccp.cache.mask_store import load_masks

    body = json.dumps(anthropic_body("Fingerprint me, user alice@example.com", max_tokens=5)).encode()
    r = cstack.client().post("/v1/messages", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200
    fp = compute("anthropic", body, load_masks())
    reader = cstack.arena()
    try:
        (slot,) = [s for s in reader.slots() if s.sha256 == hashlib.sha256(body).digest()]
        assert slot.flags & Flag.FP_VALID and slot.flags & Flag.FP_COMPLETE and slot.flags & Flag.MASKED
        meta = reader.meta(slot.index)
        assert bytes(ffi.buffer(meta.exact_key, 32)) == fp.exact_key
        assert tuple(int(b) for b in meta.csf_bands) == fp.bands
        assert meta.fp_tokens == fp.tokens
    finally:
        reader.close()
    # A body too large for nginx to decode: no fingerprint in the slot, the engine
    # computes it, and the cache still works.
    big = anthropic_body("word " * (DECODE_LIMIT // 5 + 100), max_tokens=5)
    assert len(json.dumps(big)) > DECODE_LIMIT
    assert post(cstack, big).headers["x-zccp-cache"] == "MISS"
    assert post(cstack, big).headers["x-zccp-cache"] == "HIT"


def test_a_masked_value_in_the_system_prompt_does_not_defeat_near_hits(cstack):
    post(cstack, anthropic_body(LONG, max_tokens=20, system="Current time: 2024-05-01T12:00:00Z. Be brief."))
    r = post(cstack, anthropic_body(LONG + "\n", max_tokens=20, system="Current time: 2025-11-30T08:15:00Z. Be brief."))
    assert r.headers["x-zccp-cache"] == "NEAR"


def test_no_cache_no_store_touches_nothing(cstack):
    body = anthropic_body("fully bypassed", max_tokens=8)
    r = post(cstack, body, **{"cache-control": "no-cache, no-store"})
    assert r.headers["x-zccp-cache"] == "BYPASS"
    assert post(cstack, body).headers["x-zccp-cache"] == "MISS"   # nothing was stored


# ------------------------------------------------------------------- near candidates are checked

# One of bench/cache_eval's false hits of the MinHash estimate (two unrelated ShareGPT first
# turns): all 128 MinHash values agree, but the words differ.
FALSE_STORED = "continue\n \n \n \n 지금 번역하기"
FALSE_QUERY = "&지금 번역하기"


def _stored(s, body):
    assert post(s, body).headers["x-zccp-cache"] == "MISS"
    for _ in range(100):           # the store lands just after the answer
        if post(s, body).headers["x-zccp-cache"] == "HIT":
            return
        time.sleep(0.02)
    raise AssertionError("the answer was never stored")


def test_a_candidate_only_the_estimate_calls_similar_is_not_served(cstack):
    _stored(cstack, anthropic_body(FALSE_STORED, max_tokens=20, temperature=0))
    assert post(cstack, anthropic_body(FALSE_QUERY, max_tokens=20, temperature=0)).headers["x-zccp-cache"] == "MISS"
    # the same words with other spacing are served
    r = post(cstack, anthropic_body("continue 지금  번역하기 ", max_tokens=20, temperature=0))
    assert r.headers["x-zccp-cache"] == "NEAR" and float(r.headers["x-zccp-similarity"]) == 1.0


def test_near_candidates_of_bodies_nginx_does_not_decode_are_checked_too(make_stack):
    # a system prompt past nginx's decode limit: the engine fingerprints the body itself
    from zccp.cache.fingerprint import DECODE_LIMIT
    s = make_stack({"model": {"backend": "null", "max_context": 200000},
                    "shared_memory": {"segment_size_kb": 1536, "tokens_kb": 768}}, with_redis=True)
    system = "Context: " + "background " * (DECODE_LIMIT // 11 + 100)
    _stored(s, anthropic_body(LONG, max_tokens=20, system=system))
    r = post(s, anthropic_body("Hi! " + LONG.lower(), max_tokens=20, system=system))
    assert r.headers["x-zccp-cache"] == "NEAR" and 0.85 <= float(r.headers["x-zccp-similarity"]) < 1.0
    r = post(s, anthropic_body(LONG.replace("northern", "southern", 1), max_tokens=20, system=system))
    assert r.headers["x-zccp-cache"] == "MISS"
    _stored(s, anthropic_body(FALSE_STORED, max_tokens=20, system=system))
    assert post(s, anthropic_body(FALSE_QUERY, max_tokens=20, system=system)).headers["x-zccp-cache"] == "MISS"


@pytest.mark.parametrize("record", [
    b"p" * 32 + b"\x00" + b"\x01" * 512,          # the format before shingle sets (no version byte)
    b"\x02" + b"\xff" * 600,                      # version 2 (shingle sets), garbage
    b"\x03" + b"\xff" * 600,                      # version 3, garbage
    b"",
])
def test_a_malformed_near_record_is_a_miss(cstack, record):
    import redis
    _stored(cstack, anthropic_body(LONG, max_tokens=20))
    edited = anthropic_body(LONG + "\n", max_tokens=20)
    with redis.Redis.from_url(cstack.cfg.cache.redis_url) as r:
        keys = list(r.scan_iter(match="zccp:v2:*:s:*"))
        assert keys
        for k in keys:
            r.set(k, record)
    assert post(cstack, edited).headers["x-zccp-cache"] == "MISS"
    assert post(cstack, anthropic_body(LONG, max_tokens=20)).headers["x-zccp-cache"] == "HIT"   # the entry itself
