"""OpenAI Chat Completions front end: validation, rendering, and SDK compatibility.

The official `openai` SDK is driven end to end against a mock transport whose
handler is our parse_request/render_* code.
"""

from __future__ import annotations

from typing import Any

import openai
import orjson
import pytest
from tests.support.fake_api import LIMITS, MODEL, FakeServer, sdk_client
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from zccp.api import codec_for
from zccp.api import openai as api
from zccp.api.common import ParseLimits
from zccp.shared_types import ApiError, ChatMessage, GenerationRequest, GenerationResult, OutputConstraint, TextDelta

USER = {"role": "user", "content": "Hello"}
_DROP = object()


def body(**fields: Any) -> bytes:
    base: dict[str, Any] = {"model": MODEL, "messages": [USER]}
    for key, value in fields.items():
        if value is _DROP:
            base.pop(key, None)
        else:
            base[key] = value
    return orjson.dumps(base)


def parse(raw: bytes, limits: ParseLimits = LIMITS) -> GenerationRequest:
    return api.parse_request(raw, limits)


def result(text: str = "Hi there", stop: str = "end_turn") -> GenerationResult:
    return GenerationResult(text=text, stop_reason=stop, stop_sequence=None,  # type: ignore[arg-type]
                            input_tokens=11, output_tokens=7)


# --------------------------------------------------------------------------- parsing


def test_parse_full_request() -> None:
    req = parse(body(
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Be kind."}]},
            {"role": "user", "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
            ], "name": "bob"},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
            {"role": "assistant", "content": [{"type": "text", "text": "It is 42."}]},
            {"role": "user", "content": "Thanks"},
        ],
        max_tokens=100, temperature=1.5, top_p=0.5, stop=["END", ""], n=1, stream=True,
        stream_options={"include_usage": True}, seed=7, user="u-1",
        frequency_penalty=0.5, presence_penalty=-1, logprobs=False, response_format={"type": "text"},
        metadata={"k": "v"}, store=False, parallel_tool_calls=True,
        tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="auto",
    ))
    assert req.api == "openai" and req.model == MODEL
    assert req.system == "Be brief.\n\nBe kind."
    assert req.messages == (
        ChatMessage("user", "Look:\n\n[image_url]"),
        ChatMessage("assistant", "[tool_calls]"),
        ChatMessage("user", "42"),
        ChatMessage("assistant", "It is 42."),
        ChatMessage("user", "Thanks"),
    )
    s = req.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.seed, s.stop) == (100, 1.5, 0.5, None, 7, ("END",))
    assert req.stream and req.include_usage and req.user == "u-1"


def test_parse_defaults() -> None:
    req = parse(body(max_tokens=None, temperature=None, stop=None, n=None, stream=None, user=None))
    s = req.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.seed, s.stop) == (512, 1.0, None, None, ())
    assert not req.stream and not req.include_usage and req.user is None and req.system == ""


def test_default_max_tokens_is_capped() -> None:
    limits = ParseLimits(frozenset({MODEL}), max_tokens_cap=100, default_max_tokens=512)
    assert parse(body(), limits).sampling.max_tokens == 100


def test_max_completion_tokens_wins() -> None:
    assert parse(body(max_tokens=10, max_completion_tokens=20)).sampling.max_tokens == 20
    assert parse(body(max_completion_tokens=30)).sampling.max_tokens == 30


def test_stop_string_and_include_usage_default() -> None:
    req = parse(body(stop="\n", stream=True))
    assert req.sampling.stop == ("\n",) and req.include_usage is False


def test_consecutive_turns_merge() -> None:
    req = parse(body(messages=[USER, {"role": "user", "content": "again"}]))
    assert req.messages == (ChatMessage("user", "Hello\n\nagain"),)


def test_answered_tool_calls_are_accepted() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    req = parse(body(messages=[USER, {"role": "assistant", "tool_calls": [call]},
                               {"role": "tool", "tool_call_id": "call_1", "content": "4"}, USER]))
    assert len(req.messages) == 3


def test_codec_for() -> None:
    assert codec_for("openai") is api.CODEC


