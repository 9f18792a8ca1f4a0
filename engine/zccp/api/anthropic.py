"""Anthropic Messages API (`POST /v1/messages`): request parsing and rendering.

Validation errors follow the real API's style: "<dotted.path>: <message>", e.g.
"messages.1.content.0.text: Field required"; ApiError.param carries the path.
"""

from __future__ import annotations

from typing import Any, Final

from ..request import (
    ApiError,
    GenerationRequest,
    GenerationResult,
    Role,
    SamplingParams,
    TextDelta,
)
from .codec import ApiCodec
from .errors import KINDS
from .common import (
    JOIN,
    BodyError,
    ParseLimits,
    decode_object,
    dumps,
    is_int,
    is_number,
    marker,
    merge_turns,
    random_id,
    sse,
)

__all__ = [
    "ParseLimits", "parse_request", "render_response", "render_error",
    "StreamEncoder", "http_status", "new_response_id", "STATUS_BY_KIND", "CODEC",
]

_FIELDS: Final = frozenset({
    "model", "messages", "max_tokens", "system", "stop_sequences", "temperature",
    "top_p", "top_k", "stream", "metadata", "tools", "tool_choice", "thinking",
    "service_tier",
})
_MESSAGE_FIELDS: Final = frozenset({"role", "content"})
_METADATA_FIELDS: Final = frozenset({"user_id"})
_ROLES: Final = frozenset({"user", "assistant"})

STATUS_BY_KIND: Final = {k.name: k.status for k in KINDS.values()}


def _bad(path: str, msg: str) -> ApiError:
    return ApiError(400, "invalid_request_error", f"{path}: {msg}", path)


def _required(obj: dict[str, Any], key: str, path: str) -> Any:
    if key not in obj:
        raise _bad(path, "Field required")
    return obj[key]


def _str(v: Any, path: str) -> str:
    if not isinstance(v, str):
        raise _bad(path, "Input should be a valid string")
    return v


def _list(v: Any, path: str) -> list[Any]:
    if not isinstance(v, list):
        raise _bad(path, "Input should be a valid list")
    return v


