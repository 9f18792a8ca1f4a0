"""Tool calls through the live gateway, parsed by both official SDKs.

The model output is known: the null backend replies with hermes <tool_call> markup,
through the same output path every backend's tokens take (detokenizer, stop
sequences, the tool parser, each API's encoder, the response ring)."""

from __future__ import annotations

import json

import pytest
import redis

from zccp.cache.purge_epoch import EPOCH_KEY

REPLY = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
         '"note": "caf\u00e9 </tool_call> \U0001f600"}}\n</tool_call>'
         '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
CALL_1 = {"city": "Paris", "note": "caf\u00e9 </tool_call> \U0001f600"}
TOOLS = [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}},
         {"name": "get_time", "description": "Time", "input_schema": {"type": "object"}}]
OAI_TOOLS = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                               "parameters": t["input_schema"]}} for t in TOOLS]
USER = [{"role": "user", "content": "Weather in Paris?"}]


# No delay: plain answers take the inline path; with one, every answer goes through the batch scheduler.
@pytest.fixture(scope="module", params=[0, 0.5], ids=["inline", "batched"])
def tool_stack(tmp_path_factory, request):
    from tests.support.harness import Stack

    s = Stack(tmp_path_factory.mktemp("tools"), {"model": {"backend": "null", "name": "zccp-tiny",
                                                           "null_reply": REPLY, "null_token_delay_ms": request.param}})
    try:
        yield s.start()
    finally:
        s.stop()


@pytest.fixture(scope="module")
def sdk_stack(tool_stack):
    return tool_stack                    # the stack conftest's claude / oai fixtures talk to


def _check_blocks(content):
    assert [b.type for b in content] == ["text", "tool_use", "tool_use"]
    assert content[0].text == "Let me check. "
    assert (content[1].name, content[1].input) == ("get_weather", CALL_1)
    assert (content[2].name, content[2].input) == ("get_time", {})
    assert content[1].id.startswith("toolu_") and content[1].id != content[2].id


def test_anthropic_create_returns_tool_use(claude):
    msg = claude.messages.create(model="zccp-tiny", max_tokens=400, messages=USER, tools=TOOLS)
    _check_blocks(msg.content)
    assert msg.stop_reason == "tool_use"


