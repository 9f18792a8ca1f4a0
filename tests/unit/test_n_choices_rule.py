"""One rule for a request of more sequences than the model's queue holds (zccp.api.bounds
never_fits): the parsers apply it to everything they queue (Chat Completions' n,
/v1/completions' prompts x n) with a 400 naming `n`; the queue's NEVER, which only guards a
path that forgot to ask, answers with the very same 400; and at the boundary the two agree."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tests.support.fake_api import LIMITS, MODEL
from zccp.api import completions, openai
from zccp.serving.fair_queue import Admission, FairQueue, refusal
from zccp.shared_types import ApiError

USER = {"role": "user", "content": "Hello"}


def _chat(n: int) -> dict[str, Any]:
    return {"model": MODEL, "messages": [USER], "n": n}


def _prompts(count: int, n: int) -> dict[str, Any]:
    return {"model": MODEL, "prompt": ["p"] * count, "n": n}


def _parse_error(parse: Any, doc: dict[str, Any], max_queue: int) -> ApiError | None:
    try:
        parse(doc, replace(LIMITS, max_queue=max_queue))
    except ApiError as exc:
        return exc
    return None


@pytest.mark.parametrize("max_queue", [1, 3, 8])
def test_the_parsers_refuse_exactly_what_the_queue_could_never_take(max_queue: int) -> None:
    cases = [(openai.parse_document, _chat(n), n) for n in (1, max_queue, max_queue + 1, 2 * max_queue)]
    cases += [(completions.parse_document, _prompts(p, n), p * n) for p in (1, 2, 3) for n in (1, 2, max_queue)]
    for parse, doc, sequences in cases:
        never = FairQueue(max_queue).reserve(b"tenant", sequences) is Admission.NEVER
        err = _parse_error(parse, doc, max_queue)
        assert (err is not None) == never, (doc, max_queue)
        if err is not None:
            assert (err.status, err.param) == (400, "n") and "model.max_queue" in err.message


def test_the_queue_guard_answers_with_the_parsers_400() -> None:
    err = _parse_error(openai.parse_document, _chat(9), 8)
    assert err is not None
    guard = refusal(Admission.NEVER, 9, 8)
    assert (guard.status, guard.kind, guard.param, guard.message) == (400, err.kind, "n", err.message)
    full = refusal(Admission.FULL, 1, 8)
    assert (full.status, full.kind) == (429, "rate_limit_error")     # full is the retryable one
