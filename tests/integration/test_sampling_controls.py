"""OpenAI's sampling controls through the real stack (the tiny model, the batch scheduler):
logit_bias, presence/frequency penalties, a seed that reproduces whatever shares the batch,
and a cache that never answers a request with another one's response_format, logit_bias,
output_config or forced tool."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.cache_requests import cache_of, req, stored


@pytest.fixture(scope="module")
def sdk_stack(stack):
    return stack


USER = [{"role": "user", "content": "Say something."}]


def test_logit_bias_forces_a_token(oai):
    done = oai.chat.completions.create(model="zccp-tiny", messages=USER, max_tokens=12, temperature=0,
                                       logit_bias={str(ord("A")): 100})
    assert done.choices[0].message.content == "A" * 12


def test_frequency_penalty_breaks_the_forced_repeat(oai):
    # +40 on "A" and 2.0 per use: after ~20 uses other tokens win
    done = oai.chat.completions.create(model="zccp-tiny", messages=USER, max_tokens=60, temperature=0,
                                       logit_bias={str(ord("A")): 40}, frequency_penalty=2.0)
    text = done.choices[0].message.content
    assert text.startswith("A" * 15) and 15 <= text.count("A") < 30


def test_a_seed_reproduces_its_answer_whatever_shares_the_batch(oai):
    def one(i: int) -> str:
        seeded = i % 3 == 0
        done = oai.chat.completions.create(
            model="zccp-tiny", messages=[{"role": "user", "content": "Seeded." if seeded else f"Other {i}."}],
            max_tokens=40, temperature=1.0, seed=7 if seeded else i)
        return done.choices[0].message.content

    alone = one(0)
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(one, range(9)))
    assert [together[i] for i in (0, 3, 6)] == [alone] * 3


SCHEMA = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"],
          "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "f", "parameters": SCHEMA}}


def test_the_cache_keeps_every_output_control_apart(make_stack):
    s = make_stack({}, with_redis=True)
    base = req("openai", USER, max_tokens=20)
    stored(s, "openai", base)
    for n, extra in enumerate([
        {"response_format": {"type": "json_object"}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}},
        {"logit_bias": {"65": 50}},
        {"presence_penalty": 1.0},
        {"tools": [TOOL], "tool_choice": "required"},
    ]):
        assert cache_of(s, "openai", {**base, **extra}) == "MISS", extra
        if "tools" in extra:
            continue                 # a forced call is a tool call, at any max_tokens: never stored
        stored(s, "openai", {**base, **extra, "max_tokens": 21 + n})
    other = {**SCHEMA, "properties": {"a": {"enum": ["z"]}}}
    assert cache_of(s, "openai", {**base, "response_format": {"type": "json_schema", "json_schema": {
        "name": "s", "schema": other}}}) == "MISS"
    assert cache_of(s, "openai", {**base, "logit_bias": {"65": 51}}) == "MISS"
    abase = req("anthropic", USER, max_tokens=20)
    stored(s, "anthropic", abase)
    assert cache_of(s, "anthropic", {**abase, "output_config": {"format": {"type": "json_schema",
                                                                           "schema": SCHEMA}}}) == "MISS"
    s.assert_no_leaks()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_logprobs_and_top_logprobs(oai, stream):
    import math

    kw = dict(model="zccp-tiny", messages=USER, max_tokens=16, temperature=0, logprobs=True, top_logprobs=3)
    if stream:
        chunks = list(oai.chat.completions.create(stream=True, **kw))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        items = [i for c in chunks if c.choices and c.choices[0].logprobs for i in c.choices[0].logprobs.content]
    else:
        done = oai.chat.completions.create(**kw)
        text, items = done.choices[0].message.content, done.choices[0].logprobs.content
    assert "".join(i.token for i in items) == text          # one entry per generated token, in order
    assert 0 < len(items) <= 16
    for i in items:
        assert i.logprob <= 0 and bytes(i.bytes).decode() == i.token
        assert len(i.top_logprobs) == 3
        tops = [t.logprob for t in i.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert math.isclose(i.logprob, tops[0], abs_tol=1e-5)   # greedy: the chosen token is the likeliest
    # the same request again is generated again (logprobs are never served from a cache entry)
    assert oai.chat.completions.with_raw_response.create(**{**kw, "stream": False}).headers.get(
        "x-zccp-cache") in (None, "BYPASS")


def test_n_choices(oai):
    kw = dict(model="zccp-tiny", messages=USER, max_tokens=24, temperature=1.0, seed=11, n=3)
    done = oai.chat.completions.create(**kw)
    assert [c.index for c in done.choices] == [0, 1, 2]
    texts = [c.message.content for c in done.choices]
    assert len(set(texts)) == 3                          # seed s: choice i draws with s + i
    # the tiny model's tokens are bytes (EOS is not counted); the prompt counts once
    assert done.usage.completion_tokens == sum(len(t.encode()) for t in texts)
    # each choice is the answer of n=1 with seed s + i (reproducible)
    one = oai.chat.completions.create(**{**kw, "n": 1, "seed": 12})
    assert one.choices[0].message.content == texts[1]
    again = oai.chat.completions.create(**kw)
    assert [c.message.content for c in again.choices] == texts     # generated again, the same
