"""The client libraries people run, unmodified, against the real stack (nginx + Lua, the
engine, the tiny model): LangChain's ChatOpenAI and ChatAnthropic, LiteLLM's SDK and the
OpenAI Agents SDK. Offline: every library's tracing and telemetry is off, and LiteLLM
reads its bundled model list (no download).

The tiny model has random weights: only the grammar (a forced tool call, a JSON schema)
makes its answers parse, so a parsed object here is ZCCP's doing, never luck. Schemas
are bounded (enums, integer ranges, maxLength) so that an answer ends within max_tokens."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any, Literal

import jsonschema
import pytest
from pydantic import BaseModel

# Before the libraries are imported: nothing may reach the network.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["LANGSMITH_TRACING"] = "false"
os.environ["LANGCHAIN_TRACING_V2"] = "false"
os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"

import litellm  # noqa: E402
from agents import (  # noqa: E402
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem  # noqa: E402
from langchain_anthropic import ChatAnthropic  # noqa: E402
from langchain_core.messages import AIMessage, AIMessageChunk  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
import openai  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

set_tracing_disabled(True)
litellm.telemetry = False

MODEL = "zccp-tiny"
# The tiny model's tokens are bytes: a tool call's hermes frame alone is ~45 of them
ROOM = 200
HELLO = [("user", "Say hello.")]


class Verdict(BaseModel):
    """A verdict on the request."""

    color: Literal["red", "green", "blue"]
    ok: bool
    # Literal, not ge/le: Anthropic's SDK moves numeric bounds out of the schema it sends
    # (into the description), so only the client would check them
    level: Literal[1, 2, 3]


VERDICT_SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                                   "ok": {"type": "boolean"}},
                  "required": ["color", "ok"], "additionalProperties": False}

WEATHER = {"type": "object", "properties": {"city": {"enum": ["paris", "oslo", "lima"]},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}


def get_weather(city: Literal["paris", "oslo", "lima"], unit: Literal["c", "f"]) -> str:
    """Current weather of a city."""
    return f"{city}: 21 {unit}"


# --------------------------------------------------------------------------- LangChain


@pytest.fixture(scope="module")
def lc_openai(stack) -> ChatOpenAI:
    # stream_usage: ChatOpenAI asks for usage in streams only from OpenAI's own URL unless told
    return ChatOpenAI(model=MODEL, base_url=stack.base_url + "/v1", api_key="unused", max_retries=0,
                      temperature=0, max_tokens=ROOM, timeout=60, stream_usage=True)


@pytest.fixture(scope="module")
def lc_anthropic(stack) -> ChatAnthropic:
    return ChatAnthropic(model=MODEL, base_url=stack.base_url, api_key="unused", max_retries=0,
                         temperature=0, max_tokens=ROOM, timeout=60)


@pytest.mark.parametrize("which", ["openai", "anthropic"])
def test_langchain_invoke_and_stream(which, lc_openai, lc_anthropic, stack):
    llm = lc_openai if which == "openai" else lc_anthropic
    whole = llm.invoke(HELLO)
    assert isinstance(whole, AIMessage) and isinstance(whole.content, (str, list))
    assert whole.usage_metadata and whole.usage_metadata["input_tokens"] > 0
    chunks = list(llm.stream(HELLO))
    assert chunks and all(isinstance(c, AIMessageChunk) for c in chunks)
    merged = chunks[0]
    for c in chunks[1:]:
        merged = merged + c
    assert merged.text == whole.text            # greedy: the stream is the same answer
    # usage arrives in the stream too, the prompt counted (ChatAnthropic reads message_delta's)
    assert merged.usage_metadata and merged.usage_metadata["input_tokens"] == whole.usage_metadata["input_tokens"]
    assert merged.usage_metadata["output_tokens"] == whole.usage_metadata["output_tokens"]
    stack.assert_no_leaks()


@pytest.mark.parametrize("which", ["openai", "anthropic"])
def test_langchain_bind_tools_forced(which, lc_openai, lc_anthropic):
    llm = lc_openai if which == "openai" else lc_anthropic
    bound = llm.bind_tools([get_weather], tool_choice="get_weather" if which == "openai" else "any")
    msg = bound.invoke([("user", "Weather in Oslo?")])
    assert len(msg.tool_calls) == 1
    call = msg.tool_calls[0]
    assert call["name"] == "get_weather"
    jsonschema.validate(call["args"], WEATHER)
    # the tool's answer goes back, and the model answers the turn
    follow = llm.bind_tools([get_weather]).invoke(
        [("user", "Weather in Oslo?"), msg,
         {"role": "tool", "tool_call_id": call["id"], "content": get_weather(**call["args"])}])
    assert isinstance(follow, AIMessage)


# The largest Verdict's arguments, {"color":"green","ok":false,"level":1}: 39 tokens on the tiny
# model (bytes). A forced call's frame is not counted (docs/tools.md), so this is room enough.
TIGHT = 39


@pytest.mark.parametrize("which", ["openai", "anthropic"])
def test_langchain_structured_output_at_a_tight_max_tokens(which, stack):
    kw: dict[str, Any] = dict(model=MODEL, api_key="unused", max_retries=0, temperature=0, timeout=60)
    make = ((lambda n: ChatOpenAI(base_url=stack.base_url + "/v1", max_tokens=n, **kw)) if which == "openai"
            else (lambda n: ChatAnthropic(base_url=stack.base_url, max_tokens=n, **kw)))
    out = make(TIGHT).with_structured_output(Verdict, method="function_calling", include_raw=True).invoke(
        [("user", "Judge this.")])
    assert out["parsing_error"] is None, out
    assert isinstance(out["parsed"], Verdict)
    # cut inside the arguments: still the tool call (truncated), never markup as text
    raw = make(5).with_structured_output(Verdict, method="function_calling", include_raw=True).invoke(
        [("user", "Judge this.")])["raw"]
    assert "<tool_call>" not in str(raw.content)
    assert [c["name"] for c in raw.tool_calls + raw.invalid_tool_calls] == ["Verdict"]


@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
def test_langchain_openai_structured_output(method, lc_openai):
    out = lc_openai.with_structured_output(Verdict, method=method, include_raw=True).invoke(
        [("user", "Judge this.")])
    assert out["parsing_error"] is None, out
    assert isinstance(out["parsed"], Verdict)


def test_langchain_openai_json_mode(lc_openai):
    """json_object holds the answer to any object, which a random model may not close within
    max_tokens: every answer that ends is parsed, and some seed's does end."""
    parsed = []
    for seed in range(8):
        llm = lc_openai.model_copy(update={"seed": seed, "temperature": 1.0})
        try:
            out = llm.with_structured_output(VERDICT_SCHEMA, method="json_mode", include_raw=True).invoke(
                [("user", "Judge this. Answer in JSON.")])
        except openai.LengthFinishReasonError:
            continue        # the openai SDK's parse refuses an answer cut by max_tokens
        assert out["parsing_error"] is None, out
        assert isinstance(out["parsed"], dict)
        parsed.append(out["parsed"])
    assert parsed