BAD_CASES: list[tuple[str, bytes, int, str | None, str | None, str]] = [
    # (id, body, status, param, code, message fragment) -- kind is invalid_request_error unless 404
    ("empty-body", b"", 400, None, None, "empty"),
    ("invalid-json", b"{nope", 400, None, None, "We could not parse the JSON body"),
    ("top-level-string", b'"hi"', 400, None, "invalid_type", "expected an object, but got a string"),
    ("unknown-field", body(foo=1), 400, None, None, "Unrecognized request argument supplied: foo"),
    ("unknown-fields", body(foo=1, bar=2), 400, None, None, "Unrecognized request arguments supplied: foo, bar"),
    ("missing-model", body(model=_DROP), 400, "model", None, "you must provide a model parameter"),
    ("model-number", body(model=3), 400, "model", "invalid_type", "Invalid type for 'model'"),
    ("unknown-model", body(model="x"), 404, "model", "model_not_found",
     "The model `x` does not exist or you do not have access to it."),
    ("missing-messages", body(messages=_DROP), 400, "messages", "missing_required_parameter",
     "Missing required parameter: 'messages'."),
    ("messages-object", body(messages={}), 400, "messages", "invalid_type", "expected an array"),
    ("messages-empty", body(messages=[]), 400, "messages", "empty_array", "empty array"),
    ("message-string", body(messages=["hi"]), 400, "messages[0]", "invalid_type", "expected an object"),
    ("message-no-role", body(messages=[{"content": "x"}]), 400, "messages[0].role", "missing_required_parameter",
     "Missing required parameter: 'messages[0].role'."),
    ("message-bad-role", body(messages=[USER, {"role": "bot", "content": "x"}]), 400, "messages[1].role",
     "invalid_value",
     "Invalid value: 'bot'. Supported values are: 'system', 'assistant', 'user', 'tool', and 'developer'."),
    ("message-role-list", body(messages=[{"role": ["user"], "content": "x"}]), 400, "messages[0].role",
     "invalid_type", "expected a string, but got an array"),
    ("message-extra-key", body(messages=[{"role": "user", "content": "x", "tool_call_id": "c"}]), 400,
     "messages[0].tool_call_id", None, "'tool_call_id' was unexpected"),
    ("user-no-content", body(messages=[{"role": "user"}]), 400, "messages[0].content", "missing_required_parameter",
     "'messages[0].content'"),
    ("user-null-content", body(messages=[{"role": "user", "content": None}]), 400, "messages[0].content",
     "invalid_type", "expected one of a string or array of objects, but got null"),
    ("content-number", body(messages=[{"role": "user", "content": 1}]), 400, "messages[0].content",
     "invalid_type", "but got an integer instead"),
    ("content-empty-array", body(messages=[{"role": "user", "content": []}]), 400, "messages[0].content",
     "empty_array", "empty array"),
    ("part-not-object", body(messages=[{"role": "user", "content": ["x"]}]), 400, "messages[0].content[0]",
     "invalid_type", "expected an object"),
    ("part-no-type", body(messages=[{"role": "user", "content": [{"text": "x"}]}]), 400,
     "messages[0].content[0].type", "missing_required_parameter", "'messages[0].content[0].type'"),
    ("part-bad-type", body(messages=[{"role": "user", "content": [{"type": "video"}]}]), 400,
     "messages[0].content[0].type", "invalid_value", "Invalid value: 'video'"),
    ("system-image-part",
     body(messages=[{"role": "system", "content": [{"type": "image_url", "image_url": {}}]}, USER]),
     400, "messages[0].content[0].type", "invalid_value", "Supported values are: 'text'."),
    ("text-part-no-text", body(messages=[{"role": "user", "content": [{"type": "text"}]}]), 400,
     "messages[0].content[0].text", "missing_required_parameter", "'messages[0].content[0].text'"),
    ("text-part-number", body(messages=[{"role": "user", "content": [{"type": "text", "text": 1}]}]), 400,
     "messages[0].content[0].text", "invalid_type", "expected a string"),
    ("assistant-tool-calls-object", body(messages=[{"role": "assistant", "tool_calls": {}}]), 400,
     "messages[0].tool_calls", "invalid_type", "expected an array"),
    ("tool-no-call-id", body(messages=[{"role": "tool", "content": "x"}]), 400, "messages[0].tool_call_id",
     "missing_required_parameter", "'messages[0].tool_call_id'"),
    ("max-tokens-string", body(max_tokens="5"), 400, "max_tokens", "invalid_type",
     "Invalid type for 'max_tokens': expected an integer, but got a string instead."),
    ("max-tokens-bool", body(max_tokens=True), 400, "max_tokens", "invalid_type", "but got a boolean instead"),
    ("max-tokens-float", body(max_tokens=5.0), 400, "max_tokens", "invalid_type", "but got a decimal instead"),
    ("max-tokens-zero", body(max_tokens=0), 400, "max_tokens", "integer_below_min_value",
     "Expected a value >= 1, but got 0"),
    ("max-tokens-over-cap", body(max_tokens=5000), 400, "max_tokens", "invalid_value",
     "max_tokens is too large: 5000. This model supports at most 4096 completion tokens"),
    ("max-completion-tokens-over-cap", body(max_tokens=1, max_completion_tokens=5000), 400,
     "max_completion_tokens", "invalid_value", "max_completion_tokens is too large"),
    ("max-completion-tokens-zero", body(max_completion_tokens=0), 400, "max_completion_tokens",
     "integer_below_min_value", ">= 1"),
    ("temperature-string", body(temperature="1"), 400, "temperature", "invalid_type", "expected a decimal"),
    ("temperature-high", body(temperature=2.5), 400, "temperature", "decimal_above_max_value",
     "Expected a value <= 2, but got 2.5 instead."),
    ("temperature-low", body(temperature=-1), 400, "temperature", "decimal_below_min_value", ">= 0"),
    ("top-p-high", body(top_p=1.5), 400, "top_p", "decimal_above_max_value", "<= 1"),
    ("stop-number", body(stop=5), 400, "stop", "invalid_type", "one of a string or array of strings"),
    ("stop-too-many", body(stop=["a", "b", "c", "d", "e"]), 400, "stop", "array_above_max_length", "maximum length 4"),
    ("stop-item-number", body(stop=["a", 1]), 400, "stop[1]", "invalid_type", "expected a string"),
    ("n-two-logprobs", body(n=2, logprobs=True), 400, "n", "unsupported_value", "'n' does not support 2"),
    ("n-too-many", body(n=129), 400, "n", "integer_above_max_value", "<= 128"),
    ("n-zero", body(n=0), 400, "n", "integer_below_min_value", ">= 1"),
    ("n-string", body(n="1"), 400, "n", "invalid_type", "expected an integer"),
    ("stream-string", body(stream="true"), 400, "stream", "invalid_type", "expected a boolean"),
    ("stream-options-without-stream", body(stream_options={"include_usage": True}), 400, "stream_options", None,
     "The 'stream_options' parameter is only allowed when 'stream' is enabled."),
    ("stream-options-stream-false", body(stream=False, stream_options={"include_usage": True}), 400,
     "stream_options", None, "only allowed when 'stream' is enabled"),
    ("stream-options-list", body(stream=True, stream_options=[]), 400, "stream_options", "invalid_type",
     "expected an object"),
    ("include-usage-string", body(stream=True, stream_options={"include_usage": "yes"}), 400,
     "stream_options.include_usage", "invalid_type", "expected a boolean"),
    ("seed-float", body(seed=1.5), 400, "seed", "invalid_type", "expected an integer"),
    ("user-number", body(user=5), 400, "user", "invalid_type", "expected a string"),
    ("frequency-penalty-high", body(frequency_penalty=3), 400, "frequency_penalty", "decimal_above_max_value", "<= 2"),
    ("presence-penalty-low", body(presence_penalty=-3), 400, "presence_penalty", "decimal_below_min_value", ">= -2"),
    ("top-logprobs-without-logprobs", body(top_logprobs=2), 400, "top_logprobs", "invalid_value",
     "'logprobs' must be set to true"),
    ("top-logprobs-high", body(logprobs=True, top_logprobs=21), 400, "top_logprobs", "integer_above_max_value",
     "<= 20"),
    ("logit-bias-key", body(logit_bias={"abc": 1}), 400, "logit_bias", "invalid_value", "Invalid key"),
    ("logprobs-string", body(logprobs="no"), 400, "logprobs", "invalid_type", "expected a boolean"),
    ("response-format-xml", body(response_format={"type": "xml"}), 400, "response_format.type",
     "invalid_value", "'xml'"),
    ("response-format-schema-no-name", body(response_format={"type": "json_schema", "json_schema": {}}), 400,
     "response_format.json_schema.name", "missing_required_parameter", ""),
    # a schema the compiler refuses is a 400 from the off-loop compile, not from parse
    # (tests/unit/test_isolation.py::test_compiler_refuses_a_bad_schema_naming_its_field)
    ("tool-choice-unknown-name", body(tools=[{"type": "function", "function": {"name": "f"}}],
                                      tool_choice={"type": "function", "function": {"name": "g"}}), 400,
     "tool_choice", "invalid_value", "'g' not found"),
    ("response-format-no-type", body(response_format={}), 400, "response_format.type", "missing_required_parameter",
     ""),
    ("metadata-list", body(metadata=[]), 400, "metadata", "invalid_type", "expected an object"),
    ("store-string", body(store="yes"), 400, "store", "invalid_type", "expected a boolean"),
    ("parallel-tool-calls-int", body(parallel_tool_calls=1), 400, "parallel_tool_calls", "invalid_type", "boolean"),
    ("tools-object", body(tools={}), 400, "tools", "invalid_type", "expected an array"),
    ("tool-choice-bad", body(tool_choice="always"), 400, "tool_choice", "invalid_value", "Invalid value: 'always'"),
    ("tool-without-tool-calls", body(messages=[USER, {"role": "tool", "tool_call_id": "call_1", "content": "4"}]),
     400, "messages.[1].role", None, "messages with role 'tool' must be a response to a preceeding message"),
    ("tool-call-id-unknown",
     body(messages=[USER,
                    {"role": "assistant",
                     "tool_calls": [{"id": "call_1", "type": "function",
                                     "function": {"name": "f", "arguments": "{}"}}]},
                                            {"role": "tool", "tool_call_id": "call_9", "content": "4"}]),
     400, "messages.[2].tool_call_id", None, "'tool_call_id' of 'call_9' not found"),
    ("tool-call-unanswered",
     body(messages=[USER,
                    {"role": "assistant",
                     "tool_calls": [{"id": "call_1", "type": "function",
                                     "function": {"name": "f", "arguments": "{}"}}]}, USER]),
     400, "messages.[1].role", None, "did not have response messages: call_1"),
    ("part-type-unknown", body(messages=[{"role": "user", "content": [{"type": "nonsense"}]}]),
     400, "messages[0].content[0].type", "invalid_value", "Invalid value: 'nonsense'"),
]


