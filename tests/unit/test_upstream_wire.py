"""zccp.upstream.wire and client.error_for: the translation between the two APIs, without servers
(tests/integration/test_upstream.py runs it against real ones)."""

from __future__ import annotations

import json

import orjson
import pytest

from zccp.api import codec_for
from zccp.api.common import ParseLimits
from zccp.shared_types import TextDelta, ToolArgsDelta, ToolCall, ToolCallStart
from zccp.upstream.client import error_for
from zccp.upstream.wire import (AnthropicReader, Finish, OpenAIReader, UpstreamBroken, UpstreamStreamError,
                                anthropic_body, openai_body)

LIMITS = ParseLimits(served_models=frozenset({"gw"}), max_tokens_cap=4096, default_max_tokens=256)


def parsed(api: str, body: dict):
    codec = codec_for(api)
    doc = codec.decode(orjson.dumps(body))
    return codec.parse(doc, LIMITS), codec.chat_input(doc)


def chunk(delta: dict, finish: str | None = None, **extra) -> bytes:
    return orjson.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra})


def test_openai_tool_call_fragments_join_per_index() -> None:
    r = OpenAIReader()
    evs = []
    for data in (chunk({"content": "hi"}),
                 chunk({"tool_calls": [{"index": 0, "id": "call_a", "function": {"name": "f", "arguments": '{"a"'}}]}),
                 chunk({"tool_calls": [{"index": 0, "function": {"arguments": ': "é"}'}}]}),
                 chunk({"tool_calls": [{"index": 1, "id": "call_b", "function": {"name": "g", "arguments": ""}}]}),
                 chunk({}, "tool_calls"),
                 orjson.dumps({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4,
                                                        "prompt_tokens_details": {"cached_tokens": 3}}}),
                 b"[DONE]"):
        evs += list(r.feed(data))
    # each call streams (its start, its argument pieces as they came), then is released whole
    assert evs == [TextDelta("hi"), ToolCallStart("f", "call_a"), ToolArgsDelta('{"a"'), ToolArgsDelta(': "é"}'),
                   ToolCall("f", '{"a": "é"}', "call_a"), ToolCallStart("g", "call_b"), ToolCall("g", "{}", "call_b"),
                   Finish("tool_use", None, 9, 4, 3)]


def test_openai_text_sent_while_a_call_streams_is_held_until_it_ends() -> None:
    r = OpenAIReader()
    evs = []
    for data in (chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": '{"a":'}}]}),
                 chunk({"content": "aside"}),
                 chunk({"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}),
                 chunk({}, "tool_calls"), b"[DONE]"):
        evs += list(r.feed(data))
    assert evs[:5] == [ToolCallStart("f", "c"), ToolArgsDelta('{"a":'), ToolArgsDelta(" 1}"),
                       ToolCall("f", '{"a": 1}', "c"), TextDelta("aside")]


def test_openai_a_call_index_going_back_is_broken() -> None:
    r = OpenAIReader()
    list(r.feed(chunk({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g", "arguments": "{"}}]})))
    with pytest.raises(UpstreamBroken):
        list(r.feed(chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{"}}]})))


def test_anthropic_overlapping_tool_use_blocks_are_broken() -> None:
    r = AnthropicReader()
    start = {"type": "content_block_start", "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}}}
    list(r.feed(orjson.dumps({**start, "index": 0})))
    with pytest.raises(UpstreamBroken):
        list(r.feed(orjson.dumps({**start, "index": 1})))


def test_openai_stream_without_finish_is_broken() -> None:
    r = OpenAIReader()
    list(r.feed(chunk({"content": "half"})))
    with pytest.raises(UpstreamBroken):
        list(r.closed())
    with pytest.raises(UpstreamStreamError):
        list(OpenAIReader().feed(b'{"error": {"message": "boom", "type": "server_error"}}'))


def test_anthropic_events() -> None:
    r = AnthropicReader()
    events = [
        {"type": "message_start", "message": {"usage": {"input_tokens": 5, "cache_read_input_tokens": 7,
                                                        "cache_creation_input_tokens": 1, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1,
         "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"x":'}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": " [1]}"}},
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
         "usage": {"output_tokens": 12}},
        {"type": "message_stop"},
    ]
    out = [ev for e in events for ev in r.feed(orjson.dumps(e))]
    assert out == [TextDelta("ok"), ToolCallStart("f", "toolu_1"), ToolArgsDelta('{"x":'), ToolArgsDelta(" [1]}"),
                   ToolCall("f", '{"x": [1]}', "toolu_1"), Finish("tool_use", None, 13, 12, 7)]


def test_whole_answers() -> None:
    oa = {"choices": [{"index": 0, "finish_reason": "length", "message": {
        "content": "t", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": '{"k":1}'}}]}}],
          "usage": {"prompt_tokens": 2, "completion_tokens": 3}}
    assert list(OpenAIReader().whole(orjson.dumps(oa))) == [TextDelta("t"), ToolCall("f", '{"k":1}', "c1"),
                                                            Finish("max_tokens", None, 2, 3, 0)]
    an = {"type": "message", "content": [{"type": "text", "text": "a"}], "stop_reason": "stop_sequence",
          "stop_sequence": "##", "usage": {"input_tokens": 4, "output_tokens": 2}}
    assert list(AnthropicReader().whole(orjson.dumps(an))) == [TextDelta("a"), Finish("stop_sequence", "##", 4, 2, 0)]


def test_anthropic_conversation_to_openai_body() -> None:
    req, chat = parsed("anthropic", {
        "model": "gw", "max_tokens": 50, "system": "be brief", "stop_sequences": ["END"],
        "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "f"},
        "messages": [{"role": "user", "content": "q"},
                     {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f",
                                                        "input": {"a": 1}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                   "content": "r"}]}]})
    body = openai_body(req, chat, "up")
    assert body["model"] == "up" and body["max_tokens"] == 50 and body["stop"] == ["END"]
    assert body["messages"][0] == {"role": "system", "content": "be brief"}
    assert body["messages"][2]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a":1}'}
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "r"}
    assert body["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert body["tools"][0]["function"]["parameters"] == {"type": "object"}


def test_openai_conversation_to_anthropic_body() -> None:
    req, chat = parsed("openai", {
        "model": "gw", "max_tokens": 50, "temperature": 1.5, "tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "r"},
                     {"role": "user", "content": "and?"}]})
    body = anthropic_body(req, chat, "up")
    assert body["system"] == "sys" and body["temperature"] == 1.0 and body["tool_choice"] == {"type": "any"}
    assert body["messages"][1] == {"role": "assistant", "content": [
        {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}}]}
    # the tool result and the next user text are one user turn
    assert body["messages"][2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "r"}, {"type": "text", "text": "and?"}]}
    assert body["tools"] == [{"name": "f", "description": "", "input_schema": {"type": "object"}}]


@pytest.mark.parametrize(("status", "want"), [(400, (400, "invalid_request_error")),
                                              (422, (400, "invalid_request_error")),
                                              (401, (502, "api_error")), (403, (502, "api_error")),
                                              (429, (429, "rate_limit_error")), (500, (502, "api_error")),
                                              (503, (529, "overloaded_error")), (413, (413, "request_too_large"))])
def test_error_mapping(status: int, want: tuple[int, str]) -> None:
    err = error_for(status, json.dumps({"error": {"message": "key sk-LEAK bad"}}).encode(), "3")
    assert (err.status, err.kind) == want
    if status in (401, 403):
        assert "sk-LEAK" not in err.message
    if status == 429:
        assert err.headers == {"retry-after": "3"}