@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
def test_langchain_anthropic_structured_output(method, lc_anthropic):
    out = lc_anthropic.with_structured_output(Verdict, method=method, include_raw=True).invoke(
        [("user", "Judge this.")])
    assert out["parsing_error"] is None, out
    assert isinstance(out["parsed"], Verdict)
    # a dict schema gives a dict
    d = lc_anthropic.with_structured_output(VERDICT_SCHEMA | {"title": "verdict", "description": "a verdict"},
                                            method=method).invoke([("user", "Judge this.")])
    assert isinstance(d, dict)
    jsonschema.validate(d, VERDICT_SCHEMA)


def test_langchain_structured_output_on_the_hf_backend(hf_stack):
    """The same on a real tokenizer and chat template (a checkpoint made at test time)."""
    from tests.support.hf_checkpoint import HF_MODEL

    kw: dict[str, Any] = dict(model=HF_MODEL, api_key="unused", max_retries=0, max_tokens=ROOM, timeout=60)
    lc_o = ChatOpenAI(base_url=hf_stack.base_url + "/v1", **kw)
    lc_a = ChatAnthropic(base_url=hf_stack.base_url, **kw)
    for llm, methods in ((lc_o, ("function_calling", "json_schema")), (lc_a, ("function_calling", "json_schema"))):
        for method in methods:
            out = llm.with_structured_output(Verdict, method=method, include_raw=True).invoke([("user", "Judge.")])
            assert out["parsing_error"] is None and isinstance(out["parsed"], Verdict), (type(llm), method, out)


# --------------------------------------------------------------------------- LiteLLM