@pytest.mark.parametrize(("raw", "status", "param", "code", "fragment"),
                         [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES])
def test_bad_requests(raw: bytes, status: int, param: str | None, code: str | None, fragment: str) -> None:
    with pytest.raises(ApiError) as info:
        parse(raw)
    err = info.value
    assert err.status == status
    assert err.kind == ("not_found_error" if status == 404 else "invalid_request_error")
    assert err.param == param
    assert fragment in err.message
    rendered = orjson.loads(api.render_error(err))
    assert rendered == {"error": {"message": err.message, "type": "invalid_request_error", "param": param,
                                  "code": code}}


@pytest.mark.parametrize(("kind", "status", "etype", "code", "http"), [
    ("invalid_request_error", 400, "invalid_request_error", None, 400),
    ("authentication_error", 401, "invalid_request_error", "invalid_api_key", 401),
    ("permission_error", 403, "invalid_request_error", "permission_denied", 403),
    ("not_found_error", 404, "invalid_request_error", None, 404),
    ("request_too_large", 413, "invalid_request_error", "request_too_large", 413),
    ("rate_limit_error", 429, "requests", "rate_limit_exceeded", 429),
    ("api_error", 500, "server_error", None, 500),
    ("overloaded_error", 529, "server_error", "server_overloaded", 503),
    ("something_new", 502, "server_error", None, 502),
])
def test_engine_error_mapping(kind: str, status: int, etype: str, code: str | None, http: int) -> None:
    err = ApiError(status, kind, "msg", None)
    assert orjson.loads(api.render_error(err)) == {"error": {"message": "msg", "type": etype, "param": None,
                                                             "code": code}}
    assert api.http_status(err) == http