def _dict(v: Any, path: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _bad(path, "Input should be a valid dictionary")
    return v


def _no_extras(obj: dict[str, Any], allowed: frozenset[str], prefix: str) -> None:
    for key in obj:
        if key not in allowed:
            raise _bad(prefix + key, "Extra inputs are not permitted")


def _int(v: Any, path: str, ge: int) -> int:
    if not is_int(v):
        raise _bad(path, "Input should be a valid integer")
    if v < ge:
        raise _bad(path, f"Input should be greater than or equal to {ge}")
    return v


def _unit(v: Any, path: str) -> float:
    """A number in [0, 1] (temperature, top_p)."""
    if not is_number(v):
        raise _bad(path, "Input should be a valid number")
    if v < 0:
        raise _bad(path, "Input should be greater than or equal to 0")
    if v > 1:
        raise _bad(path, "Input should be less than or equal to 1")
    return float(v)


def _block_text(block: Any, path: str) -> str:
    """Text a content block contributes: its text, or "[type]" for other kinds."""
    block = _dict(block, path)
    btype = _str(_required(block, "type", path + ".type"), path + ".type")
    if btype != "text":
        return marker(btype)
    text = _str(_required(block, "text", path + ".text"), path + ".text")
    if not text:
        raise _bad(path + ".text", "text content blocks must be non-empty")
    return text


def _system(v: Any) -> str:
    if isinstance(v, str):
        return v
    if not isinstance(v, list):
        raise _bad("system", "Input should be a valid string or a list of text blocks")
    parts: list[str] = []
    for i, block in enumerate(v):
        path = f"system.{i}"
        block = _dict(block, path)
        btype = _required(block, "type", path + ".type")
        if btype != "text":
            raise _bad(path + ".type", "Input should be 'text'")
        text = _str(_required(block, "text", path + ".text"), path + ".text")
        if not text:
            raise _bad(path + ".text", "text content blocks must be non-empty")
        parts.append(text)
    return JOIN.join(parts)


def _messages(v: Any) -> list[tuple[Role, str]]:
    items = _list(v, "messages")
    if not items:
        raise _bad("messages", "at least one message is required")
    turns: list[tuple[Role, str]] = []
    last = len(items) - 1
    for i, msg in enumerate(items):
        path = f"messages.{i}"
        msg = _dict(msg, path)
        _no_extras(msg, _MESSAGE_FIELDS, path + ".")
        role = _required(msg, "role", path + ".role")
        if not isinstance(role, str) or role not in _ROLES:
            raise _bad(path + ".role", "Input should be 'user' or 'assistant'")
        content = _required(msg, "content", path + ".content")
        if isinstance(content, str):
            text = content
        elif isinstance(content, list):
            pieces = [_block_text(b, f"{path}.content.{j}") for j, b in enumerate(content)]
            text = pieces[0] if len(pieces) == 1 else JOIN.join(pieces)
        else:
            raise _bad(path + ".content", "Input should be a valid string or a list of content blocks")
        is_prefill = i == last and role == "assistant"
        if not text and not is_prefill:
            raise _bad(path, "all messages must have non-empty content except for the optional final assistant message")
        if is_prefill and text and text[-1].isspace():
            raise _bad(path + ".content", "final assistant content cannot end with trailing whitespace")
        turns.append((role, text))
    return turns


def _stop_sequences(v: Any) -> tuple[str, ...]:
    seqs = _list(v, "stop_sequences")
    for i, s in enumerate(seqs):
        _str(s, f"stop_sequences.{i}")
        if not s.strip():
            raise _bad(f"stop_sequences.{i}", "each stop sequence must contain non-whitespace characters")
    return tuple(seqs)


def _metadata(v: Any) -> str | None:
    meta = _dict(v, "metadata")
    _no_extras(meta, _METADATA_FIELDS, "metadata.")
    user = meta.get("user_id")
    if user is None:
        return None
    _str(user, "metadata.user_id")
    if len(user) > 256:
        raise _bad("metadata.user_id", "String should have at most 256 characters")
    return user


def _ignored(body: dict[str, Any]) -> None:
    """Fields accepted for compatibility but not acted on; check their outer shape only."""
    if (tools := body.get("tools")) is not None:
        for i, tool in enumerate(_list(tools, "tools")):
            _dict(tool, f"tools.{i}")
    for key in ("tool_choice", "thinking"):
        if (val := body.get(key)) is not None:
            _str(_required(_dict(val, key), "type", key + ".type"), key + ".type")
    if (tier := body.get("service_tier")) is not None and tier not in ("auto", "standard_only"):
        raise _bad("service_tier", "Input should be 'auto' or 'standard_only'")


def decode_body(body: bytes | memoryview) -> dict[str, Any]:
    """The body as a JSON object (parsed once, with orjson), or this API's 400."""
    try:
        obj = decode_object(body)
    except BodyError as exc:
        if exc.reason == "empty":
            msg = "Request body is empty; expected a JSON object"
        elif exc.reason == "invalid":
            msg = f"Request body is not valid JSON: {exc.detail}"
        else:
            msg = f"Request body must be a JSON object, got {exc.detail}"
        raise ApiError(400, "invalid_request_error", msg) from None
    return obj


def parse_request(body: bytes | memoryview, limits: ParseLimits) -> GenerationRequest:
    return parse_document(decode_body(body), limits)


def parse_document(obj: dict[str, Any], limits: ParseLimits) -> GenerationRequest:
    """Validate an already-decoded body (decode_body) into a GenerationRequest."""
    _no_extras(obj, _FIELDS, "")
    model = _str(_required(obj, "model", "model"), "model")
    max_tokens = _int(_required(obj, "max_tokens", "max_tokens"), "max_tokens", 1)
    turns = _messages(_required(obj, "messages", "messages"))

    # Optional fields: JSON null is treated as absent.
    get = obj.get
    system = _system(v) if (v := get("system")) is not None else ""
    stop = _stop_sequences(v) if (v := get("stop_sequences")) is not None else ()
    temperature = _unit(v, "temperature") if (v := get("temperature")) is not None else 1.0
    top_p = _unit(v, "top_p") if (v := get("top_p")) is not None else None
    top_k = _int(v, "top_k", 0) if (v := get("top_k")) is not None else None
    stream = get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("stream", "Input should be a valid boolean")
    user = _metadata(v) if (v := get("metadata")) is not None else None
    _ignored(obj)

    if model not in limits.served_models:
        raise ApiError(404, "not_found_error", f"model: {model}", "model")
    if max_tokens > limits.max_tokens_cap:
        raise _bad("max_tokens", f"{max_tokens} > {limits.max_tokens_cap}, which is the maximum "
                   f"allowed number of output tokens for {model}")

    return GenerationRequest(
        api="anthropic",
        model=model,
        system=system,
        messages=merge_turns(turns),
        sampling=SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k or None,          # 0 means "no top-k limit"
            stop=stop,
        ),
        stream=bool(stream),
        user=user,
    )


