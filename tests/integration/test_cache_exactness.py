"""Exact keys and replays through the real nginx + engine + Redis: an integer seed keeps its
digits in the key (fingerprint.md §6), and nginx's L1 and the engine's replay report one
usage for one entry (docs/cache.md, "L1 in nginx")."""

from __future__ import annotations

import json

from tests.support.cache_requests import NULL, cache_of, post, stored
from tests.support.hf_checkpoint import HF_MODEL


def openai_body(seed: int | None = None, **extra) -> dict:
    b = {"model": "zccp-tiny", "max_tokens": 12, "temperature": 0,
         "messages": [{"role": "user", "content": "Pick a number"}], **extra}
    if seed is not None:
        b["seed"] = seed
    return b


def test_seeds_beyond_2_53_are_different_requests(make_stack):
    s = make_stack({"model": NULL}, with_redis=True)
    big = 2**53 + 1                 # a double would round it to 2**53
    stored(s, "openai", openai_body(big))
    assert cache_of(s, "openai", openai_body(2**53)) == "MISS"
    assert cache_of(s, "openai", openai_body(big + 2)) == "MISS"
    assert cache_of(s, "openai", openai_body(big)) == "HIT"
    # the same seed spelled otherwise is the same request (below 2^53: one double)
    stored(s, "openai", openai_body(12345))
    raw = json.dumps(openai_body(12345)).replace("12345", "12345.0").encode()
    r = s.client().post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code in (200, 400)   # the API may refuse a non-integer spelling; never another key's answer
    if r.status_code == 200:
        assert r.headers["x-zccp-cache"] == "HIT"


def test_an_l1_hit_and_the_engines_replay_report_the_same_usage(make_stack, hf_checkpoint):
    # Two spellings of one request (one exact key) whose prompts differ: the chat template
    # renders the tool schema's number as written (1.0 / 1), so they count other tokens.
    s = make_stack({"model": {"backend": "hf", "path": str(hf_checkpoint), "name": HF_MODEL, "max_context": 4096,
                              "prefill_chunk": 64}}, with_redis=True)

    def spelled(n: str) -> bytes:
        tool = {"type": "function", "function": {"name": "pick", "parameters": {
            "type": "object", "properties": {"n": {"type": "number", "minimum": 0}}}}}
        body = {"model": HF_MODEL, "max_tokens": 6, "temperature": 0, "tools": [tool],
                "messages": [{"role": "user", "content": "Pick a number"}]}
        return json.dumps(body).replace('"minimum": 0', f'"minimum": {n}').encode()

    def send(raw: bytes):
        r = s.client().post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        return r.headers["x-zccp-cache"], r.headers.get("x-zccp-cache-layer"), r.json()["usage"]

    a, b = spelled("0.0"), spelled("0")
    status, _, first = send(a)
    assert status == "MISS"
    for _ in range(100):                       # the store lands just after the answer
        status, layer, other = send(b)         # the other spelling: the engine's replay
        if status == "HIT":
            break
    assert (status, layer) == ("HIT", "L2")
    status, layer, kept = send(b)              # now kept by nginx: L1's replay of those bytes
    assert (status, layer) == ("HIT", "L1")
    status, layer, alias = send(a)             # ... and by the exact key, for the first spelling
    assert (status, layer) == ("HIT", "L1")
    # one entry, one usage: the request it was made for, whichever layer and spelling answers
    assert other == kept == alias
    assert other["prompt_tokens"] == first["prompt_tokens"]
    assert first["completion_tokens"] == other["completion_tokens"]
    # ... though the other spelling's own prompt is another size (what the engine used to report)
    r = s.client().post("/v1/chat/completions", content=b,
                        headers={"content-type": "application/json", "cache-control": "no-cache, no-store"})
    assert r.headers["x-zccp-cache"] == "BYPASS"
    assert r.json()["usage"]["prompt_tokens"] != first["prompt_tokens"]


def test_a_masked_hit_counts_its_own_prompt(make_stack):
    s = make_stack({"model": NULL}, with_redis=True)
    short = openai_body(messages=[{"role": "user", "content": "Summarise ticket P1234567"}])
    long_ = openai_body(messages=[{"role": "user", "content": "Summarise ticket P123456789012"}])
    stored(s, "openai", short)
    r = post(s, "openai", long_)
    assert r.headers["x-zccp-cache"] == "HIT"
    assert r.json()["usage"]["prompt_tokens"] == post(s, "openai", short).json()["usage"]["prompt_tokens"] + 5
