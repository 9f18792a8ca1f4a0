"""/v1/completions and /v1/responses front ends: what they read into a request, and the
cache keys the engine computes for them (one endpoint's never another's)."""

from __future__ import annotations

import orjson
import pytest

from tests.support.fake_api import LIMITS, MODEL
from zccp.api import api_for, codec_for
from zccp.transport.abi import OpenAIApi
from zccp.cache.fingerprint import compute
from zccp.shared_types import ApiError, GenerationResult, TextDelta, ToolCall

COMPLETIONS, RESPONSES = codec_for("completions"), codec_for("responses")


def test_the_slot_names_the_endpoint():
    assert api_for(False, OpenAIApi.RESPONSES) == "anthropic"
    assert api_for(True, OpenAIApi.CHAT) == "openai"
    assert api_for(True, OpenAIApi.COMPLETIONS) == "completions"
    assert api_for(True, OpenAIApi.RESPONSES) == "responses"
    assert api_for(True, 77) == "openai"          # shared memory: an unknown value is chat, whose parser judges


def test_completion_reads_the_prompt_as_is_with_openais_default_length():
    req = COMPLETIONS.parse({"model": MODEL, "prompt": ["Once"], "logprobs": 2, "stop": "."}, LIMITS)
    assert req.api == "completions" and req.prompt_text == "Once"
    assert req.sampling.max_tokens == 16 and req.sampling.logprobs == 2 and req.sampling.stop == (".",)
    assert not req.tool_use


@pytest.mark.parametrize("doc,param", [
    ({"prompt": "x", "echo": True}, "echo"), ({"prompt": "x", "suffix": "y"}, "suffix"),
    ({"prompt": ["a", 1]}, "prompt"), ({"prompt": [[1, 2], "b"]}, "prompt"), ({"prompt": 3}, "prompt"),
    ({"prompt": []}, "prompt"), ({"prompt": [[]]}, "prompt[0]"), ({"prompt": [1, -2]}, "prompt"),
    ({"prompt": [True]}, "prompt"), ({"prompt": ["a"] * 3, "n": 50}, "n"),
    ({}, "prompt"), ({"prompt": "x", "messages": []}, None), ({"prompt": "x", "logprobs": 9}, "logprobs"),
])
def test_completion_refusals(doc, param):
    with pytest.raises(ApiError) as e:
        COMPLETIONS.parse({"model": MODEL, **doc}, LIMITS)
    assert e.value.status == 400 and e.value.param == param


@pytest.mark.parametrize("prompt,prompts", [
    ("a", ("a",)), (["a", "b"], ("a", "b")), ([1, 2], ((1, 2),)), ([[1], [2, 3]], ((1,), (2, 3))),
])
def test_completion_reads_openais_four_prompt_shapes(prompt, prompts):
    req = COMPLETIONS.parse({"model": MODEL, "prompt": prompt, "n": 2, "stream": True}, LIMITS)
    assert req.prompts == prompts and req.n == 2 and req.stream
    assert req.prompt_text == (prompts[0] if isinstance(prompts[0], str) else None)


def test_completion_choices_render_in_index_order_with_summed_usage():
    req = COMPLETIONS.parse({"model": MODEL, "prompt": ["a", "b"], "n": 2}, LIMITS)
    results = [GenerationResult(f"t{i}", "end_turn" if i else "max_tokens", None, 3, i + 1) for i in range(4)]
    total = GenerationResult("", "end_turn", None, 7, 10, cached_tokens=2)
    assert COMPLETIONS.render_choices is not None
    out = orjson.loads(COMPLETIONS.render_choices(req, results, total, 0))
    assert [(c["index"], c["text"], c["finish_reason"]) for c in out["choices"]] == [
        (0, "t0", "length"), (1, "t1", "stop"), (2, "t2", "stop"), (3, "t3", "stop")]
    assert out["usage"] == {"prompt_tokens": 7, "completion_tokens": 10, "total_tokens": 17,
                            "prompt_tokens_details": {"cached_tokens": 2}}


def test_completion_renders_legacy_logprobs():
    from zccp.shared_types import TokenLogprob

    req = COMPLETIONS.parse({"model": MODEL, "prompt": "x", "logprobs": 1}, LIMITS)
    lps = (TokenLogprob(b"ab", -0.5, ((b"ab", -0.5),)), TokenLogprob(b"c", -1.0, ((b"c", -1.0),)))
    out = orjson.loads(COMPLETIONS.render(req, GenerationResult("abc", "end_turn", None, 2, 2, logprobs=lps),
                                          "cmpl-1", 0))
    lp = out["choices"][0]["logprobs"]
    assert lp == {"tokens": ["ab", "c"], "token_logprobs": [-0.5, -1.0], "top_logprobs": [{"ab": -0.5}, {"c": -1.0}],
                  "text_offset": [0, 2]}


