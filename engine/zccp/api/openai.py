"""OpenAI Chat Completions API (`POST /v1/chat/completions`): parsing and rendering.

Validation errors use OpenAI's wording ("Invalid type for 'temperature': ...",
"Missing required parameter: 'messages[0].role'.") and are raised as
OpenAIApiError, an ApiError that also carries OpenAI's `code`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Final

import orjson

from ..shared_types import (
    ApiError,
    ChatInput,
    GenerationRequest,
    MAX_CHOICES,
    GenerationResult,
    OutputConstraint,
    Role,
    SamplingParams,
    StopReason,
    TextDelta,
    TokenLogprob,
    ToolCall,
)
from .codec import ApiCodec, ModelInfo
from .constraints import json_output, tool_call
from .errors import KINDS
from .errors import kind as error_kind
from .common import (
    JOIN,
    BodyError,
    ParseLimits,
    decode_object,
    dumps,
    fmt_num,
    marker,
    merge_turns,
    random_id,
    sse,
)
from .fields import FieldReader, json_type

__all__ = [
    "ParseLimits", "OpenAIApiError", "parse_request", "render_response", "render_error",
    "StreamEncoder", "http_status", "new_response_id", "FINISH_REASON", "CODEC",
]


@dataclass
class OpenAIApiError(ApiError):
    """ApiError plus OpenAI's machine-readable `code` (e.g. "invalid_type")."""

    code: str | None = None


FINISH_REASON: Final[dict[StopReason, str]] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
}

