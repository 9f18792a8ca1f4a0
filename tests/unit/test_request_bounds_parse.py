"""Issue 28 (items 2, 4, request halves of 3 and 5): every field a client sends is bounded
and validated at parse time, refused with the API's 400 naming the field (zccp.api.bounds)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest

from tests.support.fake_api import LIMITS, MODEL
from zccp.api import anthropic, completions, openai
from zccp.api import bounds as B
from zccp.shared_types import ApiError, GenerationRequest

USER = {"role": "user", "content": "Hello"}


def nested(depth: int) -> dict[str, Any]:
    """{"properties": {"a": {"properties": ... }}}: an object `depth` levels deep."""
    v: dict[str, Any] = {"type": "string"}
    for _ in range(depth - 1):
        v = {"a": v}
    return v


def oai(**fields: Any) -> GenerationRequest:
    return openai.parse_document({"model": MODEL, "messages": [USER], **fields}, LIMITS)


def ant(**fields: Any) -> GenerationRequest:
    return anthropic.parse_document({"model": MODEL, "max_tokens": 8, "messages": [USER], **fields}, LIMITS)


def refused(call: Any, param: str, **fields: Any) -> ApiError:
    with pytest.raises(ApiError) as exc:
        call(**fields)
    err = exc.value
    assert err.status == 400, err
    assert err.param is not None and err.param.startswith(param), (err.param, err.message)
    return err


# --- temperature ---

@pytest.mark.parametrize("call", [oai, ant])
def test_tiny_temperature_is_served_greedy(call) -> None:
    # 1e-300 would make logits / temperature inf and softmax NaN: below the epsilon it is greedy
    assert call(temperature=1e-300).sampling.temperature == 0.0
    assert call(temperature=B.MIN_TEMPERATURE / 2).sampling.temperature == 0.0
    assert call(temperature=0.5).sampling.temperature == 0.5
    # top_p 0 (or tiny) kept no token in the sampler: greedy too
    assert (call(top_p=0).sampling.temperature, call(top_p=1e-300).sampling.top_p) == (0.0, None)
    assert call(top_p=0.5).sampling.top_p == 0.5


def test_temperature_ranges_are_each_apis() -> None:
    assert oai(temperature=2).sampling.temperature == 2.0
    refused(oai, "temperature", temperature=2.01)
    refused(ant, "temperature", temperature=1.01)
    refused(oai, "temperature", temperature=-0.1)


# --- logit_bias ---

@pytest.mark.parametrize("key", ["\u00b2", "\u0663", "1" * 4300, "1234567890", "-1", " 1", "1.0", ""])
def test_logit_bias_keys_are_ascii_token_ids(key: str) -> None:
    err = refused(oai, "logit_bias", logit_bias={key: 1})
    assert "Invalid key" in err.message and len(err.message) < 100   # a 4,300-digit key is not echoed


def test_logit_bias_entry_count_is_bounded() -> None:
    ok = {str(i): 1 for i in range(B.MAX_LOGIT_BIAS)}
    assert len(oai(logit_bias=ok).sampling.logit_bias) == B.MAX_LOGIT_BIAS
    err = refused(oai, "logit_bias", logit_bias={str(i): 1 for i in range(B.MAX_LOGIT_BIAS + 1)})
    assert "too many entries" in err.message


def test_logit_bias_values_are_bounded() -> None:
    refused(oai, "logit_bias", logit_bias={"5": 100.5})
    assert oai(logit_bias={"5": -100}).sampling.logit_bias == ((5, -100.0),)


# --- stop sequences ---

def test_anthropic_stop_sequences_count_and_length() -> None:
    assert len(ant(stop_sequences=["x"] * B.ANTHROPIC_MAX_STOP).sampling.stop) == B.ANTHROPIC_MAX_STOP
    refused(ant, "stop_sequences", stop_sequences=["x"] * (B.ANTHROPIC_MAX_STOP + 1))
    refused(ant, "stop_sequences.0", stop_sequences=["x" * (B.MAX_STOP_BYTES + 1)])
    refused(ant, "stop_sequences.1", stop_sequences=["ok", "é" * (B.MAX_STOP_BYTES // 2 + 1)])   # bytes, not chars


def test_openai_stop_count_and_length() -> None:
    refused(oai, "stop", stop=["a"] * (B.OPENAI_MAX_STOP + 1))
    refused(oai, "stop[0]", stop=["a" * (B.MAX_STOP_BYTES + 1)])
    refused(oai, "stop", stop="a" * (B.MAX_STOP_BYTES + 1))
    assert oai(stop="a" * B.MAX_STOP_BYTES).sampling.stop == ("a" * B.MAX_STOP_BYTES,)


# --- tools and schemas ---

def _otool(i: int, params: Any = None) -> dict[str, Any]:
    return {"type": "function", "function": {"name": f"f{i}", "parameters": params or {"type": "object"}}}


def _atool(i: int, schema: Any = None) -> dict[str, Any]:
    return {"name": f"f{i}", "input_schema": schema or {"type": "object"}}


def test_tool_count_is_bounded() -> None:
    refused(oai, "tools", tools=[_otool(i) for i in range(B.MAX_TOOLS + 1)])
    refused(ant, "tools", tools=[_atool(i) for i in range(B.MAX_TOOLS + 1)])
    assert oai(tools=[_otool(i) for i in range(B.MAX_TOOLS)]).tool_use


@pytest.mark.parametrize("depth", [B.MAX_SCHEMA_DEPTH + 1, 300, 1000])
def test_deep_schemas_are_a_400_naming_the_field(depth: int) -> None:
    # past 255 levels orjson cannot serialise it: that was a 500
    refused(oai, "tools[0].function.parameters", tools=[_otool(0, nested(depth))])
    refused(ant, "tools.0.input_schema", tools=[_atool(0, nested(depth))])
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": nested(depth)}}
    refused(oai, "response_format.json_schema.schema", response_format=rf)
    refused(ant, "output_config.format.schema",
            output_config={"format": {"type": "json_schema", "schema": nested(depth)}})


def test_large_schemas_are_a_400() -> None:
    big = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(3000)}}
    assert len(orjson.dumps(big)) > B.MAX_SCHEMA_BYTES
    refused(oai, "tools[0].function.parameters", tools=[_otool(0, big)])
    refused(ant, "tools.0.input_schema", tools=[_atool(0, big)])
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": big}}
    refused(oai, "response_format.json_schema.schema", response_format=rf)


def test_schema_depth_is_iterative_and_stops_early() -> None:
    assert B.schema_depth(1) == 0 and B.schema_depth({}) == 1 and B.schema_depth([[{}]]) == 3
    assert B.schema_depth(nested(5000)) == B.MAX_SCHEMA_DEPTH + 1    # no RecursionError


def test_tool_name_length_is_bounded() -> None:
    refused(ant, "tools.0.name", tools=[{"name": "n" * (B.MAX_TOOL_NAME + 1), "input_schema": {}}])
    t = _otool(0)
    t["function"]["name"] = "n" * (B.MAX_TOOL_NAME + 1)
    refused(oai, "tools[0].function.name", tools=[t])


# --- other numbers ---

def test_top_logprobs_top_k_and_seed_are_bounded() -> None:
    refused(oai, "top_logprobs", logprobs=True, top_logprobs=B.MAX_TOP_LOGPROBS + 1)
    refused(ant, "top_k", top_k=B.MAX_TOP_K + 1)
    refused(oai, "seed", seed=2**70)
    assert oai(seed=B.MAX_SEED).sampling.seed == B.MAX_SEED


# --- n that can never be queued ---

def test_n_over_max_queue_is_a_400_not_a_429() -> None:
    limits = replace(LIMITS, max_queue=8)
    req = openai.parse_document({"model": MODEL, "messages": [USER], "n": 8}, limits)
    assert req.n == 8
    with pytest.raises(ApiError) as exc:
        openai.parse_document({"model": MODEL, "messages": [USER], "n": 9}, limits)
    assert exc.value.status == 400 and exc.value.param == "n" and "max_queue" in exc.value.message


def test_prompts_times_n_over_max_queue_is_a_400() -> None:
    limits = replace(LIMITS, max_queue=8)
    with pytest.raises(ApiError) as exc:
        completions.parse_document({"model": MODEL, "prompt": ["a", "b", "c"], "n": 3}, limits)
    assert exc.value.status == 400 and exc.value.param == "n" and "9 choices" in exc.value.message