def test_plain_not_found_on_model_gets_model_not_found_code() -> None:
    err = ApiError(404, "not_found_error", "gone", "model")
    assert orjson.loads(api.render_error(err))["error"]["code"] == "model_not_found"


# --------------------------------------------------------------------------- rendering


@pytest.mark.parametrize(("stop", "finish"),
                         [("end_turn", "stop"), ("stop_sequence", "stop"), ("max_tokens", "length")])
def test_render_response_validates_with_sdk_model(stop: str, finish: str) -> None:
    req = parse(body())
    raw = api.render_response(req, result("Hi \"there\"\n\u4e16", stop), "chatcmpl-abc", 1700000000)
    comp = ChatCompletion.model_validate(orjson.loads(raw))
    assert comp.id == "chatcmpl-abc" and comp.created == 1700000000 and comp.model == MODEL
    assert comp.object == "chat.completion"
    (choice,) = comp.choices
    assert choice.index == 0 and choice.finish_reason == finish and choice.logprobs is None
    assert choice.message.role == "assistant" and choice.message.content == "Hi \"there\"\n\u4e16"
    assert choice.message.refusal is None
    assert comp.usage is not None
    assert (comp.usage.prompt_tokens, comp.usage.completion_tokens, comp.usage.total_tokens) == (11, 7, 18)