def _litellm_kw(stack, route: str) -> dict[str, Any]:
    if route == "openai":
        return dict(model=f"openai/{MODEL}", api_base=stack.base_url + "/v1", api_key="unused")
    return dict(model=f"anthropic/{MODEL}", api_base=stack.base_url, api_key="unused")


@pytest.mark.parametrize("route", ["openai", "anthropic"])
def test_litellm_completion_plain_and_streamed(route, stack):
    kw = _litellm_kw(stack, route) | dict(messages=[{"role": "user", "content": "Hi"}], max_tokens=24,
                                         temperature=0)
    whole = litellm.completion(**kw)
    text = whole.choices[0].message.content
    assert isinstance(text, str)
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.prompt_tokens > 0 and 0 < whole.usage.completion_tokens <= 24
    pieces = [c.choices[0].delta.content or "" for c in litellm.completion(stream=True, **kw) if c.choices]
    assert "".join(pieces) == text
    stack.assert_no_leaks()


@pytest.mark.parametrize("route", ["openai", "anthropic"])
def test_litellm_tools(route, stack):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
                                               "parameters": WEATHER}}]
    r = litellm.completion(**_litellm_kw(stack, route), messages=[{"role": "user", "content": "Oslo?"}],
                           max_tokens=100, tools=tools, tool_choice="required")
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and len(calls) == 1
    assert calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER)


@pytest.mark.parametrize("route", ["openai", "anthropic"])
def test_litellm_response_format_json_schema(route, stack):
    rf = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT_SCHEMA, "strict": True}}
    r = litellm.completion(**_litellm_kw(stack, route), messages=[{"role": "user", "content": "Judge."}],
                           max_tokens=100, response_format=rf)
    jsonschema.validate(json.loads(r.choices[0].message.content), VERDICT_SCHEMA)


# --------------------------------------------------------------------------- OpenAI Agents SDK


def _run_agent(model: Any, max_tokens: int = ROOM) -> tuple[Any, list[dict[str, str]]]:
    seen: list[dict[str, str]] = []

    @function_tool
    def weather(city: Literal["paris", "oslo", "lima"], unit: Literal["c", "f"]) -> str:
        """Current weather of a city."""
        seen.append({"city": city, "unit": unit})
        return get_weather(city, unit)

    agent = Agent(name="forecaster", instructions="Use the weather tool, then answer.", tools=[weather],
                  model=model, model_settings=ModelSettings(tool_choice="required", max_tokens=max_tokens,
                                                           temperature=0))
    result = asyncio.run(Runner.run(agent, "Weather in Lima?", max_turns=4))
    return result, seen


def _assert_two_turns(result: Any, seen: list[dict[str, str]]) -> None:
    kinds = [type(i) for i in result.new_items]
    # turn 1: the forced call, run; turn 2 (tool_choice reset to auto): the answer
    assert ToolCallItem in kinds and ToolCallOutputItem in kinds and kinds[-1] is MessageOutputItem, kinds
    assert len(result.raw_responses) >= 2
    assert seen and all(s["city"] in ("paris", "oslo", "lima") for s in seen)
    assert isinstance(result.final_output, str)


def test_agents_sdk_chat_completions_model_runs_the_tool_then_answers(stack):
    client = AsyncOpenAI(base_url=stack.base_url + "/v1", api_key="unused", max_retries=0)
    _assert_two_turns(*_run_agent(OpenAIChatCompletionsModel(model=MODEL, openai_client=client)))


def test_agents_sdk_required_tool_at_a_tight_max_tokens(stack):
    """{"city":"paris","unit":"c"} is 27 tokens; the frame around it is free (docs/tools.md).
    Chat Completions only: the Responses model raises on any answer cut by max_output_tokens
    (`response.incomplete`), and the second turn's text (the tiny model's noise) is one."""
    client = AsyncOpenAI(base_url=stack.base_url + "/v1", api_key="unused", max_retries=0)
    _assert_two_turns(*_run_agent(OpenAIChatCompletionsModel(model=MODEL, openai_client=client), max_tokens=27))


def test_agents_sdk_responses_model_runs_the_tool_then_answers(stack):
    """The Agents SDK's default model speaks /v1/responses: items in, items out."""
    client = AsyncOpenAI(base_url=stack.base_url + "/v1", api_key="unused", max_retries=0)
    _assert_two_turns(*_run_agent(OpenAIResponsesModel(model=MODEL, openai_client=client)))