# --- rendering ---

def new_response_id() -> str:
    return random_id("msg_")


def http_status(err: ApiError) -> int:
    """The HTTP status to send `err` with (Anthropic uses ApiError.status as is)."""
    return err.status


def _error_obj(err: ApiError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": err.kind, "message": err.message}}


def render_error(err: ApiError) -> bytes:
    return dumps(_error_obj(err))


def render_response(req: GenerationRequest, result: GenerationResult, response_id: str, created: int) -> bytes:
    del created  # the Messages API has no timestamp field
    return dumps({
        "id": response_id,
        "type": "message",
        "role": "assistant",
        "model": req.model,
        "content": [{"type": "text", "text": result.text}],
        "stop_reason": result.stop_reason,
        "stop_sequence": result.stop_sequence,
        "usage": {"input_tokens": result.input_tokens, "output_tokens": result.output_tokens},
    })


_PING: Final = sse(b'{"type":"ping"}', "ping")
_BLOCK_START: Final = sse(
    b'{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}',
    "content_block_start")
_BLOCK_STOP: Final = sse(b'{"type":"content_block_stop","index":0}', "content_block_stop")
_MESSAGE_STOP: Final = sse(b'{"type":"message_stop"}', "message_stop")
_DELTA_HEAD: Final = (b'event: content_block_delta\ndata: {"type":"content_block_delta",'
                      b'"index":0,"delta":{"type":"text_delta","text":')
_DELTA_TAIL: Final = b"}}\n\n"


class StreamEncoder:
    """SSE bytes for one streamed message: start(), delta()*, then finish() or error()."""

    __slots__ = ("_req", "_id", "_input_tokens")

    def __init__(self, req: GenerationRequest, response_id: str, created: int, input_tokens: int) -> None:
        del created
        self._req = req
        self._id = response_id
        self._input_tokens = input_tokens

    def start(self) -> bytes:
        message_start = dumps({
            "type": "message_start",
            "message": {
                "id": self._id,
                "type": "message",
                "role": "assistant",
                "model": self._req.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": self._input_tokens, "output_tokens": 1},
            },
        })
        return sse(message_start, "message_start") + _BLOCK_START + _PING

    def delta(self, d: TextDelta) -> bytes:
        if not d.text:
            return b""
        return _DELTA_HEAD + dumps(d.text) + _DELTA_TAIL

    def finish(self, result: GenerationResult) -> bytes:
        message_delta = dumps({
            "type": "message_delta",
            "delta": {"stop_reason": result.stop_reason, "stop_sequence": result.stop_sequence},
            "usage": {"output_tokens": result.output_tokens},
        })
        return _BLOCK_STOP + sse(message_delta, "message_delta") + _MESSAGE_STOP

    def error(self, err: ApiError) -> bytes:
        return sse(dumps(_error_obj(err)), "error")


CODEC: Final = ApiCodec(
    name="anthropic", decode=decode_body, parse=parse_document, render=render_response, stream=StreamEncoder,
    render_error=render_error, http_status=http_status, new_response_id=new_response_id,
)
