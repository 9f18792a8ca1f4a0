"""A forced tool call at every max_tokens, through the real stack (nginx, slots, the engine's
batch scheduler, the tiny model under its grammar), on all three endpoints, streamed and
not: always a tool call (truncated at max_tokens as the real APIs answer), never
`<tool_call>` markup; max_tokens and usage count the arguments only (the wrapper is free,
docs/tools.md); streamed arguments arrive in several deltas that concatenate to the call's.

Greedy (temperature 0): each max_tokens's arguments are a prefix of the whole call's."""

from __future__ import annotations

import json
from typing import Any

import pytest

MODEL = "zccp-tiny"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                           "unit": {"enum": ["c", "f"]}},
          "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"name": "get_weather", "description": "Weather", "input_schema": SCHEMA}]
OAI_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]
RESP_TOOLS = [{"type": "function", "name": "get_weather", "parameters": SCHEMA}]
USER = [{"role": "user", "content": "Weather in Tokyo?"}]


@pytest.fixture(scope="module")
def sdk_stack(stack):
    return stack


@pytest.fixture(scope="module")
def whole(oai) -> tuple[str, int]:
    """The whole call's arguments and its output tokens (a budget it fits in)."""
    r = oai.chat.completions.create(model=MODEL, messages=USER, tools=OAI_TOOLS, tool_choice="required",
                                    max_tokens=200, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    args = c.message.tool_calls[0].function.arguments
    assert set(json.loads(args)) == {"city", "unit"}
    # billed: the arguments' tokens (the tiny model's are bytes), not the wrapper's
    assert r.usage.completion_tokens == len(args.encode())
    return args, r.usage.completion_tokens


def _check_prefix(args: str, full: str, k: int, n: int) -> None:
    """The arguments at max_tokens k: the whole call's first k tokens (bytes; a character cut
    in half is not shown), or all of it."""
    if k >= n:
        assert args == full
    else:
        assert full.startswith(args) and k - 4 < len(args.encode()) <= k, (k, args, full)


def _budgets(n: int) -> range:
    return range(1, n + 2)


def test_anthropic_forced_tool_at_every_max_tokens(claude, whole):
    full, n = whole
    for k in _budgets(n):
        kw: dict[str, Any] = dict(model=MODEL, messages=USER, tools=TOOLS, tool_choice={"type": "any"},
                                  max_tokens=k, extra_body={"temperature": 0})
        msg = claude.messages.create(**kw)
        assert [b.type for b in msg.content] == ["tool_use"], (k, msg.content)
        use = msg.content[0]
        assert use.name == "get_weather" and isinstance(use.input, dict)
        assert msg.usage.output_tokens == min(k, n)
        assert msg.stop_reason == ("tool_use" if k >= n else "max_tokens")
        if k >= n:
            assert use.input == json.loads(full)
        with claude.messages.stream(**kw) as s:
            events = list(s)
            final = s.get_final_message()
        pieces = [e.delta.partial_json for e in events
                  if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
        assert not any(e.type == "content_block_delta" and e.delta.type == "text_delta" for e in events)
        _check_prefix("".join(pieces), full, k, n)
        assert len(pieces) > 1 or k == 1
        assert [b.type for b in final.content] == ["tool_use"] and final.stop_reason == msg.stop_reason
        assert final.usage.output_tokens == min(k, n)


def test_openai_forced_tool_at_every_max_tokens(oai, whole):
    full, n = whole
    for k in _budgets(n):
        kw: dict[str, Any] = dict(model=MODEL, messages=USER, tools=OAI_TOOLS, tool_choice="required",
                                  max_tokens=k, temperature=0)
        r = oai.chat.completions.create(**kw)
        c = r.choices[0]
        assert c.message.content is None and len(c.message.tool_calls) == 1, (k, c.message)
        assert c.message.tool_calls[0].function.name == "get_weather"
        _check_prefix(c.message.tool_calls[0].function.arguments, full, k, n)
        assert c.finish_reason == ("tool_calls" if k >= n else "length")
        assert r.usage.completion_tokens == min(k, n)
        chunks = list(oai.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
        deltas = [tc for ch in chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or []]
        assert deltas[0].id.startswith("call_") and deltas[0].function.name == "get_weather"
        assert deltas[0].function.arguments == ""
        pieces = [d.function.arguments for d in deltas[1:]]
        assert len(pieces) > 1 or k == 1
        _check_prefix("".join(pieces), full, k, n)
        assert all(ch.choices[0].delta.content is None for ch in chunks if ch.choices)
        assert chunks[-2].choices[0].finish_reason == c.finish_reason
        assert chunks[-1].usage.completion_tokens == min(k, n)


def test_openai_tool_chunks_carry_content_null(oai, whole):
    """On the wire: null, not "" (the SDK's stream helper would see an empty text delta)."""
    with oai.chat.completions.with_streaming_response.create(
            model=MODEL, messages=USER, tools=OAI_TOOLS, tool_choice="required", max_tokens=5, temperature=0,
            stream=True) as raw:
        lines = [json.loads(line[6:]) for line in raw.iter_lines() if line.startswith("data: {")]
    tool_chunks = [d for d in lines if "tool_calls" in d["choices"][0]["delta"]]
    assert len(tool_chunks) > 1
    assert all(d["choices"][0]["delta"]["content"] is None for d in tool_chunks)
    assert lines[0]["choices"][0]["delta"] == {"role": "assistant", "content": None, "refusal": None}


def test_responses_forced_function_call_at_every_max_output_tokens(oai, whole):
    full, n = whole
    for k in _budgets(n):
        kw: dict[str, Any] = dict(model=MODEL, input="Weather in Tokyo?", tools=RESP_TOOLS, tool_choice="required",
                                  max_output_tokens=k, temperature=0)
        r = oai.responses.create(**kw)
        assert [o.type for o in r.output] == ["function_call"], (k, r.output)
        call = r.output[0]
        assert call.name == "get_weather" and call.status == ("completed" if k >= n else "incomplete")
        _check_prefix(call.arguments, full, k, n)
        assert r.status == ("completed" if k >= n else "incomplete")
        assert r.usage.output_tokens == min(k, n)
        events = list(oai.responses.create(stream=True, **kw))
        pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
        assert len(pieces) > 1 or k == 1
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert len(done) == 1 and done[0].arguments == "".join(pieces)
        _check_prefix("".join(pieces), full, k, n)
        assert not any(e.type == "response.output_text.delta" for e in events)
        final = events[-1].response
        assert [o.type for o in final.output] == ["function_call"] and final.output[0].arguments == "".join(pieces)
        assert final.usage.output_tokens == min(k, n)


# -- the upstream backend: the call comes from a peer (a ZCCP engine on the tiny model) ---------

@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    from tests.support.harness import Stack

    s = Stack(tmp_path_factory.mktemp("peer"), {})
    try:
        yield s.start()
    finally:
        s.stop()


@pytest.fixture(scope="module", params=["openai", "anthropic"])
def gateway(request, tmp_path_factory, peer):
    """A gateway whose engine forwards to `peer` over the upstream API request.param."""
    from tests.support.harness import Stack

    s = Stack(tmp_path_factory.mktemp(f"gw_{request.param}"), {
        "model": {"backend": "upstream", "name": "zccp-gw"},
        "upstream": {"urls": [peer.base_url + "/v1"], "api": request.param, "model": MODEL,
                     "connect_timeout_ms": 500, "read_timeout_ms": 20000}})
    s.upstream_api = request.param
    try:
        yield s.start()
    finally:
        s.stop()


def test_upstream_forced_tool_is_a_call_at_any_max_tokens(gateway):
    import anthropic
    import openai

    a = anthropic.Anthropic(base_url=gateway.base_url, api_key="k", max_retries=0, timeout=60)
    o = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="k", max_retries=0, timeout=60)
    r = o.chat.completions.create(model="zccp-gw", messages=USER, tools=OAI_TOOLS, tool_choice="required",
                                  max_tokens=200, temperature=0)
    full, n = r.choices[0].message.tool_calls[0].function.arguments, r.usage.completion_tokens
    assert n == len(full.encode())           # the peer's count, relayed: the arguments only
    for k in sorted({1, 2, n // 2, n - 1, n, n + 1}):
        kw: dict[str, Any] = dict(model="zccp-gw", messages=USER, max_tokens=k)
        msg = a.messages.create(tools=TOOLS, tool_choice={"type": "any"}, extra_body={"temperature": 0}, **kw)
        assert [b.type for b in msg.content] == ["tool_use"], (k, msg.content)
        assert isinstance(msg.content[0].input, dict) and msg.usage.output_tokens == min(k, n)
        assert msg.stop_reason == ("tool_use" if k >= n else "max_tokens")
        with a.messages.stream(tools=TOOLS, tool_choice={"type": "any"}, extra_body={"temperature": 0}, **kw) as s:
            pieces = [e.delta.partial_json for e in s
                      if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
            final = s.get_final_message()
        _check_prefix("".join(pieces), full, k, n)
        # relayed as the peer streamed them, not gathered into one delta at the end
        assert k < 2 or len([p for p in pieces if p]) > 1, (k, pieces)
        assert [b.type for b in final.content] == ["tool_use"] and final.stop_reason == msg.stop_reason
        for stream in (False, True):
            if stream:
                chunks = list(o.chat.completions.create(tools=OAI_TOOLS, tool_choice="required", temperature=0,
                                                        stream=True, **kw))
                calls = [tc for ch in chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or []]
                args = "".join(tc.function.arguments or "" for tc in calls)
                reason = chunks[-1].choices[0].finish_reason
                assert all(ch.choices[0].delta.content is None for ch in chunks if ch.choices)
                assert k < 2 or len([tc for tc in calls if tc.function.arguments]) > 1, (k, args)
            else:
                c = o.chat.completions.create(tools=OAI_TOOLS, tool_choice="required", temperature=0, **kw).choices[0]
                assert c.message.content is None and len(c.message.tool_calls) == 1
                args, reason = c.message.tool_calls[0].function.arguments, c.finish_reason
            if gateway.upstream_api == "anthropic" and not stream:
                # a whole Anthropic answer carries `input` as an object: the cut text closed into one
                got = json.loads(args)
                assert isinstance(got, dict) and (k < n or got == json.loads(full))
            else:
                _check_prefix(args, full, k, n)
            assert reason == ("tool_calls" if k >= n else "length")