_FIELDS: Final = frozenset({
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
_MAX_STOP: Final = 4

_INVALID_JSON: Final = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't "
    "using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was "
    "sent was not valid JSON.)"
)

# --- error constructors in OpenAI's wording ---

def _err(message: str, param: str | None, code: str | None, status: int = 400) -> OpenAIApiError:
    return OpenAIApiError(status, "invalid_request_error", message, param, code=code)


_ARTICLE: Final = {
    "string": "a string", "integer": "an integer", "number": "a decimal", "boolean": "a boolean",
    "array": "an array", "object": "an object", "null": "null",
}


def _type_err(param: str, expected: str, value: Any) -> OpenAIApiError:
    got = _ARTICLE[json_type(value)]
    return _err(f"Invalid type for '{param}': expected {expected}, but got {got} instead.", param, "invalid_type")


def _missing(param: str) -> OpenAIApiError:
    return _err(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")


def _invalid_value(param: str, value: Any, allowed: tuple[str, ...]) -> OpenAIApiError:
    quoted = [f"'{a}'" for a in allowed]
    supported = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + ", and " + quoted[-1]
    return _err(f"Invalid value: '{value}'. Supported values are: {supported}.", param, "invalid_value")


def _unsupported(param: str, value: str, default: str) -> OpenAIApiError:
    return _err(f"Unsupported value: '{param}' does not support {value} with this model. "
                f"Only the default ({default}) value is supported.", param, "unsupported_value")


def _empty_array(param: str) -> OpenAIApiError:
    return _err(f"Invalid '{param}': empty array. Expected an array with minimum length 1, "
                "but got an empty array instead.", param, "empty_array")


# --- typed field readers ---

class _Wording:
    """Field errors in OpenAI's words (and codes)."""

    _TYPE = {"string": "a string", "array": "an array", "object": "an object", "integer": "an integer",
             "number": "a decimal", "boolean": "a boolean"}

    def wrong_type(self, path: str, expected: str, value: Any) -> ApiError:
        return _type_err(path, self._TYPE[expected], value)

    def below(self, path: str, expected: str, lo: float, value: Any) -> ApiError:
        if expected == "integer":
            return _err(f"Invalid '{path}': integer below minimum value. Expected a value >= {lo}, "
                        f"but got {value} instead.", path, "integer_below_min_value")
        return _err(f"Invalid '{path}': decimal below minimum value. Expected a value >= {fmt_num(lo)}, "
                    f"but got {fmt_num(value)} instead.", path, "decimal_below_min_value")

    def above(self, path: str, expected: str, hi: float, value: Any) -> ApiError:
        return _err(f"Invalid '{path}': decimal above maximum value. Expected a value <= {fmt_num(hi)}, "
                    f"but got {fmt_num(value)} instead.", path, "decimal_above_max_value")


_F: Final = FieldReader(_Wording())
_number, _int, _bool, _str, _obj, _arr = _F.number, _F.integer, _F.boolean, _F.string, _F.object, _F.array


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
        else:
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
        return (v,) if v else ()
    if not isinstance(v, list):
        raise _type_err("stop", "one of a string or array of strings", v)
    if len(v) > _MAX_STOP:
        raise _err(f"Invalid 'stop': array too long. Expected an array with maximum length {_MAX_STOP}, "
                   f"but got an array with length {len(v)} instead.", "stop", "array_above_max_length")
    for i, s in enumerate(v):
        _str(s, f"stop[{i}]")
    return tuple(s for s in v if s)   # an empty stop string would match everywhere


def _logit_bias(v: Any) -> tuple[tuple[int, float], ...]:
    """logit_bias: {"<token id>": bias in [-100, 100]}."""
    out = []
    for key, bias in _obj(v, "logit_bias").items():
        if not key.isdigit():
            raise _err(f"Invalid key in 'logit_bias': {key}.", "logit_bias", "invalid_value")
        out.append((int(key), _number(bias, f"logit_bias.{key}", -100.0, 100.0)))
    return tuple(out)


_MAX_TOP_LOGPROBS: Final = 20


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


def _logprob_items(lps: tuple[TokenLogprob, ...]) -> list[dict[str, Any]]:
    """OpenAI's logprobs.content entries: token (its text), logprob, bytes, top_logprobs."""
    def one(token: bytes, lp: float) -> dict[str, Any]:
        return {"token": token.decode("utf-8", "replace"), "logprob": lp, "bytes": list(token)}

    return [{**one(t.token, t.logprob), "top_logprobs": [one(b, lp) for b, lp in t.top]} for t in lps]


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
        for i, tool in enumerate(_arr(tools, "tools")):
            path = f"tools[{i}]"
            tool = _obj(tool, path)
            if tool.get("type") != "function":
                raise _invalid_value(path + ".type", tool.get("type"), ("function",))
            if "function" not in tool:
                raise _missing(path + ".function")
            fn = _obj(tool["function"], path + ".function")
            if "name" not in fn:
                raise _missing(path + ".function.name")
            _str(fn["name"], path + ".function.name")
            if (d := fn.get("description")) is not None:
                _str(d, path + ".function.description")
            if (params := fn.get("parameters")) is not None:
                _obj(params, path + ".function.parameters")
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
    stop = _stop(v) if (v := get("stop")) is not None else ()
    n = _int(v, "n", 1) if (v := get("n")) is not None else 1
    stream = _bool(v, "stream") if (v := get("stream")) is not None else False
    if n > MAX_CHOICES:
        raise _err(f"Invalid 'n': integer above maximum value. Expected a value <= {MAX_CHOICES}, but got {n} "
                   "instead.", "n", "integer_above_max_value")
    if n > 1 and (stream or get("logprobs")):
        raise _unsupported("n", str(n), "1")    # n > 1 is served whole, without logprobs
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
    seed = _int(v, "seed") if (v := get("seed")) is not None else None
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
            logprobs=logprobs,
        ),
        stream=stream,
        include_usage=include_usage,
        user=user,
        tool_use=tool_use,
        n=n,
    )


# --- the conversation for a chat template ---

def _parts_text(content: Any, path: str, media: list[tuple[str, str]]) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    pieces = []
    for j, part in enumerate(content):
        if part["type"] in ("text", "refusal"):
            pieces.append(part.get("text") or part.get("refusal") or "")
        else:
            media.append((f"{path}.content[{j}]", part["type"]))
    return JOIN.join(pieces)


