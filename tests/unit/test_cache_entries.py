"""Entries read back from Redis are input: malformed ones are misses, never crashes."""

from __future__ import annotations

import pytest

from zccp.cache.answer import CachedAnswer
from zccp.cache.fp.csf import estimate_jaccard as jaccard_estimate
from zccp.cache.keys import CacheKeys, scope_key
from zccp.request import ChatMessage, GenerationRequest, SamplingParams


def test_round_trip():
    a = CachedAnswer("héllo", "end_turn", None, 3, (2, 3), 1.5)
    assert CachedAnswer.from_json(a.to_json()) == a


@pytest.mark.parametrize("raw", [
    b"", b"not json", b"[]", b'{"text": 1}',
    b'{"text":"ab","stop_reason":"bogus","stop_sequence":null,"output_tokens":1,"deltas":[2],"created":0}',
    b'{"text":"ab","stop_reason":"end_turn","stop_sequence":null,"output_tokens":1,"deltas":[5],"created":0}',
    b'{"text":"ab","stop_reason":"end_turn","stop_sequence":null,"output_tokens":"x","deltas":[2],"created":0}',
])
def test_malformed_entries_are_misses(raw):
    assert CachedAnswer.from_json(raw) is None


def _req(**kw):
    base = dict(api="anthropic", model="m", system="", messages=(ChatMessage("user", "hi"),),
                sampling=SamplingParams(max_tokens=5))
    base.update(kw)
    return GenerationRequest(**base)


def test_scope_covers_parameters_and_system_but_not_the_conversation():
    a = _req()
    assert scope_key(a) == scope_key(_req(messages=(ChatMessage("user", "other words"),)))
    for other in (_req(model="n"), _req(system="s"), _req(sampling=SamplingParams(max_tokens=6)),
                  _req(sampling=SamplingParams(max_tokens=5, temperature=0.5)), _req(api="openai"),
                  _req(sampling=SamplingParams(max_tokens=5, stop=("x",))), _req(scope_extra=b'{"tools":[]}')):
        assert scope_key(other) != scope_key(a)


def test_near_requires_a_full_signature():
    assert not CacheKeys(b"x" * 32, b"s" * 32, (), ()).near_ok
    assert CacheKeys(b"x" * 32, b"s" * 32, tuple(range(16)), tuple(range(128))).near_ok
    assert jaccard_estimate(tuple(range(128)), tuple(range(128))) == 1.0
    assert jaccard_estimate(tuple(range(128)), tuple(range(1, 129))) == 0.0