def _chunks(raw: bytes) -> list[Any]:
    frames = [f for f in raw.decode().split("\n\n") if f]
    assert frames[-1] == "data: [DONE]"
    out = []
    for frame in frames[:-1]:
        assert frame.startswith("data: ") and "\n" not in frame
        out.append(orjson.loads(frame[6:]))
    return out


@pytest.mark.parametrize("include_usage", [False, True])
def test_stream_chunks_exact(include_usage: bool) -> None:
    opts = {"stream_options": {"include_usage": include_usage}}
    req = parse(body(stream=True, **opts))
    enc = api.StreamEncoder(req, "chatcmpl-s", 1700000001, 11)
    raw = enc.start() + enc.delta(TextDelta("Hel")) + enc.delta(TextDelta("")) + enc.delta(TextDelta("lo")) \
        + enc.finish(result("Hello", "max_tokens"))
    chunks = _chunks(raw)
    assert len(chunks) == (5 if include_usage else 4)
    for c in chunks:
        ChatCompletionChunk.model_validate(c)
        assert (c["id"], c["object"], c["created"], c["model"]) == ("chatcmpl-s", "chat.completion.chunk", 1700000001,
                                                                    MODEL)
        assert ("usage" in c) is include_usage
    assert chunks[0]["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": "", "refusal": None},
                                     "logprobs": None, "finish_reason": None}]
    assert [c["choices"][0]["delta"] for c in chunks[1:3]] == [{"content": "Hel"}, {"content": "lo"}]
    assert chunks[3]["choices"] == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}]
    if include_usage:
        assert all(c["usage"] is None for c in chunks[:4])
        assert chunks[4]["choices"] == []
        assert chunks[4]["usage"] == {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18,
                                      "prompt_tokens_details": {"cached_tokens": 0}}
    assert enc.delta(TextDelta("")) == b""


def test_stream_error_frame() -> None:
    enc = api.StreamEncoder(parse(body(stream=True)), "chatcmpl-s", 0, 1)
    raw = enc.error(ApiError(500, "api_error", "boom"))
    assert raw == b'data: {"error":{"message":"boom","type":"server_error","param":null,"code":null}}\n\n'


def test_new_response_id() -> None:
    rid = api.new_response_id()
    assert rid.startswith("chatcmpl-") and len(rid) > 20 and rid != api.new_response_id()


# --------------------------------------------------------------------------- SDK end to end


