"""Anthropic's streamed usage as Anthropic sends it, its thinking-budget refusals, and the
refusals of a backend without logits (the null model) for what needs them."""

from __future__ import annotations

import anthropic
import pytest

from tests.support.harness import sdk_clients


@pytest.fixture(scope="module")
def sdk_stack(stack):
    return stack


def test_message_delta_usage_is_cumulative(claude, stack):
    events = []
    # Greedy: a sampled answer of the tiny model may end at its first token (0 output tokens).
    with claude.messages.stream(model="zccp-tiny", max_tokens=20, extra_body={"temperature": 0},
                                messages=[{"role": "user", "content": "Count my input."}]) as s:
        for ev in s:
            events.append(ev)
        final = s.get_final_message()
    delta = [e for e in events if e.type == "message_delta"][0]
    start = [e for e in events if e.type == "message_start"][0]
    # the input and cache fields ride on message_delta too (clients read usage from it)
    assert delta.usage.input_tokens == start.message.usage.input_tokens > 0
    assert delta.usage.cache_read_input_tokens == 0 and delta.usage.cache_creation_input_tokens == 0
    assert final.usage.input_tokens == start.message.usage.input_tokens
    assert final.usage.output_tokens == delta.usage.output_tokens > 0


def test_thinking_budget_refused_as_anthropic_refuses_it(claude):
    for budget, max_tokens in ((512, 4096), (2048, 2048)):
        with pytest.raises(anthropic.BadRequestError) as info:
            claude.messages.create(model="zccp-tiny", max_tokens=max_tokens,
                                   thinking={"type": "enabled", "budget_tokens": budget},
                                   messages=[{"role": "user", "content": "hi"}])
        assert info.value.body["error"]["type"] == "invalid_request_error"
    ok = claude.messages.create(model="zccp-tiny", max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024},
                                messages=[{"role": "user", "content": "hi"}])
    assert ok.type == "message"


def test_a_model_without_logits_refuses_what_needs_them(null_stack):
    claude, oai = sdk_clients(null_stack)
    import openai

    user = [{"role": "user", "content": "hi"}]
    for kw in ({"response_format": {"type": "json_object"}}, {"logprobs": True},
               {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"}):
        with pytest.raises(openai.BadRequestError) as info:
            oai.chat.completions.create(model="zccp-tiny", messages=user, **kw)
        assert "logits" in info.value.message
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="zccp-tiny", max_tokens=10, messages=user,
                               output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}})
