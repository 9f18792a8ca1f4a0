"""Every sampling/API parameter changes what comes back when it should (no silent ignores)."""

from __future__ import annotations

import pytest

MODEL = "zccp-tiny"
PROMPT = [{"role": "user", "content": "Tell me something about shared memory."}]


def _ok(stack, path, **kw):
    body = {"model": MODEL, "max_tokens": 24, "messages": PROMPT}
    body.update(kw)
    r = stack.client().post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def msg(stack, **kw):
    return _ok(stack, "/v1/messages", **kw)


def chat(stack, **kw):
    return _ok(stack, "/v1/chat/completions", **kw)


def text(m):
    return m["content"][0]["text"]


def test_temperature_zero_is_deterministic_and_sampling_is_not(stack):
    greedy = {text(msg(stack, temperature=0)) for _ in range(3)}
    assert len(greedy) == 1
    sampled = {text(msg(stack, temperature=1)) for _ in range(6)}
    assert len(sampled) > 1


def test_top_k_one_and_tiny_top_p_are_greedy(stack):
    greedy = text(msg(stack, temperature=0))
    assert {text(msg(stack, temperature=1, top_k=1)) for _ in range(3)} == {greedy}
    assert {text(msg(stack, temperature=1, top_p=1e-6)) for _ in range(3)} == {greedy}


def test_max_tokens_is_applied(stack):
    m = msg(stack, max_tokens=3, temperature=0)
    assert m["usage"]["output_tokens"] <= 3
    long = msg(stack, max_tokens=40, temperature=0)
    if long["stop_reason"] == "max_tokens":
        assert long["usage"]["output_tokens"] == 40
    c = chat(stack, max_completion_tokens=2, max_tokens=30, temperature=0)
    assert c["usage"]["completion_tokens"] <= 2


def test_stop_sequences(stack):
    full = text(msg(stack, temperature=0, max_tokens=40))
    if len(full) < 6:
        pytest.skip("greedy reply too short to cut")
    stop = full[3:5]
    cut = msg(stack, temperature=0, max_tokens=40, stop_sequences=[stop])
    assert cut["stop_reason"] == "stop_sequence" and cut["stop_sequence"] == stop
    assert text(cut) == full[: full.index(stop)]
    c = chat(stack, temperature=0, max_tokens=40, stop=stop)
    assert c["choices"][0]["finish_reason"] == "stop"
    assert c["choices"][0]["message"]["content"] == full[: full.index(stop)]


def test_system_prompt_reaches_the_model(stack):
    a = msg(stack, temperature=0, max_tokens=40)
    b = msg(stack, temperature=0, max_tokens=40, system="You are terse.")
    assert b["usage"]["input_tokens"] > a["usage"]["input_tokens"]


def test_openai_seed_makes_sampling_reproducible(stack):
    one = chat(stack, temperature=1, seed=1234)["choices"][0]["message"]["content"]
    two = chat(stack, temperature=1, seed=1234)["choices"][0]["message"]["content"]
    other = {chat(stack, temperature=1, seed=s)["choices"][0]["message"]["content"] for s in range(5)}
    assert one == two
    assert len(other) > 1


def test_openai_n_user_and_unknown_fields(stack):
    assert chat(stack, n=1, user="u-1")["choices"][0]["index"] == 0
    r = stack.client().post("/v1/chat/completions", json={"model": MODEL, "n": 3, "messages": PROMPT})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    r = stack.client().post("/v1/chat/completions", json={"model": MODEL, "messages": PROMPT, "bogus": 1})
    assert r.status_code == 400 and "bogus" in r.json()["error"]["message"]


def test_anthropic_metadata_accepted_and_validated(stack):
    assert msg(stack, metadata={"user_id": "abc"})["type"] == "message"
    r = stack.client().post("/v1/messages", json={"model": MODEL, "max_tokens": 5, "messages": PROMPT,
                                                  "metadata": {"user_id": 5}})
    assert r.status_code == 400 and "metadata" in r.json()["error"]["message"]


def test_chunked_prefill_plan_is_shown_and_gives_the_same_answer(make_stack, stack):
    chunked = make_stack({"model": {"prefill_chunk": 64}})
    body = {"model": MODEL, "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": "chunk " * 50}]}
    a = chunked.client().post("/v1/messages", json=body)
    b = stack.client().post("/v1/messages", json=body)
    assert a.status_code == b.status_code == 200
    n = a.json()["usage"]["input_tokens"]
    assert a.headers["x-zccp-plan"] == f"chunked:{-(-n // 64)}"
    assert "x-zccp-plan" not in b.headers
    assert a.json()["content"] == b.json()["content"]
