"""POST /v1/completions and POST /v1/responses through the real stack (nginx + Lua, the slot,
the engine, the tiny model), with the official openai SDK: answers, streams, tools, JSON
schemas, the refusals of a stateless server, the cache (the engine's keys, per endpoint) and
API keys' limits."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from tests.support.harness import sdk_clients
from tests.support.keys_helpers import keys_cli

MODEL = "zccp-tiny"
WEATHER = {"type": "object", "properties": {"city": {"enum": ["paris", "oslo", "lima"]},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "weather", "parameters": WEATHER}]
VERDICT = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
           "required": ["color", "ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def oai(stack):
    return sdk_clients(stack)[1]


# --------------------------------------------------------------------------- /v1/completions


def test_completion_and_its_stream(oai, stack):
    kw: dict[str, Any] = dict(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=0)
    r = oai.completions.create(**kw)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    c = r.choices[0]
    assert isinstance(c.text, str) and c.finish_reason in ("stop", "length") and c.logprobs is None
    # the prompt as is: BOS and its bytes, no chat roles (the byte tokenizer)
    assert r.usage.prompt_tokens == 1 + len(b"Once upon a time")
    assert 0 < r.usage.completion_tokens <= 24
    chunks = list(oai.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert "".join(x.choices[0].text for x in chunks if x.choices) == c.text
    assert [x.choices[0].finish_reason for x in chunks if x.choices and x.choices[0].finish_reason] == [
        c.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    stack.assert_no_leaks()


def test_completion_default_max_tokens_is_openais(oai):
    r = oai.completions.create(model=MODEL, prompt="x", temperature=0)
    assert r.usage.completion_tokens <= 16


def test_completion_logprobs_legacy_shape(oai):
    r = oai.completions.create(model=MODEL, prompt="abc", max_tokens=12, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    n = r.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(x <= 0 for x in lp.token_logprobs)
    assert all(1 <= len(t) <= 3 for t in lp.top_logprobs)
    assert lp.text_offset == sorted(lp.text_offset)


def test_several_prompts_n_choices_each_streamed_and_not(oai, stack):
    """Strings and token ids, n choices each: choices[i] is prompt i // n's (vLLM's numbering),
    usage counts each prompt once and every completion; the stream carries the same texts,
    a finish reason per choice, one usage chunk; logprobs per choice."""
    from zccp.model.tokenizer import BOS

    kw: dict[str, Any] = dict(model=MODEL, max_tokens=10, temperature=0)
    one = [oai.completions.create(prompt=p, **kw) for p in ("Once", "Hello there")]
    prompts = ["Once", "Hello there"]
    r = oai.completions.create(prompt=prompts, n=2, logprobs=1, **kw)
    # the same prompts as the ids the byte tokenizer makes of them: the same answers
    ids = oai.completions.create(prompt=[[BOS, *p.encode()] for p in prompts], n=2, **kw)
    assert [c.text for c in ids.choices] == [c.text for c in r.choices] and ids.usage == r.usage
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == [one[0].choices[0].text] * 2 + [one[1].choices[0].text] * 2
    assert all(len(c.logprobs.tokens) >= 1 and "".join(c.logprobs.tokens) == c.text for c in r.choices)
    assert r.usage.prompt_tokens == one[0].usage.prompt_tokens + one[1].usage.prompt_tokens
    assert r.usage.completion_tokens == 2 * (one[0].usage.completion_tokens + one[1].usage.completion_tokens)
    chunks = list(oai.completions.create(prompt=prompts, n=2, logprobs=1, stream=True,
                                         stream_options={"include_usage": True}, **kw))
    texts, reasons, tokens = ["", "", "", ""], [[], [], [], []], [0, 0, 0, 0]
    for x in chunks:
        for c in x.choices:
            texts[c.index] += c.text
            tokens[c.index] += len(c.logprobs.tokens) if c.logprobs else 0
            if c.finish_reason:
                reasons[c.index].append(c.finish_reason)
    assert texts == [c.text for c in r.choices]
    assert reasons == [[c.finish_reason] for c in r.choices]
    assert tokens == [len(c.logprobs.tokens) for c in r.choices]
    assert [x.usage for x in chunks if x.usage] == [r.usage] and chunks[-1].choices == []
    stack.assert_no_leaks()


def test_token_id_prompt_out_of_the_vocabulary(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model=MODEL, prompt=[[1, 2], [10**6]], max_tokens=4)
    assert e.value.body["param"] == "prompt" and str(10**6) in e.value.body["message"]


@pytest.mark.parametrize("extra,param", [
    ({"echo": True}, "echo"), ({"suffix": "end"}, "suffix"), ({"n": 200}, "n"), ({"best_of": 3}, "best_of"),
    ({"logprobs": 6}, "logprobs"), ({"prompt": ["a", 1]}, "prompt"), ({"prompt": []}, "prompt"),
])
def test_completion_refusals_name_the_field(oai, extra, param):
    kw = dict(model=MODEL, prompt="hi", max_tokens=4) | extra
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(**kw)
    assert e.value.body["param"] == param, e.value.body


def test_completion_unknown_model_and_missing_prompt(oai, stack):
    with pytest.raises(openai.NotFoundError):
        oai.completions.create(model="nope", prompt="x")
    r = stack.client().post("/v1/completions", json={"model": MODEL})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


# --------------------------------------------------------------------------- /v1/responses


def test_response_create_and_stream_agree(oai, stack):
    kw: dict[str, Any] = dict(model=MODEL, input="Hello", instructions="Be brief.", max_output_tokens=30,
                              temperature=0)
    r = oai.responses.create(**kw)
    assert r.object == "response" and r.id.startswith("resp_") and r.instructions == "Be brief."
    assert r.status in ("completed", "incomplete")
    assert r.output[0].type == "message" and r.output[0].content[0].type == "output_text"
    assert r.usage.input_tokens > 0 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    events = list(oai.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed" if r.status == "completed" else "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert deltas == r.output_text == final.output_text
    assert final.usage.output_tokens == r.usage.output_tokens
    stack.assert_no_leaks()


def test_response_logprobs_streamed_and_not(oai, stack):
    """include's logprobs: the output_text part's, and each delta event's (the SDK's types)."""
    kw: dict[str, Any] = dict(model=MODEL, input="Hello", max_output_tokens=12, temperature=0, top_logprobs=2,
                              include=["message.output_text.logprobs"])
    r = oai.responses.create(**kw)
    lps = r.output[0].content[0].logprobs
    assert len(lps) == r.usage.output_tokens and "".join(x.token for x in lps) == r.output_text
    assert all(x.logprob <= 0 and 1 <= len(x.top_logprobs) <= 2 and bytes(x.bytes) == x.token.encode()
               for x in lps)
    events = list(oai.responses.create(stream=True, **kw))
    streamed = [x for e in events if e.type == "response.output_text.delta" for x in e.logprobs]
    assert [(x.token, x.logprob) for x in streamed] == [(x.token, x.logprob) for x in lps]
    done = next(e for e in events if e.type == "response.output_text.done")
    assert [x.token for x in done.logprobs] == [x.token for x in events[-1].response.output[0].content[0].logprobs] \
        == [x.token for x in lps]
    plain = oai.responses.create(**{k: v for k, v in kw.items() if k not in ("include", "top_logprobs")})
    assert plain.output[0].content[0].logprobs == [] and plain.output_text == r.output_text
    stack.assert_no_leaks()


def test_response_stream_helper_gets_the_final_response(oai):
    # a JSON schema makes the answer end: response.completed, which the helper waits for
    with oai.responses.stream(model=MODEL, input="Judge.", max_output_tokens=200,
                              text={"format": {"type": "json_schema", "name": "v", "schema": VERDICT,
                                               "strict": True}}) as s:
        text = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        final = s.get_final_response()
    assert final.status == "completed" and final.output_text == text
    jsonschema.validate(json.loads(text), VERDICT)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_response_forced_function_call(oai, stream):
    kw: dict[str, Any] = dict(model=MODEL, input="Weather in Oslo?", tools=TOOLS, tool_choice="required",
                              max_output_tokens=200)
    if stream:
        events = list(oai.responses.create(stream=True, **kw))
        kinds = [e.type for e in events]
        assert "response.function_call_arguments.delta" in kinds
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert len(done) == 1 and done[0].name == "get_weather"
        r = events[-1].response
    else:
        r = oai.responses.create(**kw)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    # the call and its output go back as items, and the model answers the turn
    follow = oai.responses.create(model=MODEL, tools=TOOLS, max_output_tokens=20, input=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": calls[0].name,
         "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "oslo: 3 c"}])
    assert follow.output[0].type == "message"


def test_response_named_tool_choice_and_json_schema(oai):
    r = oai.responses.create(model=MODEL, input="x", tools=TOOLS, max_output_tokens=200,
                             tool_choice={"type": "function", "name": "get_weather"})
    assert [o.type for o in r.output] == ["function_call"]
    r = oai.responses.create(model=MODEL, input=[{"role": "user", "content": [{"type": "input_text", "text": "J"}]}],
                             max_output_tokens=200,
                             text={"format": {"type": "json_schema", "name": "v", "schema": VERDICT}})
    jsonschema.validate(json.loads(r.output_text), VERDICT)


@pytest.mark.parametrize("extra,param", [
    ({"previous_response_id": "resp_abc"}, "previous_response_id"), ({"store": True}, "store"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": []}, "input"), ({"top_logprobs": 21}, "top_logprobs"),
])
def test_response_refusals_name_the_field(oai, extra, param):
    kw = dict(model=MODEL, input="hi", max_output_tokens=4) | extra
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(**kw)
    assert e.value.body["param"] == param, e.value.body


def test_response_store_false_is_served(oai):
    assert oai.responses.create(model=MODEL, input="hi", max_output_tokens=4, store=False).status


# --------------------------------------------------------------------------- cache and limits


@pytest.fixture
def cstack(make_stack):
    return make_stack({"cache": {"ttl_s": 600}}, with_redis=True)


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"model": MODEL, "prompt": "Tell me", "max_tokens": 20, "temperature": 1}),
    ("/v1/responses", {"model": MODEL, "input": "Tell me", "max_output_tokens": 20, "temperature": 1}),
], ids=["completions", "responses"])
def test_cache_hits_per_endpoint_and_never_across(cstack, path, body):
    c = cstack.client()
    first = c.post(path, json=body)
    assert first.status_code == 200 and first.headers["x-zccp-cache"] == "MISS"
    second = c.post(path, json=body)
    assert second.headers["x-zccp-cache"] == "HIT"
    # sampled at temperature 1: only the cache makes them one answer
    key = "choices" if path == "/v1/completions" else "output"
    a, b = first.json(), second.json()
    text = (lambda d: d["choices"][0]["text"]) if key == "choices" else (
        lambda d: d["output"][0]["content"][0]["text"])
    assert text(a) == text(b) and a["id"] != b["id"] and a["usage"] == b["usage"]
    streamed = c.post(path, json=dict(body, stream=True))
    assert streamed.headers["x-zccp-cache"] == "HIT" and streamed.headers["content-type"].startswith(
        "text/event-stream")
    # the chat answer to the same words is another entry
    chat = c.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 20, "temperature": 1,
                                                "messages": [{"role": "user", "content": "Tell me"}]})
    assert chat.headers["x-zccp-cache"] == "MISS"
    other = c.post(path, json=dict(body, temperature=0.5))
    assert other.headers["x-zccp-cache"] == "MISS"
    cstack.assert_no_leaks()


def test_several_prompts_are_never_cached_nor_served_from_one(cstack):
    """An answer of several choices is not an entry, nor is a one-prompt entry ever its answer."""
    c = cstack.client()
    body = {"model": MODEL, "prompt": "Tell me more", "max_tokens": 12, "temperature": 1}
    assert c.post("/v1/completions", json=body).headers["x-zccp-cache"] == "MISS"
    for prompt in (["Tell me more", "Tell me more"], ["Tell me more", "x"]):
        for _ in range(2):
            r = c.post("/v1/completions", json=dict(body, prompt=prompt))
            assert r.status_code == 200 and r.headers["x-zccp-cache"] == "BYPASS"
            assert [ch["index"] for ch in r.json()["choices"]] == [0, 1]
    # a list of one prompt is its own body: a miss, then its own hit; the string's entry still one choice
    listed = dict(body, prompt=["Tell me more"])
    assert [c.post("/v1/completions", json=listed).headers["x-zccp-cache"] for _ in range(2)] == ["MISS", "HIT"]
    again = c.post("/v1/completions", json=body)
    assert again.headers["x-zccp-cache"] == "HIT" and len(again.json()["choices"]) == 1
    cstack.assert_no_leaks()


def test_keys_and_limits_apply(make_stack):
    s = make_stack({"model": {"backend": "null"}, "auth": {"mode": "keys", "cache_ttl_s": 1, "negative_ttl_s": 1}},
                   with_redis=True)
    for path, body in (("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 4}),
                       ("/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 4})):
        r = s.client().post(path, json=body)
        assert r.status_code == 401 and "error" in r.json()
    k = keys_cli(s, "create", "--tenant", "acme", "--rpm", "2")["key"]
    client = openai.OpenAI(base_url=s.base_url + "/v1", api_key=k, max_retries=0)
    client.completions.create(model=MODEL, prompt="hi", max_tokens=4)
    raw = client.responses.with_raw_response.create(model=MODEL, input="hi", max_output_tokens=4)
    assert raw.headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(openai.RateLimitError):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=4)
    # the output reservation is max_tokens for every choice: 2 prompts x n=2 x 30 > 100 tokens a minute
    o = keys_cli(s, "create", "--tenant", "globex", "--otpm", "100")["key"]
    client = openai.OpenAI(base_url=s.base_url + "/v1", api_key=o, max_retries=0)
    assert len(client.completions.create(model=MODEL, prompt=["hi", "ho"], max_tokens=30).choices) == 2
    with pytest.raises(openai.RateLimitError):
        client.completions.create(model=MODEL, prompt=["hi", "ho"], n=2, max_tokens=30)
    s.assert_no_leaks()


def test_hf_backend_prompt_as_is_and_tools_through_its_template(hf_stack, hf_checkpoint):
    """A checkpoint made at test time: the completion's prompt is its tokenizer's ids (its BOS,
    no template); a response's tools reach the model through its chat template, the call forced."""
    from transformers import AutoTokenizer

    from tests.support.hf_checkpoint import HF_MODEL

    tok = AutoTokenizer.from_pretrained(hf_checkpoint)
    oai = sdk_clients(hf_stack)[1]
    r = oai.completions.create(model=HF_MODEL, prompt="Once upon a time", max_tokens=8, temperature=0)
    assert r.usage.prompt_tokens == len(tok("Once upon a time").input_ids)
    # several prompts, as texts and as the tokenizer's ids: the same answers, each prompt's own
    texts = ["Once upon a time", "The weather today"]
    many = oai.completions.create(model=HF_MODEL, prompt=texts, max_tokens=8, temperature=0)
    ids = oai.completions.create(model=HF_MODEL, prompt=[tok(t).input_ids for t in texts], max_tokens=8,
                                 temperature=0)
    assert [c.text for c in many.choices] == [c.text for c in ids.choices] and many.choices[0].text == r.choices[0].text
    assert many.usage.prompt_tokens == ids.usage.prompt_tokens == sum(len(tok(t).input_ids) for t in texts)
    r = oai.responses.create(model=HF_MODEL, input="Weather in Oslo?", tools=TOOLS, tool_choice="required",
                             max_output_tokens=200)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
