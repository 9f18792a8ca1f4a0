"""OpenAI Chat Completions API (`POST /v1/chat/completions`): request parsing.

Validation errors use OpenAI's wording ("Invalid type for 'temperature': ...",
"Missing required parameter: 'messages[0].role'.") and are raised as
OpenAIApiError, an ApiError that also carries OpenAI's `code`.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Final

from ...shared_types import MAX_CHOICES, GenerationRequest, OutputConstraint, Role, SamplingParams
from ..common import JOIN, BodyError, ParseLimits, decode_object, marker, merge_turns
from ..bounds import (
    LOGIT_BIAS_RANGE,
    MAX_LOGIT_BIAS,
    MAX_SEED,
    MAX_STOP_BYTES,
    MAX_TOOL_NAME,
    MAX_TOOLS,
    MAX_TOP_LOGPROBS,
    OPENAI_MAX_STOP,
    effective_sampling,
    never_fits,
    stop_too_long,
    token_id,
)
from ..constraints import json_output, schema_json, tool_call
from .media import check_image_part
from .vllm import FIELDS as VLLM_FIELDS, extensions
from .wording import (
    _ARTICLE, OpenAIApiError, _arr, _bool, _empty_array, _err, _int, _invalid_value, _missing, _number, _obj, _str,
    _type_err, _unsupported
)

_FIELDS: Final = VLLM_FIELDS | frozenset({
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
    "stop", "n", "stream", "stream_options", "seed", "user", "frequency_penalty", "presence_penalty",
    "logit_bias", "response_format", "logprobs", "top_logprobs",
    # accepted and ignored
    "metadata",
    "store", "parallel_tool_calls", "tools", "tool_choice", "prompt_cache_key",
    "safety_identifier",
})
_ROLES: Final = ("system", "assistant", "user", "tool", "developer")
_MESSAGE_FIELDS: Final[dict[str, frozenset[str]]] = {
    "system": frozenset({"role", "content", "name"}),
    "developer": frozenset({"role", "content", "name"}),
    "user": frozenset({"role", "content", "name"}),
    "assistant": frozenset({"role", "content", "name", "refusal", "tool_calls", "function_call", "audio"}),
    "tool": frozenset({"role", "content", "tool_call_id"}),
}
_PART_TYPES: Final[dict[str, tuple[str, ...]]] = {
    "system": ("text",),
    "developer": ("text",),
    "user": ("text", "image_url", "input_audio", "file"),
    "assistant": ("text", "refusal"),
    "tool": ("text",),
}
_MAX_STOP: Final = OPENAI_MAX_STOP

_INVALID_JSON: Final = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't "
    "using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was "
    "sent was not valid JSON.)"
)

# --- messages ---

def _content_text(content: Any, role: str, path: str) -> str:
    """The text of a message's `content`: a string or an array of content parts."""
    if isinstance(content, str):
        return content
    param = path + ".content"
    if not isinstance(content, list):
        raise _type_err(param, "one of a string or array of objects", content)
    if not content:
        raise _empty_array(param)
    allowed = _PART_TYPES[role]
    pieces: list[str] = []
    for j, part in enumerate(content):
        ppath = f"{param}[{j}]"
        part = _obj(part, ppath)
        if "type" not in part:
            raise _missing(ppath + ".type")
        ptype = part["type"]
        if ptype not in allowed:
            raise _invalid_value(ppath + ".type", ptype, allowed)
        if ptype == "text":
            if "text" not in part:
                raise _missing(ppath + ".text")
            pieces.append(_str(part["text"], ppath + ".text"))
            continue
        if ptype == "image_url":
            check_image_part(part, ppath)
        pieces.append(marker(ptype))
    return pieces[0] if len(pieces) == 1 else JOIN.join(pieces)


