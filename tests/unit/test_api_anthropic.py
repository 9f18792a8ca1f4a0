"""Anthropic Messages front end: validation, rendering, and SDK compatibility.

The official `anthropic` SDK is driven end to end against a mock transport whose
handler is our parse_request/render_* code, so what the SDK sends must parse and
what we send back must satisfy the SDK's models and stream accumulator.
"""

from __future__ import annotations

from typing import Any

import anthropic
import orjson
import pytest
from tests.support.fake_api import LIMITS, MODEL, FakeServer, sdk_client
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from zccp.api import anthropic as api
from zccp.api import codec_for
from zccp.shared_types import ApiError, ChatMessage, GenerationRequest, GenerationResult, TextDelta

USER = {"role": "user", "content": "Hello"}


def body(**fields: Any) -> bytes:
    base: dict[str, Any] = {"model": MODEL, "max_tokens": 16, "messages": [USER]}
    for key, value in fields.items():
        if value is _DROP:
            base.pop(key, None)
        else:
            base[key] = value
    return orjson.dumps(base)


_DROP = object()


def parse(raw: bytes) -> GenerationRequest:
    return api.parse_request(raw, LIMITS)


def result(text: str = "Hi there", stop: str = "end_turn", seq: str | None = None) -> GenerationResult:
    return GenerationResult(text=text, stop_reason=stop, stop_sequence=seq,  # type: ignore[arg-type]
                            input_tokens=11, output_tokens=7)


# --------------------------------------------------------------------------- parsing


def test_parse_full_request() -> None:
    req = parse(body(
        system=[{"type": "text", "text": "Be brief."},
                {"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello!"}]},
            {"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}},
                {"type": "text", "text": "What is this?"},
            ]},
        ],
        max_tokens=100, stop_sequences=["\n\nHuman:", "END"], temperature=0, top_p=0.9, top_k=40,
        stream=True, metadata={"user_id": "u-1"},
        tools=[{"name": "t", "input_schema": {"type": "object"}}], tool_choice={"type": "auto"},
        thinking={"type": "disabled"}, service_tier="auto",
    ))
    assert req.api == "anthropic" and req.model == MODEL
    assert req.system == "Be brief.\n\nBe kind."
    assert req.messages == (
        ChatMessage("user", "Hi"),
        ChatMessage("assistant", "Hello!"),
        ChatMessage("user", "[image]\n\nWhat is this?"),
    )
    s = req.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.stop) == (100, 0.0, 0.9, 40, ("\n\nHuman:", "END"))
    assert s.seed is None
    assert req.stream is True and req.include_usage is False and req.user == "u-1"


def test_parse_defaults_and_nulls() -> None:
    req = parse(body(system=None, temperature=None, metadata={"user_id": None}))
    assert req.system == "" and req.user is None and req.stream is False
    s = req.sampling
    assert (s.temperature, s.top_p, s.top_k, s.stop) == (1.0, None, None, ())


def test_top_k_zero_means_unset() -> None:
    assert parse(body(top_k=0)).sampling.top_k is None


def test_consecutive_turns_are_combined_and_any_first_role_allowed() -> None:
    req = parse(body(messages=[
        {"role": "assistant", "content": "A1"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "x", "name": "f", "input": {}}]},
        {"role": "user", "content": "U1"},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "42"}]},
        {"role": "assistant", "content": "The answer is"},
    ]))
    assert req.messages == (
        ChatMessage("assistant", "A1\n\n[tool_use]"),
        ChatMessage("user", "U1\n\n[tool_result]"),
        ChatMessage("assistant", "The answer is"),
    )


def test_empty_final_assistant_prefill_is_allowed() -> None:
    req = parse(body(messages=[USER, {"role": "assistant", "content": ""}]))
    assert req.messages[-1] == ChatMessage("assistant", "")


def test_codec_for() -> None:
    assert codec_for("anthropic") is api.CODEC


