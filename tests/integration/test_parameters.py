"""Every sampling/API parameter changes what comes back when it should (no silent ignores)."""

from __future__ import annotations

import pytest

from zccp.serving.planner import CPU_STEP_TOKENS

from tests.support.harness import Stack

MODEL = "zccp-tiny"
PROMPT = [{"role": "user", "content": "Tell me something about shared memory."}]
# The paced null backend's answer: known in advance, so where max_tokens and stop sequences
# cut it is certain (the tiny model's greedy reply may end before the cut a test wants).
REPLY = "Shared memory lets nginx and the engine read the same bytes, with no copy between them."


@pytest.fixture(scope="module")
def paced(tmp_path_factory):
    """The null backend with a per-token delay: its tokens go one at a time through the batch
    scheduler and the output path the tiny model's take (max_tokens, stop sequences), not the
    instant null backend's inline shortcut."""
    s = Stack(tmp_path_factory.mktemp("paced"), {"model": {"backend": "null", "name": MODEL, "null_reply": REPLY,
                                                           "null_token_delay_ms": 1}})
    try:
        yield s.start()
    finally:
        s.stop()


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


def test_max_tokens_is_applied(stack, paced):
    m = msg(stack, max_tokens=3, temperature=0)
    assert m["usage"]["output_tokens"] <= 3
    c = chat(stack, max_completion_tokens=2, max_tokens=30, temperature=0)
    assert c["usage"]["completion_tokens"] <= 2
    # an answer longer than max_tokens: cut at exactly max_tokens, and said so
    long = msg(paced, max_tokens=40)
    assert (long["stop_reason"], long["usage"]["output_tokens"], text(long)) == ("max_tokens", 40, REPLY[:40])
    c = chat(paced, max_completion_tokens=2, max_tokens=30)
    assert (c["choices"][0]["finish_reason"], c["usage"]["completion_tokens"]) == ("length", 2)
    whole = msg(paced, max_tokens=len(REPLY) + 8)
    assert (whole["stop_reason"], text(whole)) == ("end_turn", REPLY)


def test_stop_sequences(paced):
    full = text(msg(paced, temperature=0, max_tokens=40))
    assert full == REPLY[:40]
    stop = full[3:5]
    cut = msg(paced, temperature=0, max_tokens=40, stop_sequences=[stop])
    assert cut["stop_reason"] == "stop_sequence" and cut["stop_sequence"] == stop
    assert text(cut) == full[: full.index(stop)]
    c = chat(paced, temperature=0, max_tokens=40, stop=stop)
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
    r = stack.client().post("/v1/chat/completions", json={"model": MODEL, "n": 3, "logprobs": True,
                                                          "messages": PROMPT})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"      # n > 1 has no logprobs
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
    # the default stack's chunks: its device's step budget (a GPU's is longer than this prompt)
    cpu = f"chunked:{-(-n // CPU_STEP_TOKENS)}" if n > CPU_STEP_TOKENS else None
    assert b.headers.get("x-zccp-plan") in (cpu, None)
    assert a.json()["content"] == b.json()["content"]