def _check_tool_calls(calls: list[Any], path: str) -> None:
    for k, call in enumerate(calls):
        cpath = f"{path}[{k}]"
        call = _obj(call, cpath)
        for key in ("id", "function"):
            if key not in call:
                raise _missing(f"{cpath}.{key}")
        _str(call["id"], cpath + ".id")
        fn = _obj(call["function"], cpath + ".function")
        for key in ("name", "arguments"):
            if key not in fn:
                raise _missing(f"{cpath}.function.{key}")
            _str(fn[key], f"{cpath}.function.{key}")


def _messages(v: Any) -> tuple[list[str], list[tuple[Role, str]]]:
    """Split messages into system parts and conversation turns."""
    items = _arr(v, "messages")
    if not items:
        raise _empty_array("messages")
    system: list[str] = []
    turns: list[tuple[Role, str]] = []
    calls = _ToolCalls()
    for i, msg in enumerate(items):
        path = f"messages[{i}]"
        msg = _obj(msg, path)
        if "role" not in msg:
            raise _missing(path + ".role")
        role = _str(msg["role"], path + ".role")
        if role not in _MESSAGE_FIELDS:
            raise _invalid_value(path + ".role", role, _ROLES)
        if role != "tool":
            calls.close()
        allowed = _MESSAGE_FIELDS[role]
        for key in msg:
            if key not in allowed:
                raise _err(f"Additional properties are not allowed ('{key}' was unexpected) - "
                           f"'messages.{i}'", f"{path}.{key}", None)
        content = msg.get("content")
        if role == "assistant":
            text = "" if content is None else _content_text(content, role, path)
            tool_calls = msg.get("tool_calls")
            if tool_calls is not None and _arr(tool_calls, path + ".tool_calls"):
                _check_tool_calls(tool_calls, path + ".tool_calls")
                calls.open(i, [c["id"] for c in tool_calls])
                text = text + JOIN + marker("tool_calls") if text else marker("tool_calls")
            turns.append(("assistant", text))
            continue
        if "content" not in msg:
            raise _missing(path + ".content")
        text = _content_text(content, role, path)
        if role in ("system", "developer"):
            system.append(text)
        elif role == "tool":
            if "tool_call_id" not in msg:
                raise _missing(path + ".tool_call_id")
            calls.answer(i, _str(msg["tool_call_id"], path + ".tool_call_id"))
            turns.append(("user", text))
        else:
            turns.append(("user", text))
    return system, turns