def _arguments(raw: Any) -> Any:
    """Tool-call arguments as the template takes them: the object (a JSON string that is
    not one stays a string)."""
    if isinstance(raw, str):
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw
        return parsed if isinstance(parsed, dict) else raw
    return raw


def chat_input(obj: dict[str, Any]) -> ChatInput:
    """A validated body (parse_document) as chat-template messages: the system and
    developer messages joined first (as GenerationRequest.system), then the turns in
    order; image, audio and file parts are listed in `media`."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    media: list[tuple[str, str]] = []
    for i, msg in enumerate(obj["messages"]):
        path, role = f"messages[{i}]", msg["role"]
        text = _parts_text(msg.get("content"), path, media)
        if role in ("system", "developer"):
            system.append(text)
        elif role == "tool":
            turns.append({"role": "tool", "tool_call_id": msg["tool_call_id"], "content": text})
        elif role == "assistant":
            m: dict[str, Any] = {"role": "assistant", "content": text}
            if msg.get("tool_calls"):
                m["tool_calls"] = [
                    {"id": tc["id"], "type": "function",
                     "function": {"name": tc["function"]["name"], "arguments": _arguments(tc["function"]["arguments"])}}
                    for tc in msg["tool_calls"]]
            turns.append(m)
        else:
            turns.append({"role": "user", "content": text})
    messages = ([{"role": "system", "content": JOIN.join(system)}] if system else []) + turns
    tools = obj.get("tools") or None
    choice = obj.get("tool_choice") or ("auto" if tools else None)
    if choice == "none":
        tools = None                     # a turn that may not call tools is not shown them
    return ChatInput(messages, tools, choice, tuple(media))


# --- rendering ---

def new_response_id() -> str:
    return random_id("chatcmpl-", 29)


def http_status(err: ApiError) -> int:
    """The HTTP status to send `err` with: the kind's OpenAI status (overload is 503, not 529)."""
    k = KINDS.get(err.kind)
    return k.openai_status if k is not None and err.status == k.status else err.status


def _error_obj(err: ApiError) -> dict[str, Any]:
    k = error_kind(err.kind, err.status)
    etype, code = k.openai_type, k.openai_code
    if isinstance(err, OpenAIApiError) and err.code is not None:
        code = err.code
    elif err.kind == "not_found_error" and err.param == "model":
        code = "model_not_found"
    return {"error": {"message": err.message, "type": etype, "param": err.param, "code": code}}


def render_error(err: ApiError) -> bytes:
    return dumps(_error_obj(err))


def _usage(result: GenerationResult) -> dict[str, Any]:
    return {
        "prompt_tokens": result.input_tokens,
        "completion_tokens": result.output_tokens,
        "total_tokens": result.input_tokens + result.output_tokens,
        "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
    }


def _call_id() -> str:
    return random_id("call_")


def _tool_calls(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    return [{"id": c.id or _call_id(), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls]


def render_response(req: GenerationRequest, result: GenerationResult, response_id: str, created: int) -> bytes:
    message: dict[str, Any] = {"role": "assistant", "content": result.text, "refusal": None}
    if result.tool_calls:
        message["content"] = result.text or None
        message["tool_calls"] = _tool_calls(result.tool_calls)
    return dumps({
        "id": response_id,
        "object": "chat.completion",
        "created": created,
        "model": req.model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": None if result.logprobs is None else {"content": _logprob_items(result.logprobs),
                                                              "refusal": None},
            "finish_reason": FINISH_REASON[result.stop_reason],
        }],
        "usage": _usage(result),
    })


def render_choices(req: GenerationRequest, results: list[GenerationResult], total: GenerationResult,
                   created: int) -> bytes:
    """An answer of n choices (n > 1, not streamed); total: the usage (the prompt once)."""
    choices = []
    for i, r in enumerate(results):
        message: dict[str, Any] = {"role": "assistant", "content": r.text, "refusal": None}
        if r.tool_calls:
            message["content"] = r.text or None
            message["tool_calls"] = _tool_calls(r.tool_calls)
        choices.append({"index": i, "message": message, "logprobs": None,
                        "finish_reason": FINISH_REASON[r.stop_reason]})
    return dumps({
        "id": new_response_id(), "object": "chat.completion", "created": created, "model": req.model,
        "choices": choices, "usage": _usage(total),
    })