def test_anthropic_stream_assembles_tool_use(claude):
    with claude.messages.stream(model="zccp-tiny", max_tokens=400, messages=USER, tools=TOOLS) as s:
        events = list(s)
        final = s.get_final_message()
    _check_blocks(final.content)
    assert final.stop_reason == "tool_use"
    deltas = [e for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    # streamed as generated: several deltas per call (the null backend's tokens are bytes)
    assert sorted(set(e.index for e in deltas)) == [1, 2] and len(deltas) > 2
    assert json.loads("".join(e.delta.partial_json for e in deltas if e.index == 1)) == CALL_1


def test_anthropic_tool_choice_none_and_no_tools_give_text(claude):
    for extra in ({"tools": TOOLS, "tool_choice": {"type": "none"}}, {}):
        msg = claude.messages.create(model="zccp-tiny", max_tokens=400, messages=USER, **extra)
        assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == REPLY
        assert msg.stop_reason == "end_turn"


def test_anthropic_max_tokens_before_a_calls_name_drops_the_markup(claude):
    """Cut off inside `<tool_call>{"na`: nothing a client could run, and no markup as text."""
    msg = claude.messages.create(model="zccp-tiny", max_tokens=30, messages=USER, tools=TOOLS)
    assert [b.type for b in msg.content] == ["text"] and msg.stop_reason == "max_tokens"
    assert msg.content[0].text == "Let me check. "


CUT = len(REPLY.encode()[:REPLY.encode().index(b'"Paris"') + 4])     # inside "Paris": `{"city": "Par`


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_max_tokens_inside_an_auto_calls_arguments_is_a_truncated_call(claude, oai, stream):
    """What the real APIs answer: the call, its arguments as far as they were generated."""
    kw = dict(model="zccp-tiny", max_tokens=CUT, messages=USER)
    if stream:
        with claude.messages.stream(tools=TOOLS, **kw) as s:
            partial = "".join(e.delta.partial_json for e in s
                              if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
            msg = s.get_final_message()
        # the SDK's partial-JSON reading of the deltas drops a cut string (as it does for Anthropic's)
        assert partial == '{"city": "Par' and isinstance(msg.content[1].input, dict)
    else:
        msg = claude.messages.create(tools=TOOLS, **kw)
        assert msg.content[1].input == {"city": "Par"}     # non-streamed: the longest valid prefix, closed
    assert [b.type for b in msg.content] == ["text", "tool_use"] and msg.stop_reason == "max_tokens"
    assert msg.content[0].text == "Let me check. " and msg.content[1].name == "get_weather"
    if stream:
        chunks = list(oai.chat.completions.create(tools=OAI_TOOLS, stream=True, **kw))
        args = "".join(tc.function.arguments or "" for c in chunks if c.choices
                       for tc in c.choices[0].delta.tool_calls or [])
        reason = chunks[-1].choices[0].finish_reason
    else:
        c = oai.chat.completions.create(tools=OAI_TOOLS, **kw).choices[0]
        args, reason = c.message.tool_calls[0].function.arguments, c.finish_reason
    assert args == '{"city": "Par' and reason == "length"


def test_openai_create_returns_tool_calls(oai):
    r = oai.chat.completions.create(model="zccp-tiny", max_tokens=400, messages=USER, tools=OAI_TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check. "
    calls = choice.message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0].function.arguments) == CALL_1 and json.loads(calls[1].function.arguments) == {}
    assert calls[0].id.startswith("call_") and calls[0].type == "function"


def test_openai_stream_assembles_tool_calls(oai):
    kw = dict(model="zccp-tiny", max_tokens=400, messages=USER, tools=OAI_TOOLS, tool_choice="auto")
    chunks = list(oai.chat.completions.create(**kw, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls: dict[int, dict] = {}
    for c in chunks:
        for tc in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            call = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            call["name"] += tc.function.name or "" if tc.function else ""
            call["arguments"] += tc.function.arguments or "" if tc.function else ""
    assert text == "Let me check. "
    assert [c["name"] for c in calls.values()] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["arguments"]) == CALL_1
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    with oai.chat.completions.stream(**kw) as s:
        for _ in s:
            pass
        final = s.get_final_completion()
    assert [c.function.name for c in final.choices[0].message.tool_calls] == ["get_weather", "get_time"]


def test_tool_turn_history_is_accepted(claude, oai):
    """A client sends the calls and their results back: both APIs' shapes parse."""
    msg = claude.messages.create(model="zccp-tiny", max_tokens=5, tools=TOOLS, messages=[
        *USER, {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                  "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}])
    assert msg.usage.output_tokens == 5
    r = oai.chat.completions.create(model="zccp-tiny", max_tokens=5, tools=OAI_TOOLS, messages=[
        *USER, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])
    assert r.usage.completion_tokens == 5


def _cache_keys(r: redis.Redis) -> list[bytes]:
    """Every key but the purge epoch, which each engine writes at start (cache/purge_epoch.py)."""
    return [k for k in r.keys() if k.decode() != EPOCH_KEY]


@pytest.mark.parametrize("delay", [0, 0.5], ids=["inline", "batched"])
def test_tool_call_answers_are_never_cached(make_stack, delay):
    """An entry keeps text only, so a tool-call turn is neither stored nor kept by nginx."""
    s = make_stack({"model": {"backend": "null", "null_reply": REPLY, "null_token_delay_ms": delay}},
                   with_redis=True)
    body = {"model": "zccp-tiny", "max_tokens": 400, "messages": USER, "tools": TOOLS}
    seen = []
    for _ in range(3):
        r = s.client().post("/v1/messages", json=body)
        assert r.status_code == 200 and r.json()["stop_reason"] == "tool_use"
        seen.append(r.headers["x-zccp-cache"])
    assert seen == ["MISS", "MISS", "MISS"]
    r = redis.Redis.from_url(s.cfg.cache.redis_url)
    assert _cache_keys(r) == []                                             # nothing was even written
    plain = {"model": "zccp-tiny", "max_tokens": 10, "messages": USER}     # control: text answers are
    assert [s.client().post("/v1/messages", json=plain).headers["x-zccp-cache"] for _ in range(2)] == ["MISS", "HIT"]
    assert _cache_keys(r) != []
