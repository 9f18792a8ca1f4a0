"""vLLM's sampling extensions on the OpenAI endpoints, through the real stack (nginx, the
engine's batch scheduler, the tiny model): each is accepted (the openai SDK's extra_body,
as self-hosting clients send them), bounded (400 naming the field), and changes the answer
as vLLM documents it; the cache never answers a request with one made without them."""

from __future__ import annotations

import openai
import pytest

from tests.support.cache_requests import req

MODEL = "zccp-tiny"
PROMPTS = ["Say something.", "Hello there", "What is 2+2?", "Tell me a story.", "hi", "ok"]


@pytest.fixture(scope="module")
def sdk_stack(stack):
    return stack


def _chat(oai, content: str, max_tokens: int = 64, **extra):
    r = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                    max_tokens=max_tokens, temperature=0, extra_body=extra or None)
    return r.choices[0].message.content, r.usage.completion_tokens, r.choices[0].finish_reason


@pytest.fixture(scope="module")
def early(oai) -> tuple[str, str, int]:
    """A prompt whose greedy answer ends (EOS) well before 64 tokens: (prompt, text, tokens)."""
    for p in PROMPTS:
        text, n, reason = _chat(oai, p)
        if reason == "stop" and 4 <= n <= 40 and len(set(text)) >= 4:
            return p, text, n
    raise AssertionError("no prompt ends early with the tiny model")


def test_ignore_eos_runs_to_max_tokens(oai, early):
    prompt, text, n = early
    long, m, reason = _chat(oai, prompt, ignore_eos=True)
    assert (m, reason) == (64, "length") and long.startswith(text) and len(long) > len(text)
    done = oai.completions.create(model=MODEL, prompt=prompt, max_tokens=48, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert done.usage.completion_tokens == 48 and done.choices[0].finish_reason == "length"


def test_min_tokens_holds_eos_and_stop_sequences_back(oai, early):
    prompt, text, n = early
    held, m, _ = _chat(oai, prompt, min_tokens=n + 10)
    assert m >= n + 10 and held.startswith(text)
    stop = text[1:3]
    assert _chat(oai, prompt, stop=[stop])[0] == text[:text.index(stop)]
    late, m, _ = _chat(oai, prompt, stop=[stop], min_tokens=4)
    assert m >= 4 and late.startswith(text[:4])


def test_stop_token_ids_end_the_answer_keeping_the_token(oai, early):
    prompt, text, n = early
    ch = text[2]                      # the tiny model's tokens are bytes: a character's id is its byte
    out, m, reason = _chat(oai, prompt, stop_token_ids=[ord(ch)])
    assert out == text[:text.index(ch) + 1] and reason == "stop" and m == len(out.encode())
    # held back until min_tokens, like EOS
    out, m, _ = _chat(oai, prompt, stop_token_ids=[ord(ch)], min_tokens=n + 5)
    assert m >= n + 5


def test_top_k_and_min_p_restrict_the_draw(oai, early):
    prompt, text, _ = early

    def draws(**extra) -> set[str]:
        return {oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                            max_tokens=12, temperature=1.0, seed=s,
                                            extra_body=extra or None).choices[0].message.content
                for s in range(6)}

    assert len(draws()) > 1                                # sampled: the seeds differ
    assert draws(top_k=1) == {text[:12]} == draws(min_p=1.0)   # only the most likely token is left
    assert len(draws(top_k=-1)) > 1                        # vLLM's "no top-k"


def test_repetition_penalty_changes_the_answer(oai, early):
    prompt, text, _ = early
    assert _chat(oai, prompt, repetition_penalty=1.0)[0] == text
    assert _chat(oai, prompt, repetition_penalty=1.8)[0] != text


@pytest.mark.parametrize("field,value", [
    ("ignore_eos", "yes"), ("min_tokens", -1), ("min_tokens", 65), ("top_k", -2), ("top_k", 1 << 21),
    ("top_k", 1.5), ("min_p", 1.5), ("min_p", -0.1), ("repetition_penalty", 0), ("repetition_penalty", 11),
    ("stop_token_ids", [-1]), ("stop_token_ids", list(range(65))), ("stop_token_ids", "x"),
    ("stop_token_ids", [10 ** 9]),
])
def test_each_field_is_bounded(oai, field, value):
    with pytest.raises(openai.BadRequestError) as e:
        _chat(oai, "hi", **{field: value})
    assert e.value.body["param"].startswith(field), e.value.body
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model=MODEL, prompt="hi", max_tokens=64, extra_body={field: value})
    assert e.value.body["param"].startswith(field), e.value.body


def test_the_cache_keeps_them_apart(make_stack):
    s = make_stack({"cache": {"ttl_s": 600}}, with_redis=True)
    with s.client(timeout=30) as c:
        body = req("openai", [{"role": "user", "content": "Say something."}], max_tokens=64)
        first = c.post("/v1/chat/completions", json=body)
        again = c.post("/v1/chat/completions", json=body)
        longer = c.post("/v1/chat/completions", json={**body, "ignore_eos": True})
    assert [r.status_code for r in (first, again, longer)] == [200] * 3
    assert (first.headers["x-zccp-cache"], again.headers["x-zccp-cache"]) == ("MISS", "HIT")
    assert longer.headers["x-zccp-cache"] == "MISS"
    assert longer.json()["usage"]["completion_tokens"] == 64
    s.assert_no_leaks()