def test_response_input_items_become_the_chat_conversation():
    doc = {"model": MODEL, "instructions": "Be brief.", "max_output_tokens": 50, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "reasoning", "summary": []},
    ], "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}}], "tool_choice": "required"}
    req = RESPONSES.parse(doc, LIMITS)
    assert req.api == "responses" and req.system == "Be brief." and req.sampling.max_tokens == 50
    assert req.tool_use and req.sampling.constraint is not None and req.sampling.constraint.kind == "tool_call"
    chat = RESPONSES.chat_input(doc)
    assert [m["role"] for m in chat.messages] == ["system", "user", "assistant", "tool"]
    assert chat.messages[2]["tool_calls"][0]["id"] == "c1" and chat.messages[2]["content"] == "Checking."
    assert chat.tools == [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}]


def test_response_function_call_output_must_answer_a_call():
    with pytest.raises(ApiError):
        RESPONSES.parse({"model": MODEL, "input": [{"type": "function_call_output", "call_id": "x", "output": "y"}]},
                        LIMITS)


def test_response_renders_items_and_stream_events():
    req = RESPONSES.parse({"model": MODEL, "input": "hi", "tools": [
        {"type": "function", "name": "w", "parameters": {"type": "object"}}]}, LIMITS)
    res = GenerationResult("", "tool_use", None, 3, 9, tool_calls=(ToolCall("w", '{"a":1}'),))
    out = orjson.loads(RESPONSES.render(req, res, "resp_1", 5))
    assert out["status"] == "completed" and [o["type"] for o in out["output"]] == ["function_call"]
    assert out["tools"] == [{"type": "function", "name": "w", "parameters": {"type": "object"}}]
    enc = RESPONSES.stream(req, "resp_1", 5, 3)
    raw = (enc.start() + enc.delta(TextDelta("a")) + enc.tool_call(res.tool_calls[0]) + enc.delta(TextDelta("b"))
           + enc.finish(GenerationResult("ab", "tool_use", None, 3, 9, tool_calls=res.tool_calls)))
    events = [orjson.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: ")]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    # the items the stream announced are the final response's, ids and all
    added = [e["item"]["id"] for e in events if e["type"] == "response.output_item.added"]
    assert [o["id"] for o in final["output"]] == added and len(set(added)) == 3
    assert [o["type"] for o in final["output"]] == ["message", "function_call", "message"]
    assert [o["content"][0]["text"] for o in final["output"] if o["type"] == "message"] == ["a", "b"]
    cut = orjson.loads(RESPONSES.render(req, GenerationResult("ab", "max_tokens", None, 1, 2), "r", 0))
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}


def test_response_logprobs_from_include_or_top_logprobs():
    from zccp.shared_types import TokenLogprob

    base = {"model": MODEL, "input": "hi"}
    assert RESPONSES.parse(base, LIMITS).sampling.logprobs is None
    assert RESPONSES.parse(base | {"top_logprobs": 0}, LIMITS).sampling.logprobs is None
    assert RESPONSES.parse(base | {"include": ["message.output_text.logprobs"]}, LIMITS).sampling.logprobs == 0
    assert RESPONSES.parse(base | {"top_logprobs": 3}, LIMITS).sampling.logprobs == 3
    for bad in ({"top_logprobs": 21}, {"include": "x"}, {"include": [1]}):
        with pytest.raises(ApiError):
            RESPONSES.parse(base | bad, LIMITS)
    req = RESPONSES.parse(base | {"include": ["message.output_text.logprobs"], "top_logprobs": 1}, LIMITS)
    lps = (TokenLogprob(b"a", -0.5, ((b"a", -0.5),)), TokenLogprob(b"b", -1.0, ((b"c", -0.1),)))
    item = {"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": [{"token": "a", "logprob": -0.5,
                                                                            "bytes": [97]}]}
    out = orjson.loads(RESPONSES.render(req, GenerationResult("ab", "end_turn", None, 1, 2, logprobs=lps), "r", 0))
    part = out["output"][0]["content"][0]
    assert part["logprobs"][0] == item and [x["token"] for x in part["logprobs"]] == ["a", "b"]
    enc = RESPONSES.stream(req, "r", 0, 1)
    raw = (enc.start() + enc.delta(TextDelta("a", lps[:1])) + enc.delta(TextDelta("", lps[1:]))
           + enc.finish(GenerationResult("a", "end_turn", None, 1, 2, logprobs=lps)))
    events = [orjson.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: ")]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [(e["delta"], len(e["logprobs"])) for e in deltas] == [("a", 1), ("", 1)]
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert done["logprobs"] == events[-1]["response"]["output"][0]["content"][0]["logprobs"] == part["logprobs"]


def test_engine_keys_name_the_endpoint():
    doc = {"model": MODEL, "prompt": "x", "input": "x", "messages": [{"role": "user", "content": "x"}]}
    keys = {api: compute(api, None, doc=dict(doc)) for api in ("openai", "completions", "responses")}
    assert len({k.exact_key for k in keys.values()}) == 3
    assert len({k.prefix_key for k in keys.values()}) == 3
    assert not keys["completions"].near and not keys["responses"].near    # exact-only
    assert keys["openai"].near
