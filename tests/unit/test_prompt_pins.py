"""cache_control breakpoints: parsed and checked as Anthropic checks them, and placed in the
prompt by the backend's own format (the byte format here: exact positions)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zccp.api import anthropic
from zccp.api.common import ParseLimits
from zccp.model.prompt import BYTE_FORMAT, Prompt
from zccp.prep.prompt_pins import pin_points, shared_prefix
from zccp.shared_types import ApiError, CacheMark

LIMITS = ParseLimits(frozenset({"m"}), max_tokens_cap=100, default_max_tokens=10)
CC = {"type": "ephemeral"}


def _ids(doc: dict) -> np.ndarray:
    req = anthropic.parse_document(doc, LIMITS)
    out = torch.empty(4096, dtype=torch.int32)
    n = BYTE_FORMAT.encode_into(Prompt(req, lambda: anthropic.chat_input(doc)), out)
    return out[:n].numpy().copy()


def _pins(doc: dict) -> list[tuple[int, int]]:
    req = anthropic.parse_document(doc, LIMITS)
    return [(p.tokens, p.ttl_s) for p in pin_points(BYTE_FORMAT, doc, req, LIMITS, _ids(doc))]


def test_marks_in_prompt_order_with_their_ttl():
    doc = {"model": "m", "max_tokens": 5,
           "tools": [{"name": "t", "input_schema": {"type": "object"}, "cache_control": {**CC, "ttl": "1h"}}],
           "system": [{"type": "text", "text": "sys", "cache_control": {**CC, "ttl": "1h"}}],
           "messages": [{"role": "user", "content": [{"type": "text", "text": "a", "cache_control": CC},
                                                     {"type": "text", "text": "b"}]}]}
    req = anthropic.parse_document(doc, LIMITS)
    assert req.cache_marks == (CacheMark("tools", 0, -1, 3600), CacheMark("system", 0, -1, 3600),
                               CacheMark("messages", 0, 0, 300))


@pytest.mark.parametrize("system", [
    [{"type": "text", "text": "x", "cache_control": CC}] * 5,
    [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "2h"}}],
    [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "size": 1}}],
    [{"type": "text", "text": "x", "cache_control": CC},
     {"type": "text", "text": "y", "cache_control": {**CC, "ttl": "1h"}}],
])
def test_refused_as_anthropic_refuses(system):
    with pytest.raises(ApiError) as info:
        anthropic.parse_document({"model": "m", "max_tokens": 5, "system": system,
                                  "messages": [{"role": "user", "content": "hi"}]}, LIMITS)
    assert info.value.status == 400


def test_byte_positions_are_exact():
    # BOS SYSTEM "rules\n\nmore" USER "doc\n\nq" ASSISTANT
    doc = {"model": "m", "max_tokens": 5,
           "tools": [{"name": "t", "input_schema": {"type": "object"}, "cache_control": CC}],
           "system": [{"type": "text", "text": "rules", "cache_control": CC}, {"type": "text", "text": "more"}],
           "messages": [{"role": "user", "content": [{"type": "text", "text": "doc", "cache_control": CC},
                                                     {"type": "text", "text": "q"}]}]}
    # the tools: not in the byte prompt, their cut shares BOS only; system block 0: BOS SYSTEM "rules";
    # message block 0: ... "more" USER "doc"
    assert _pins(doc) == [(1, 300), (2 + 5, 300), (2 + len("rules\n\nmore") + 1 + 3, 300)]


def test_a_cut_the_api_would_refuse_pins_nothing():
    doc = {"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "text", "text": "ends in a space ", "cache_control": CC}]},
        {"role": "user", "content": "go"}]}
    assert _pins(doc) == []


def test_shared_prefix():
    a = np.array([1, 2, 3, 4], dtype=np.int32)
    assert shared_prefix(a, np.array([1, 2, 9], dtype=np.int32)) == 2
    assert shared_prefix(a, a[:3]) == 3
    assert shared_prefix(a, np.array([], dtype=np.int32)) == 0


def _tool_turns(inner: list[dict], own: dict | None = None) -> dict:
    result = {"type": "tool_result", "tool_use_id": "tu_1", "content": inner, **({"cache_control": own} if own else {})}
    return {"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "tu_1", "name": "w", "input": {}}]},
        {"role": "user", "content": [result, {"type": "text", "text": "And now?"}]}]}


def test_breakpoints_inside_a_tool_result():
    """Anthropic takes cache_control on a tool_result's inner blocks too: a breakpoint each,
    before the tool_result's own, counted against the 4 and checked as the others."""
    inner = [{"type": "text", "text": "first", "cache_control": {**CC, "ttl": "1h"}}, {"type": "text", "text": "2nd"}]
    doc = _tool_turns(inner, CC)
    req = anthropic.parse_document(doc, LIMITS)
    assert req.cache_marks == (CacheMark("messages", 2, 0, 3600, 0), CacheMark("messages", 2, 0, 300))
    cut = anthropic.cut_at(doc, req.cache_marks[0])
    assert cut["messages"][2]["content"] == [{**doc["messages"][2]["content"][0], "content": inner[:1]}]
    assert cut["messages"][:2] == doc["messages"][:2]
    # the byte format shows a tool_result as one marker: both breakpoints end after it
    ids = _ids(doc)
    end = len(ids) - len("\n\nAnd now?") - 1          # ... "[tool_result]" | "\n\nAnd now?" ASSISTANT
    assert _pins(doc) == [(end, 3600), (end, 300)]
    for bad in ({"type": "ephemeral", "ttl": "2h"}, {"type": "other"}):
        with pytest.raises(ApiError):
            anthropic.parse_document(_tool_turns([{"type": "text", "text": "x", "cache_control": bad}]), LIMITS)
    with pytest.raises(ApiError):                      # 5 breakpoints, one of them inner
        anthropic.parse_document(_tool_turns([{"type": "text", "text": "x", "cache_control": CC}] * 5), LIMITS)