BAD_CASES: list[tuple[str, bytes, int, str, str | None, str]] = [
    # (id, body, status, kind, param, message fragment)
    ("empty-body", b"", 400, "invalid_request_error", None, "empty"),
    ("whitespace-body", b"  \n", 400, "invalid_request_error", None, "empty"),
    ("invalid-json", b'{"model": ', 400, "invalid_request_error", None, "not valid JSON"),
    ("top-level-array", b"[]", 400, "invalid_request_error", None, "must be a JSON object"),
    ("extra-field", body(foo=1), 400, "invalid_request_error", "foo", "foo: Extra inputs are not permitted"),
    ("missing-model", body(model=_DROP), 400, "invalid_request_error", "model", "model: Field required"),
    ("model-not-string", body(model=5), 400, "invalid_request_error", "model", "model: Input should be a valid string"),
    ("unknown-model", body(model="zccp-x"), 404, "not_found_error", "model", "model: zccp-x"),
    ("missing-max-tokens", body(max_tokens=_DROP), 400, "invalid_request_error", "max_tokens",
     "max_tokens: Field required"),
    ("max-tokens-bool", body(max_tokens=True), 400, "invalid_request_error", "max_tokens", "valid integer"),
    ("max-tokens-float", body(max_tokens=10.0), 400, "invalid_request_error", "max_tokens", "valid integer"),
    ("max-tokens-zero", body(max_tokens=0), 400, "invalid_request_error", "max_tokens", "greater than or equal to 1"),
    ("max-tokens-over-cap", body(max_tokens=4097), 400, "invalid_request_error", "max_tokens", "4097 > 4096"),
    ("missing-messages", body(messages=_DROP), 400, "invalid_request_error", "messages", "messages: Field required"),
    ("messages-not-list", body(messages={"role": "user"}), 400, "invalid_request_error", "messages", "valid list"),
    ("messages-empty", body(messages=[]), 400, "invalid_request_error", "messages", "at least one message"),
    ("message-not-object", body(messages=["hi"]), 400, "invalid_request_error", "messages.0", "valid dictionary"),
    ("message-no-role", body(messages=[{"content": "x"}]), 400, "invalid_request_error", "messages.0.role",
     "messages.0.role: Field required"),
    ("message-bad-role", body(messages=[{"role": "system", "content": "x"}]), 400, "invalid_request_error",
     "messages.0.role", "Input should be 'user' or 'assistant'"),
    ("message-role-list", body(messages=[{"role": ["user"], "content": "x"}]), 400, "invalid_request_error",
     "messages.0.role", "Input should be 'user' or 'assistant'"),
    ("huge-number", b'{"model":"zccp-test","max_tokens":99999999999999999999,"messages":[]}', 400,
     "invalid_request_error",
     "max_tokens", "valid integer"),
    ("message-no-content", body(messages=[{"role": "user"}]), 400, "invalid_request_error", "messages.0.content",
     "Field required"),
    ("message-extra-key", body(messages=[{"role": "user", "content": "x", "name": "bob"}]), 400,
     "invalid_request_error", "messages.0.name", "Extra inputs are not permitted"),
    ("content-number", body(messages=[{"role": "user", "content": 5}]), 400, "invalid_request_error",
     "messages.0.content", "valid string"),
    ("block-not-object", body(messages=[{"role": "user", "content": ["x"]}]), 400, "invalid_request_error",
     "messages.0.content.0", "valid dictionary"),
    ("block-no-type", body(messages=[{"role": "user", "content": [{"text": "x"}]}]), 400, "invalid_request_error",
     "messages.0.content.0.type", "Field required"),
    ("block-type-not-string", body(messages=[{"role": "user", "content": [{"type": 1}]}]), 400, "invalid_request_error",
     "messages.0.content.0.type", "valid string"),
    ("text-block-no-text", body(messages=[USER, {"role": "assistant", "content": "ok"},
                                          {"role": "user", "content": [{"type": "text"}]}]), 400,
     "invalid_request_error", "messages.2.content.0.text", "messages.2.content.0.text: Field required"),
    ("text-block-text-not-string", body(messages=[{"role": "user", "content": [{"type": "text", "text": 3}]}]), 400,
     "invalid_request_error", "messages.0.content.0.text", "valid string"),
    ("text-block-empty", body(messages=[{"role": "user", "content": [{"type": "text", "text": ""}]}]), 400,
     "invalid_request_error", "messages.0.content.0.text", "must be non-empty"),
    ("empty-user-message", body(messages=[{"role": "user", "content": ""}]), 400, "invalid_request_error",
     "messages.0", "non-empty content"),
    ("empty-content-list", body(messages=[{"role": "user", "content": []}]), 400, "invalid_request_error",
     "messages.0", "non-empty content"),
    ("prefill-trailing-space", body(messages=[USER, {"role": "assistant", "content": "Sure "}]), 400,
     "invalid_request_error", "messages.1.content", "trailing whitespace"),
    ("system-number", body(system=3), 400, "invalid_request_error", "system", "system: Input should be"),
    ("system-block-not-text", body(system=[{"type": "image"}]), 400, "invalid_request_error", "system.0.type",
     "'text'"),
    ("system-block-no-text", body(system=[{"type": "text"}]), 400, "invalid_request_error", "system.0.text",
     "Field required"),
    ("stop-not-list", body(stop_sequences="END"), 400, "invalid_request_error", "stop_sequences", "valid list"),
    ("stop-item-not-string", body(stop_sequences=["a", 2]), 400, "invalid_request_error", "stop_sequences.1",
     "valid string"),
    ("stop-item-blank", body(stop_sequences=[" "]), 400, "invalid_request_error", "stop_sequences.0", "non-whitespace"),
    ("temperature-string", body(temperature="0.5"), 400, "invalid_request_error", "temperature", "valid number"),
    ("temperature-bool", body(temperature=True), 400, "invalid_request_error", "temperature", "valid number"),
    ("temperature-high", body(temperature=1.5), 400, "invalid_request_error", "temperature", "less than or equal to 1"),
    ("temperature-low", body(temperature=-0.1), 400, "invalid_request_error", "temperature",
     "greater than or equal to 0"),
    ("top-p-high", body(top_p=1.01), 400, "invalid_request_error", "top_p", "less than or equal to 1"),
    ("top-k-negative", body(top_k=-1), 400, "invalid_request_error", "top_k", "greater than or equal to 0"),
    ("top-k-float", body(top_k=1.5), 400, "invalid_request_error", "top_k", "valid integer"),
    ("stream-string", body(stream="yes"), 400, "invalid_request_error", "stream", "valid boolean"),
    ("metadata-list", body(metadata=[]), 400, "invalid_request_error", "metadata", "valid dictionary"),
    ("metadata-extra", body(metadata={"session": "x"}), 400, "invalid_request_error", "metadata.session",
     "Extra inputs"),
    ("metadata-user-number", body(metadata={"user_id": 5}), 400, "invalid_request_error", "metadata.user_id",
     "valid string"),
    ("metadata-user-long", body(metadata={"user_id": "x" * 257}), 400, "invalid_request_error", "metadata.user_id",
     "at most 256"),
    ("tools-object", body(tools={"name": "t"}), 400, "invalid_request_error", "tools", "valid list"),
    ("tools-item-string", body(tools=["t"]), 400, "invalid_request_error", "tools.0", "valid dictionary"),
    ("tool-choice-no-type", body(tool_choice={}), 400, "invalid_request_error", "tool_choice.type", "Field required"),
    ("thinking-string", body(thinking="on"), 400, "invalid_request_error", "thinking", "valid dictionary"),
    ("thinking-budget-low", body(max_tokens=4096, thinking={"type": "enabled", "budget_tokens": 1023}), 400,
     "invalid_request_error", "thinking.enabled.budget_tokens", "greater than or equal to 1024"),
    ("thinking-budget-missing", body(max_tokens=4096, thinking={"type": "enabled"}), 400,
     "invalid_request_error", "thinking.enabled.budget_tokens", "Field required"),
    ("service-tier-bad", body(service_tier="fast"), 400, "invalid_request_error", "service_tier",
     "'auto' or 'standard_only'"),
    ("block-type-unknown", body(messages=[{"role": "user", "content": [{"type": "nonsense"}]}]), 400,
     "invalid_request_error", "messages.0.content.0", "Input tag 'nonsense' found using 'type'"),
    ("tool-result-without-tool-use", body(messages=[
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "4"}]}]), 400,
     "invalid_request_error", "messages.0.content.0",
     "unexpected `tool_use_id` found in `tool_result` blocks: toolu_1"),
    ("tool-result-wrong-id", body(messages=[
        USER, {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2"}]}]), 400,
     "invalid_request_error", "messages.2.content.0", "toolu_2"),
    ("tool-use-unanswered", body(messages=[
        USER, {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
        USER]), 400, "invalid_request_error", "messages.2", "`tool_use` ids were found without `tool_result`"),
    ("tool-use-no-id", body(messages=[
        USER, {"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {}}]}]), 400,
     "invalid_request_error", "messages.1.content.0.id", "Field required"),
    ("tool-result-id-number", body(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": 3}]}]),
     400, "invalid_request_error", "messages.0.content.0.tool_use_id", "valid string"),
]


@pytest.mark.parametrize(("raw", "status", "kind", "param", "fragment"),
                         [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES])
def test_bad_requests(raw: bytes, status: int, kind: str, param: str | None, fragment: str) -> None:
    with pytest.raises(ApiError) as info:
        parse(raw)
    err = info.value
    assert (err.status, err.kind, err.param) == (status, kind, param)
    assert fragment in err.message
    if param is not None and status == 400:
        assert err.message.startswith(param + ": ")
    # and the error renders as the API's error object
    rendered = orjson.loads(api.render_error(err))
    assert rendered == {"type": "error", "error": {"type": kind, "message": err.message}}


# --------------------------------------------------------------------------- rendering


def test_render_response_validates_with_sdk_model() -> None:
    req = parse(body())
    raw = api.render_response(req, result("Hi \"there\"\n", "stop_sequence", "END"), "msg_abc", 1700000000)
    msg = Message.model_validate(orjson.loads(raw))
    assert msg.id == "msg_abc" and msg.model == MODEL and msg.role == "assistant" and msg.type == "message"
    assert [(b.type, b.text) for b in msg.content] == [("text", "Hi \"there\"\n")]  # type: ignore[union-attr]
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", "END")
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (11, 7)


def _events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in raw.decode().split("\n\n"):
        if not frame:
            continue
        ev, data = frame.split("\n")
        assert ev.startswith("event: ") and data.startswith("data: ")
        out.append((ev[7:], orjson.loads(data[6:])))
    return out


def test_stream_event_sequence_exact() -> None:
    req = parse(body(stream=True))
    enc = api.StreamEncoder(req, "msg_s", 0, 11)
    raw = enc.start() + enc.delta(TextDelta("Hel")) + enc.delta(TextDelta("")) + enc.delta(TextDelta("lo")) \
        + enc.finish(result("Hello", "max_tokens"))
    events = _events(raw)
    assert [name for name, _ in events] == [
        "message_start", "content_block_start", "ping", "content_block_delta", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop",
    ]
    for name, data in events:
        assert data["type"] == name
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"] == {"input_tokens": 11, "output_tokens": 1, "cache_creation_input_tokens": 0,
                              "cache_read_input_tokens": 0,
                              "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}}
    assert events[1][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert events[3][1] == {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}}
    # message_delta's usage is cumulative, with the input and cache fields (as Anthropic sends it)
    assert events[6][1] == {"type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                            "usage": {"input_tokens": 11, "cache_creation_input_tokens": 0,
                                      "cache_read_input_tokens": 0, "output_tokens": 7}}
    # every event validates against the SDK's union of stream events
    adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
    for name, data in events:
        if name != "ping":
            adapter.validate_python(data)
    assert enc.delta(TextDelta("")) == b""


def test_stream_error_event() -> None:
    enc = api.StreamEncoder(parse(body()), "msg_s", 0, 1)
    raw = enc.error(ApiError(529, "overloaded_error", "Overloaded"))
    assert raw == b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n'


def test_render_error_and_status() -> None:
    err = ApiError(429, "rate_limit_error", "slow down")
    assert orjson.loads(api.render_error(err)) == {"type": "error",
                                                   "error": {"type": "rate_limit_error", "message": "slow down"}}
    assert api.http_status(err) == 429
    assert api.STATUS_BY_KIND["overloaded_error"] == 529
    assert api.new_response_id().startswith("msg_") and api.new_response_id() != api.new_response_id()


# --------------------------------------------------------------------------- SDK end to end


def test_sdk_create_non_streaming() -> None:
    server = FakeServer(api.CODEC, ["Hello", ", world"])
    msg = sdk_client(server).messages.create(
        model=MODEL, max_tokens=32, system="Be nice.",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        stop_sequences=["STOP"], metadata={"user_id": "abc"},
        extra_body={"temperature": 0.25, "top_k": 5},
    )
    assert msg.content[0].text == "Hello, world"  # type: ignore[union-attr]
    assert msg.stop_reason == "end_turn" and msg.usage.output_tokens == 7
    (req,) = server.requests
    assert req.system == "Be nice." and req.messages == (ChatMessage("user", "Hi"),)
    assert req.sampling.temperature == 0.25 and req.sampling.top_k == 5 and req.user == "abc"


def test_sdk_stream_helper_accumulates() -> None:
    pieces = ["Bonjour", " le ", "monde ", "\u00e9\u4e16\U0001f600", "\n\"quoted\"\n"]
    server = FakeServer(api.CODEC, pieces, stop="max_tokens")
    with sdk_client(server).messages.stream(model=MODEL, max_tokens=32, messages=[USER]) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == "".join(pieces)
    assert final.content[0].text == "".join(pieces)  # type: ignore[union-attr]
    assert final.id == "msg_e2e" and final.stop_reason == "max_tokens"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (11, 7)


def test_sdk_raw_stream_events() -> None:
    server = FakeServer(api.CODEC, ["a", "b"])
    events = list(sdk_client(server).messages.create(model=MODEL, max_tokens=8, messages=[USER], stream=True))
    assert [e.type for e in events] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop",
    ]


def test_sdk_mid_stream_error_raises() -> None:
    server = FakeServer(api.CODEC, ["partial"], fail_mid_stream=ApiError(529, "overloaded_error", "Overloaded"))
    with pytest.raises(anthropic.APIStatusError) as info:
        with sdk_client(server).messages.stream(model=MODEL, max_tokens=8, messages=[USER]) as stream:
            for _ in stream.text_stream:
                pass
    assert info.value.body == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


def test_sdk_error_responses() -> None:
    c = sdk_client(FakeServer(api.CODEC, ["x"]))
    with pytest.raises(anthropic.NotFoundError) as nf:
        c.messages.create(model="zccp-x", max_tokens=8, messages=[USER])
    assert nf.value.body == {"type": "error", "error": {"type": "not_found_error", "message": "model: zccp-x"}}
    with pytest.raises(anthropic.BadRequestError) as bad:
        c.messages.create(model=MODEL, max_tokens=8, messages=[USER], extra_body={"temperature": 3})
    assert bad.value.body["error"]["message"] == "temperature: Input should be less than or equal to 1"  # type: ignore[index]


def test_thinking_budget_refused_where_anthropic_refuses_it() -> None:
    # a budget not below max_tokens: Anthropic's own message, no field path
    with pytest.raises(ApiError) as info:
        parse(body(max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 2048}))
    assert (info.value.status, info.value.kind) == (400, "invalid_request_error")
    assert info.value.message.startswith("`max_tokens` must be greater than `thinking.budget_tokens`")
    # accepted: a budget in range, and thinking disabled
    parse(body(max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024}))
    parse(body(max_tokens=16, thinking={"type": "disabled"}))
    # count_tokens has no max_tokens: only the floor applies
    obj = orjson.loads(body(thinking={"type": "enabled", "budget_tokens": 5000}))
    del obj["max_tokens"]
    api.parse_count_tokens(obj, LIMITS)


def test_forced_tools_and_output_config_become_grammar_constraints() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tools = [{"name": "w", "input_schema": schema}, {"name": "t", "input_schema": {"type": "object"}}]
    c = parse(body(tools=tools, tool_choice={"type": "any"})).sampling.constraint
    assert c is not None and c.kind == "tool_call" and [n for n, _ in c.tools] == ["w", "t"]
    c = parse(body(tools=tools, tool_choice={"type": "tool", "name": "w"})).sampling.constraint
    assert c is not None and [n for n, _ in c.tools] == ["w"] and orjson.loads(c.tools[0][1] or "") == schema
    assert parse(body(tools=tools)).sampling.constraint is None
    c = parse(body(output_config={"format": {"type": "json_schema", "schema": schema}})).sampling.constraint
    assert c is not None and c.kind == "json" and orjson.loads(c.schema or "") == schema
    for bad, param in ((body(output_config={"format": {"type": "json_schema"}}), "output_config.format.schema"),
                       (body(output_config={"fmt": {}}), "output_config.fmt"),
                       (body(tools=tools, tool_choice={"type": "tool", "name": "x"}), "tool_choice.name")):
        with pytest.raises(ApiError) as info:
            parse(bad)
        assert (info.value.status, info.value.param) == (400, param)
