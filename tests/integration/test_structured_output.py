"""Constrained decoding through the real stack (nginx, slots, engine, batch scheduler),
with both official SDKs, on the built-in tiny model and on the hf backend (a checkpoint
made at test time). Random weights: only the grammar makes these answers valid, so
every one of them must parse and validate against its schema.

The schemas are bounded (maxLength, enums, integer ranges, maxItems, no additional
properties: what OpenAI's strict mode asks for), so a random model's answer ends
within max_tokens; an unbounded one (json_object) may run to max_tokens, and then
only that is checked."""

from __future__ import annotations

import json
import random
from typing import Any, Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field

from tests.support.hf_checkpoint import HF_MODEL
from tests.support.schemas import random_schema


@pytest.fixture(scope="module", params=["tiny", "hf"])
def sdk_stack(request):
    return request.getfixturevalue("stack" if request.param == "tiny" else "hf_stack")


@pytest.fixture(scope="module")
def model(sdk_stack) -> str:
    return HF_MODEL if sdk_stack.cfg.model.backend == "hf" else "zccp-tiny"


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=130)
    tags: list[Literal["red", "green", "blue"]] = Field(max_length=3)


USER = [{"role": "user", "content": "Give me the data as JSON."}]


def test_openai_parse_returns_the_pydantic_object(oai, model):
    done = oai.beta.chat.completions.parse(model=model, messages=USER, response_format=Person, max_tokens=200)
    choice = done.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Person)
    assert Person.model_validate_json(choice.message.content) == choice.message.parsed


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_random_strict_schemas_always_validate(oai, model, stream):
    rng = random.Random(23 + stream)
    for i in range(8):
        schema = random_schema(rng)
        kw: dict[str, Any] = dict(
            model=model, messages=[{"role": "user", "content": f"Case {i}: fill it in."}], max_tokens=300,
            temperature=rng.choice([0.0, 0.7, 1.0]), seed=i,
            response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema,
                                                                    "strict": True}})
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in oai.chat.completions.create(stream=True, **kw)
                           if c.choices)
        else:
            text = oai.chat.completions.create(**kw).choices[0].message.content
        jsonschema.validate(json.loads(text), schema)


def test_json_object_mode_gives_json(oai, model):
    for seed in range(3):
        done = oai.chat.completions.create(model=model, messages=USER, max_tokens=200, temperature=1.0, seed=seed,
                                           response_format={"type": "json_object"})
        choice = done.choices[0]
        text = choice.message.content
        assert text.startswith("{")
        if choice.finish_reason == "stop":        # complete: an object (random weights may run to the limit)
            assert isinstance(json.loads(text), dict)


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
        "required": ["zone"], "additionalProperties": False}
OAI_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
             {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}],
                         ids=["required", "named"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_openai_forced_tool_calls(oai, model, choice, stream):
    for seed in range(2):
        kw: dict[str, Any] = dict(model=model, messages=USER, max_tokens=200, tools=OAI_TOOLS, tool_choice=choice,
                                  temperature=1.0, seed=seed)
        if stream:
            with oai.chat.completions.stream(**kw) as s:
                done = s.get_final_completion()
        else:
            done = oai.chat.completions.create(**kw)
        c = done.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.tool_calls
        call = c.message.tool_calls[0].function
        if isinstance(choice, dict):
            assert call.name == "get_time"
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


TOOLS = [{"name": "get_weather", "input_schema": WEATHER}, {"name": "get_time", "input_schema": TIME}]


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}], ids=["any", "tool"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_anthropic_forced_tool_use(claude, model, choice, stream):
    for seed in range(2):
        # the default temperature (1.0) samples; each seed's prompt differs
        kw: dict[str, Any] = dict(model=model, messages=[{"role": "user", "content": f"Call {seed}."}],
                                  max_tokens=200, tools=TOOLS, tool_choice=choice)
        if stream:
            with claude.messages.stream(**kw) as s:
                msg = s.get_final_message()
        else:
            msg = claude.messages.create(**kw)
        assert msg.stop_reason == "tool_use"
        uses = [b for b in msg.content if b.type == "tool_use"]
        assert len(uses) == 1
        if choice["type"] == "tool":
            assert uses[0].name == "get_weather"
        jsonschema.validate(uses[0].input, SCHEMAS[uses[0].name])


def test_anthropic_output_config_json_schema(claude, model):
    schema = random_schema(random.Random(5))
    for stream in (False, True):
        kw: dict[str, Any] = dict(model=model, messages=USER, max_tokens=300,
                                  output_config={"format": {"type": "json_schema", "schema": schema}})
        if stream:
            with claude.messages.stream(**kw) as s:
                msg = s.get_final_message()
        else:
            msg = claude.messages.create(**kw)
        assert msg.stop_reason == "end_turn"
        jsonschema.validate(json.loads(msg.content[0].text), schema)


class Verdict(BaseModel):
    # Anthropic's SDK moves maxLength, minimum and the like out of the schema it sends
    # (into the description) and checks them itself: only a schema without them is the grammar.
    color: Literal["red", "green", "blue"]
    ok: bool
    level: Literal[1, 2, 3]


def test_anthropic_parse_returns_the_pydantic_object(claude, model):
    done = claude.messages.parse(model=model, messages=USER, max_tokens=200, output_format=Verdict)
    assert isinstance(done.parsed_output, Verdict)
