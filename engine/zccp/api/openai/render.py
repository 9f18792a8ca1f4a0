"""OpenAI Chat Completions API: rendering answers (one choice or n), errors and model lists."""

from __future__ import annotations

from typing import Any, Final

from ...shared_types import ApiError, GenerationRequest, GenerationResult, StopReason, TokenLogprob, ToolCall
from ..codec import ModelInfo
from ..common import dumps, random_id
from ..errors import KINDS
from ..errors import kind as error_kind
from .wording import OpenAIApiError

FINISH_REASON: Final[dict[StopReason, str]] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
}


def _logprob_items(lps: tuple[TokenLogprob, ...]) -> list[dict[str, Any]]:
    """OpenAI's logprobs.content entries: token (its text), logprob, bytes, top_logprobs."""
    def one(token: bytes, lp: float) -> dict[str, Any]:
        return {"token": token.decode("utf-8", "replace"), "logprob": lp, "bytes": list(token)}

    return [{**one(t.token, t.logprob), "top_logprobs": [one(b, lp) for b, lp in t.top]} for t in lps]



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