def test_sdk_create_non_streaming() -> None:
    server = FakeServer(api.CODEC, ["Hello", ", world"], stop="max_tokens")
    comp = sdk_client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "developer", "content": "Be nice."}, {"role": "user", "content": "Hi"}],
        max_completion_tokens=32, temperature=0, seed=3, stop="STOP", user="abc",
    )
    assert comp.choices[0].message.content == "Hello, world" and comp.choices[0].finish_reason == "length"
    assert comp.usage is not None and comp.usage.total_tokens == 18
    (req,) = server.requests
    assert req.system == "Be nice." and req.messages == (ChatMessage("user", "Hi"),)
    s = req.sampling
    assert (s.max_tokens, s.temperature, s.seed, s.stop) == (32, 0.0, 3, ("STOP",))


def test_sdk_raw_stream_with_usage() -> None:
    pieces = ["Bonjour", " ", "\u00e9\u4e16\U0001f600", "\n\"q\"\n"]
    server = FakeServer(api.CODEC, pieces)
    chunks = list(sdk_client(server).chat.completions.create(
        model=MODEL, messages=[USER], stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "".join(pieces)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 7


def test_sdk_stream_helper_accumulates() -> None:
    pieces = ["one ", "two ", "three"]
    server = FakeServer(api.CODEC, pieces)
    with sdk_client(server).chat.completions.stream(
            model=MODEL, messages=[USER], stream_options={"include_usage": True}) as stream:
        deltas = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert "".join(deltas) == "one two three"
    assert final.choices[0].message.content == "one two three" and final.choices[0].finish_reason == "stop"
    assert final.usage is not None and final.usage.prompt_tokens == 11


def test_sdk_mid_stream_error_raises() -> None:
    server = FakeServer(api.CODEC, ["partial"], fail_mid_stream=ApiError(529, "overloaded_error", "Overloaded"))
    with pytest.raises(openai.APIError) as info:
        for _ in sdk_client(server).chat.completions.create(model=MODEL, messages=[USER], stream=True):
            pass
    assert info.value.message == "Overloaded"
    assert info.value.type == "server_error"


def test_sdk_error_responses() -> None:
    c = sdk_client(FakeServer(api.CODEC, ["x"]))
    with pytest.raises(openai.NotFoundError) as nf:
        c.chat.completions.create(model="nope", messages=[USER])
    assert nf.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        c.chat.completions.create(model=MODEL, messages=[USER], n=3, logprobs=True)
    assert (bad.value.param, bad.value.code) == ("n", "unsupported_value")
    with pytest.raises(openai.BadRequestError) as extra:
        c.chat.completions.create(model=MODEL, messages=[USER], extra_body={"mirostat_tau": 5})
    assert extra.value.body["message"] == "Unrecognized request argument supplied: mirostat_tau"  # type: ignore[index]


def test_structured_output_becomes_a_grammar_constraint() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    req = parse(body(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema,
                                                                               "strict": True}}))
    c = req.sampling.constraint
    assert c is not None and c.kind == "json" and orjson.loads(c.schema or "") == schema
    req = parse(body(response_format={"type": "json_object"}))
    assert req.sampling.constraint == OutputConstraint("json")
    assert parse(body(response_format={"type": "text"})).sampling.constraint is None
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}},
             {"type": "function", "function": {"name": "g"}}]
    for choice, names in (("required", ["f", "g"]), ({"type": "function", "function": {"name": "g"}}, ["g"])):
        c = parse(body(tools=tools, tool_choice=choice)).sampling.constraint
        assert c is not None and c.kind == "tool_call" and [n for n, _ in c.tools] == names
    assert parse(body(tools=tools, tool_choice="auto")).sampling.constraint is None
    # a forced tool call wins over a response_format (the turn is the call)
    c = parse(body(tools=tools, tool_choice="required", response_format={"type": "json_object"})).sampling.constraint
    assert c is not None and c.kind == "tool_call"


def test_image_data_urls_over_twenty_megabytes_are_refused():
    import base64

    from zccp.api.openai.media import check_image_url
    from zccp.api.openai.wording import OpenAIApiError

    ok = "data:image/png;base64," + base64.b64encode(bytes(20 * 1024 * 1024)).decode()
    check_image_url(ok, "p")
    with pytest.raises(OpenAIApiError) as e:
        check_image_url(ok[:-4] + base64.b64encode(bytes(6)).decode(), "p")
    assert e.value.param == "p" and e.value.code == "image_too_large"