def render_models(models: list[ModelInfo]) -> bytes:
    """GET /v1/models: OpenAI's list shape."""
    return dumps({"object": "list", "data": [_model(m) for m in models]})


def _model(m: ModelInfo) -> dict[str, Any]:
    return {"id": m.name, "object": "model", "created": m.created, "owned_by": "zccp"}


def render_model(model: ModelInfo) -> bytes:
    """GET /v1/models/{id}."""
    return dumps(_model(model))


_DONE: Final = b"data: [DONE]\n\n"
_FIRST_CHOICE: Final = (b'{"index":0,"delta":{"role":"assistant","content":"","refusal":null},'
                        b'"logprobs":null,"finish_reason":null}')
_DELTA_HEAD: Final = b'{"index":0,"delta":{"content":'
_DELTA_TAIL: Final = b'},"logprobs":null,"finish_reason":null}'


class StreamEncoder:
    """SSE bytes for one streamed completion: start(), delta()* and tool_call()*, then
    finish() or error(). A tool call is two chunks: its id, type and name with empty
    arguments, then the arguments (delta.tool_calls, indexed in call order)."""

    __slots__ = ("_head", "_tail", "_include_usage", "_calls")

    def __init__(self, req: GenerationRequest, response_id: str, created: int, input_tokens: int,
                 cached_tokens: int = 0, written: object = None) -> None:
        # usage is reported from the final GenerationResult (OpenAI has no cache writes)
        del input_tokens, cached_tokens, written
        # Every chunk is: _head + <choices items> + _tail.
        self._head = (b'data: {"id":' + dumps(response_id)
                      + b',"object":"chat.completion.chunk","created":' + str(int(created)).encode()
                      + b',"model":' + dumps(req.model) + b',"choices":[')
        self._include_usage = req.include_usage
        self._tail = b'],"usage":null}\n\n' if req.include_usage else b"]}\n\n"
        self._calls = 0

    def start(self) -> bytes:
        return self._head + _FIRST_CHOICE + self._tail

    def delta(self, d: TextDelta) -> bytes:
        if d.logprobs:
            choice = {"index": 0, "delta": {"content": d.text},
                      "logprobs": {"content": _logprob_items(d.logprobs), "refusal": None}, "finish_reason": None}
            return self._head + dumps(choice) + self._tail
        if not d.text:
            return b""
        return self._head + _DELTA_HEAD + dumps(d.text) + _DELTA_TAIL + self._tail

    def _tool_chunk(self, item: dict[str, Any]) -> bytes:
        choice = {"index": 0, "delta": {"tool_calls": [item]}, "logprobs": None, "finish_reason": None}
        return self._head + dumps(choice) + self._tail

    def tool_call(self, call: ToolCall) -> bytes:
        index = self._calls
        self._calls += 1
        return (self._tool_chunk({"index": index, "id": call.id or _call_id(), "type": "function",
                                  "function": {"name": call.name, "arguments": ""}})
                + self._tool_chunk({"index": index, "function": {"arguments": call.arguments}}))

    def finish(self, result: GenerationResult) -> bytes:
        reason = FINISH_REASON[result.stop_reason].encode()
        out = (self._head + b'{"index":0,"delta":{},"logprobs":null,"finish_reason":"'
               + reason + b'"}' + self._tail)
        if self._include_usage:
            out += self._head + b'],"usage":' + dumps(_usage(result)) + b"}\n\n"
        return out + _DONE

    def error(self, err: ApiError) -> bytes:
        return sse(dumps(_error_obj(err)))


CODEC: Final = ApiCodec(
    name="openai", decode=decode_body, parse=parse_document, render=render_response, stream=StreamEncoder,
    render_error=render_error, http_status=http_status, new_response_id=new_response_id,
    chat_input=chat_input, render_models=render_models, render_model=render_model, render_choices=render_choices,
)
