"""Anthropic Messages API: rendering answers, errors, token counts and model lists."""

from __future__ import annotations

import time
from typing import Any, Final

import orjson
from orjson import Fragment

from ...serving.hermes_tools import partial_object
from ...shared_types import NO_WRITE, ApiError, CacheWrite, GenerationRequest, GenerationResult, ToolCall
from ..codec import ModelInfo
from ..common import dumps, random_id
from ..errors import KINDS

STATUS_BY_KIND: Final = {k.name: k.status for k in KINDS.values()}


def new_response_id() -> str:
    return random_id("msg_")


def http_status(err: ApiError) -> int:
    """The HTTP status to send `err` with (Anthropic uses ApiError.status as is)."""
    return err.status


def _error_obj(err: ApiError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": err.kind, "message": err.message}}


def render_error(err: ApiError) -> bytes:
    return dumps(_error_obj(err))


def _usage(req: GenerationRequest, input_tokens: int, cached_tokens: int, written: CacheWrite = NO_WRITE,
           by_ttl: bool = True) -> dict[str, Any]:
    """Anthropic's split of the prompt: cache_read_input_tokens were read from the prefix
    cache, cache_creation_input_tokens written into it at the request's cache_control
    breakpoints (by TTL in cache_creation), input_tokens are the rest (after the last
    breakpoint); the three add up to the prompt. A request without breakpoints asked for no
    prompt caching: as Anthropic's, it reports no cache read or write and the whole prompt as
    input_tokens (the automatic prefix reuse still happens; it is not a cache read)."""
    if not req.cache_marks:
        cached_tokens, written = 0, NO_WRITE
    usage: dict[str, Any] = {"input_tokens": input_tokens - cached_tokens - written.total,
                             "cache_creation_input_tokens": written.total,
                             "cache_read_input_tokens": cached_tokens}
    if by_ttl:
        usage["cache_creation"] = {"ephemeral_5m_input_tokens": written.short,
                                   "ephemeral_1h_input_tokens": written.long}
    return usage


def _tool_use_id() -> str:
    return random_id("toolu_")


def _input(call: ToolCall) -> str:
    """A tool_use block's input: an object always (a call cut short by max_tokens, or an
    upstream's arguments that are not one, closed into the longest valid prefix)."""
    if not call.truncated:
        try:
            if isinstance(orjson.loads(call.arguments), dict):
                return call.arguments
        except orjson.JSONDecodeError:
            pass
    return partial_object(call.arguments)


def render_response(req: GenerationRequest, result: GenerationResult, response_id: str, created: int) -> bytes:
    del created  # the Messages API has no timestamp field
    content: list[dict[str, Any]] = []
    if result.text or not result.tool_calls:
        content.append({"type": "text", "text": result.text})
    for call in result.tool_calls:
        content.append({"type": "tool_use", "id": call.id or _tool_use_id(), "name": call.name,
                        "input": Fragment(_input(call))})
    return dumps({
        "id": response_id,
        "type": "message",
        "role": "assistant",
        "model": req.model,
        "content": content,
        "stop_reason": result.stop_reason,
        "stop_sequence": result.stop_sequence,
        "usage": {**_usage(req, result.input_tokens, result.cached_tokens, result.cache_write),
                  "output_tokens": result.output_tokens},
    })


def render_count(input_tokens: int) -> bytes:
    """The POST /v1/messages/count_tokens answer."""
    return dumps({"input_tokens": input_tokens})


def render_models(models: list[ModelInfo]) -> bytes:
    """GET /v1/models (a request carrying anthropic-version): Anthropic's list shape."""
    data = [{"type": "model", "id": m.name, "display_name": m.name,
             "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(m.created))} for m in models]
    return dumps({"data": data, "has_more": False, "first_id": data[0]["id"] if data else None,
                  "last_id": data[-1]["id"] if data else None})


def render_model(model: ModelInfo) -> bytes:
    """GET /v1/models/{id}."""
    return dumps({"type": "model", "id": model.name, "display_name": model.name,
                  "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(model.created))})