class _ToolCalls:
    """As the real API: tool messages answer the tool_calls of the assistant message just
    before them, and every call is answered before the next other message."""

    def __init__(self) -> None:
        self._at: int | None = None           # index of the assistant message whose calls are open
        self._pending: list[str] = []
        self._ids: frozenset[str] = frozenset()

    def open(self, i: int, ids: list[str]) -> None:
        self._at, self._pending, self._ids = i, list(ids), frozenset(ids)

    def answer(self, i: int, call_id: str) -> None:
        if self._at is None:
            raise _err("Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                       "message with 'tool_calls'.", f"messages.[{i}].role", None)
        if call_id not in self._ids:
            raise _err(f"Invalid parameter: 'tool_call_id' of '{call_id}' not found in 'tool_calls' of "
                       "previous message.", f"messages.[{i}].tool_call_id", None)
        if call_id in self._pending:
            self._pending.remove(call_id)

    def close(self) -> None:
        if self._at is not None and self._pending:
            raise _err("An assistant message with 'tool_calls' must be followed by tool messages responding "
                       "to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                       + ", ".join(self._pending), f"messages.[{self._at}].role", None)
        self._at = None


def _stop(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        if stop_too_long(v):
            raise _err(f"Invalid 'stop': string too long. Expected a string of at most {MAX_STOP_BYTES} bytes.",
                       "stop", "string_above_max_length")
        return (v,) if v else ()
    if not isinstance(v, list):
        raise _type_err("stop", "one of a string or array of strings", v)
    if len(v) > _MAX_STOP:
        raise _err(f"Invalid 'stop': array too long. Expected an array with maximum length {_MAX_STOP}, "
                   f"but got an array with length {len(v)} instead.", "stop", "array_above_max_length")
    for i, s in enumerate(v):
        _str(s, f"stop[{i}]")
        if stop_too_long(s):
            raise _err(f"Invalid 'stop[{i}]': string too long. Expected a string of at most {MAX_STOP_BYTES} bytes.",
                       f"stop[{i}]", "string_above_max_length")
    return tuple(s for s in v if s)   # an empty stop string would match everywhere


def _logit_bias(v: Any) -> tuple[tuple[int, float], ...]:
    """logit_bias: {"<token id>": bias in [-100, 100]}."""
    biases = _obj(v, "logit_bias")
    if len(biases) > MAX_LOGIT_BIAS:    # the sampler applies each entry on every token
        raise _err(f"Invalid 'logit_bias': too many entries. Expected at most {MAX_LOGIT_BIAS}, but got "
                   f"{len(biases)} instead.", "logit_bias", "invalid_value")
    out = []
    for key, bias in biases.items():
        if (tid := token_id(key)) is None:     # ASCII digits only; a 4,300-digit key is not an int()
            raise _err(f"Invalid key in 'logit_bias': {key[:32]}.", "logit_bias", "invalid_value")
        out.append((tid, _number(bias, f"logit_bias.{key}", -LOGIT_BIAS_RANGE, LOGIT_BIAS_RANGE)))
    return tuple(out)


_MAX_TOP_LOGPROBS: Final = MAX_TOP_LOGPROBS


def _logprobs(obj: dict[str, Any]) -> int | None:
    """logprobs (bool) and top_logprobs (0..20, only with logprobs): None when off."""
    on = _bool(v, "logprobs") if (v := obj.get("logprobs")) is not None else False
    top = obj.get("top_logprobs")
    if top is None:
        return 0 if on else None
    top = _int(top, "top_logprobs", 0)
    if top > _MAX_TOP_LOGPROBS:
        raise _err(f"Invalid 'top_logprobs': integer above maximum value. Expected a value <= "
                   f"{_MAX_TOP_LOGPROBS}, but got {top} instead.", "top_logprobs", "integer_above_max_value")
    if not on:
        raise _err("Invalid value for 'top_logprobs': 'logprobs' must be set to true if 'top_logprobs' is "
                   "provided.", "top_logprobs", "invalid_value")
    return top


def _ignored(obj: dict[str, Any]) -> None:
    """Check the shape of fields that are accepted but have no effect here."""
    if (v := obj.get("metadata")) is not None:
        _obj(v, "metadata")
    for key in ("store", "parallel_tool_calls"):
        if (v := obj.get(key)) is not None:
            _bool(v, key)
    for key in ("prompt_cache_key", "safety_identifier"):
        if (v := obj.get(key)) is not None:
            _str(v, key)


def _response_format(v: Any) -> OutputConstraint | None:
    """response_format: text (None), json_object, or json_schema (strict or not: the
    schema is enforced either way)."""
    rf = _obj(v, "response_format")
    if "type" not in rf:
        raise _missing("response_format.type")
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return json_output(None, "response_format")
    if kind != "json_schema":
        raise _invalid_value("response_format.type", kind, ("text", "json_object", "json_schema"))
    if "json_schema" not in rf:
        raise _missing("response_format.json_schema")
    js = _obj(rf["json_schema"], "response_format.json_schema")
    if "name" not in js:
        raise _missing("response_format.json_schema.name")
    _str(js["name"], "response_format.json_schema.name")
    if (s := js.get("strict")) is not None:
        _bool(s, "response_format.json_schema.strict")
    schema = _obj(v, "response_format.json_schema.schema") if (v := js.get("schema")) is not None else None
    return json_output(schema if schema is not None else {}, "response_format.json_schema.schema")


def _forced_tool(obj: dict[str, Any]) -> OutputConstraint | None:
    """tool_choice "required" or a named function: the turn is one call, its arguments
    valid against the tool's parameters."""
    choice, tools = obj.get("tool_choice"), obj.get("tools")
    if not tools or choice is None or choice in ("none", "auto"):
        return None
    defs = [(t["function"]["name"], t["function"].get("parameters")) for t in tools]
    only = None if choice == "required" else choice["function"]["name"]
    if only is not None and only not in {n for n, _ in defs}:
        raise _err(f"Invalid value for 'tool_choice': tool choice name '{only}' not found in 'tools'.",
                   "tool_choice", "invalid_value")
    return tool_call(defs, only, "tools")


def _tools(obj: dict[str, Any]) -> bool:
    """Check tools and tool_choice; True when tools are offered and may be called."""
    tools = obj.get("tools")
    if tools is not None:
        tools = _arr(tools, "tools")
        if len(tools) > MAX_TOOLS:
            raise _err(f"Invalid 'tools': array too long. Expected an array with maximum length {MAX_TOOLS}, "
                       f"but got an array with length {len(tools)} instead.", "tools", "array_above_max_length")
        for i, tool in enumerate(tools):
            path = f"tools[{i}]"
            tool = _obj(tool, path)
            if tool.get("type") != "function":
                raise _invalid_value(path + ".type", tool.get("type"), ("function",))
            if "function" not in tool:
                raise _missing(path + ".function")
            fn = _obj(tool["function"], path + ".function")
            if "name" not in fn:
                raise _missing(path + ".function.name")
            if len(_str(fn["name"], path + ".function.name")) > MAX_TOOL_NAME:
                raise _err(f"Invalid '{path}.function.name': string too long. Expected a string with maximum "
                           f"length {MAX_TOOL_NAME}.", path + ".function.name", "string_above_max_length")
            if (d := fn.get("description")) is not None:
                _str(d, path + ".function.description")
            if (params := fn.get("parameters")) is not None:
                schema_json(_obj(params, path + ".function.parameters"), path + ".function.parameters")
    choice = "auto"
    if (v := obj.get("tool_choice")) is not None:
        if isinstance(v, str):
            if v not in ("none", "auto", "required"):
                raise _invalid_value("tool_choice", v, ("none", "auto", "required"))
            choice = v
        else:
            fn = _obj(_obj(v, "tool_choice").get("function"), "tool_choice.function")
            _str(fn.get("name"), "tool_choice.function.name")
    return bool(tools) and choice != "none"


def decode_body(body: bytes | memoryview) -> dict[str, Any]:
    """The body as a JSON object (parsed once, with orjson), or this API's 400."""
    try:
        obj = decode_object(body)
    except BodyError as exc:
        if exc.reason == "empty":
            raise _err("Request body is empty. The OpenAI API expects a JSON object.", None, None) from None
        if exc.reason == "invalid":
            raise _err(_INVALID_JSON, None, None) from None
        raise _err(f"Invalid type for request body: expected an object, but got "
                   f"{_ARTICLE[exc.detail]} instead.", None, "invalid_type") from None
    return obj


def parse_request(body: bytes | memoryview, limits: ParseLimits) -> GenerationRequest:
    return parse_document(decode_body(body), limits)


def _known_only(obj: dict[str, Any], fields: Collection[str]) -> None:
    """OpenAI's refusal of body fields an endpoint does not know (every endpoint here)."""
    unknown = [k for k in obj if k not in fields]
    if unknown:
        noun = "argument" if len(unknown) == 1 else "arguments"
        raise _err(f"Unrecognized request {noun} supplied: {', '.join(unknown)}", None, None)


def parse_document(obj: dict[str, Any], limits: ParseLimits) -> GenerationRequest:
    """Validate an already-decoded body (decode_body) into a GenerationRequest."""
    _known_only(obj, _FIELDS)
    if obj.get("model") is None:
        raise _err("you must provide a model parameter", "model", None)
    model = _str(obj["model"], "model")
    if "messages" not in obj:
        raise _missing("messages")
    system, turns = _messages(obj["messages"])

    # Optional fields: JSON null is the same as absent, as in the real API.
    get = obj.get
    max_param, max_tokens = "max_tokens", None
    if (v := get("max_tokens")) is not None:
        max_tokens = _int(v, "max_tokens", 1)
    if (v := get("max_completion_tokens")) is not None:
        max_param, max_tokens = "max_completion_tokens", _int(v, "max_completion_tokens", 1)
    temperature = _number(v, "temperature", 0.0, 2.0) if (v := get("temperature")) is not None else 1.0
    top_p = _number(v, "top_p", 0.0, 1.0) if (v := get("top_p")) is not None else None
    temperature, top_p = effective_sampling(temperature, top_p)   # tiny ones are greedy
    stop = _stop(v) if (v := get("stop")) is not None else ()
    n = _int(v, "n", 1) if (v := get("n")) is not None else 1
    stream = _bool(v, "stream") if (v := get("stream")) is not None else False
    if n > MAX_CHOICES:
        raise _err(f"Invalid 'n': integer above maximum value. Expected a value <= {MAX_CHOICES}, but got {n} "
                   "instead.", "n", "integer_above_max_value")
    if (why := never_fits(n, limits.max_queue)) is not None:
        raise _err(f"Invalid 'n': {why}.", "n", "integer_above_max_value")
    if n > 1 and get("logprobs"):
        raise _unsupported("n", str(n), "1")    # n > 1 is served without logprobs
    include_usage = False
    if (v := get("stream_options")) is not None:
        if not stream:
            raise _err("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                       "stream_options", None)
        opts = _obj(v, "stream_options")
        if (u := opts.get("include_usage")) is not None:
            include_usage = _bool(u, "stream_options.include_usage")
        if (u := opts.get("include_obfuscation")) is not None:
            _bool(u, "stream_options.include_obfuscation")
    seed = _int(v, "seed", -MAX_SEED - 1) if (v := get("seed")) is not None else None
    if seed is not None and seed > MAX_SEED:      # an int64, as OpenAI's
        raise _err(f"Invalid 'seed': integer above maximum value. Expected a value <= {MAX_SEED}, but got "
                   f"{seed} instead.", "seed", "integer_above_max_value")
    user = _str(v, "user") if (v := get("user")) is not None else None
    tool_use = _tools(obj)
    _ignored(obj)
    logit_bias = _logit_bias(v) if (v := get("logit_bias")) is not None else ()
    presence = _number(v, "presence_penalty", -2.0, 2.0) if (v := get("presence_penalty")) is not None else 0.0
    frequency = _number(v, "frequency_penalty", -2.0, 2.0) if (v := get("frequency_penalty")) is not None else 0.0
    logprobs = _logprobs(obj)
    constraint = _forced_tool(obj) if tool_use else None
    if constraint is None and (v := get("response_format")) is not None:
        constraint = _response_format(v)

    if model not in limits.served_models:
        raise OpenAIApiError(404, "not_found_error",
                             f"The model `{model}` does not exist or you do not have access to it.",
                             "model", code="model_not_found")
    if max_tokens is None:
        max_tokens = min(limits.default_max_tokens, limits.max_tokens_cap)
    elif max_tokens > limits.max_tokens_cap:
        raise _err(f"{max_param} is too large: {max_tokens}. This model supports at most "
                   f"{limits.max_tokens_cap} completion tokens, whereas you provided {max_tokens}.",
                   max_param, "invalid_value")
    return GenerationRequest(
        api="openai",
        model=model,
        system=JOIN.join(system),
        messages=merge_turns(turns),
        sampling=SamplingParams(
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed, stop=stop,
            constraint=constraint, logit_bias=logit_bias, presence_penalty=presence, frequency_penalty=frequency,
            logprobs=logprobs, **extensions(obj, max_tokens),
        ),
        stream=stream,
        include_usage=include_usage,
        user=user,
        tool_use=tool_use,
        n=n,
    )


