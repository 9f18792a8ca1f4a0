"""OpenAI legacy Completions (`POST /v1/completions`): a prompt string in, its continuation out.

The prompt is the model's input as is (no chat template: GenerationRequest.prompt_text).
Validation and sampling are Chat Completions' (zccp.api.openai): the body is checked
here for what only this API has (prompt, echo, suffix, best_of, logprobs as an integer),
then read as the equivalent chat body. Errors are OpenAI's, in OpenAI's shape.

Served: `prompt` (a string, or a list of one string), `max_tokens` (default 16, as
OpenAI's), `temperature`, `top_p`, `stop`, `seed`, `stream` (+ `stream_options`),
`logprobs` (0..5: the legacy shape, tokens + token_logprobs + top_logprobs + text_offset),
`logit_bias`, `presence_penalty`, `frequency_penalty`, `user`. Refused with a 400:
several prompts, token-id prompts, `echo: true`, `suffix`, `best_of` > 1, `n` > 1.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Final

from ..shared_types import ApiError, ChatInput, GenerationRequest, GenerationResult, TextDelta, TokenLogprob, ToolCall
from . import openai
from .codec import ApiCodec
from .common import ParseLimits, dumps, random_id, sse
from .fields import json_type
from .openai import _known_only, _bool, _err, _int, _type_err, _unsupported

_FIELDS: Final = frozenset({
    "model", "prompt", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop", "seed",
    "user", "logit_bias", "presence_penalty", "frequency_penalty", "logprobs", "echo", "suffix", "best_of",
})
# What reads as the same field of a chat body.
_SHARED: Final = ("model", "max_tokens", "temperature", "top_p", "stream", "stream_options", "stop", "seed", "user",
                  "logit_bias", "presence_penalty", "frequency_penalty")
_DEFAULT_MAX_TOKENS: Final = 16     # OpenAI's for this endpoint
_MAX_LOGPROBS: Final = 5


def _prompt(v: Any) -> str:
    if isinstance(v, str):
        return v
    if not isinstance(v, list):
        raise _type_err("prompt", "one of a string, array of strings, array of integers or array of "
                        "arrays of integers", v)
    if len(v) == 1 and isinstance(v[0], str):
        return v[0]
    if v and all(isinstance(x, str) for x in v):
        raise _err(f"Invalid 'prompt': {len(v)} prompts in one request are not supported here; send one "
                   "prompt per request.", "prompt", "unsupported_value")
    kind = json_type(v[0]) if v else "empty array"
    raise _err(f"Invalid 'prompt': a prompt of token ids ({kind}) is not supported here; send the prompt "
               "as a string.", "prompt", "unsupported_value")


def _chat_body(obj: dict[str, Any], prompt: str) -> dict[str, Any]:
    """The chat body that asks for the same sampling (its parser checks those fields)."""
    chat: dict[str, Any] = {k: obj[k] for k in _SHARED if k in obj}
    chat["messages"] = [{"role": "user", "content": prompt}]
    if (k := obj.get("logprobs")) is not None:
        k = _int(k, "logprobs", 0)
        if k > _MAX_LOGPROBS:
            raise _err(f"Invalid 'logprobs': integer above maximum value. Expected a value <= {_MAX_LOGPROBS}, "
                       f"but got {k} instead.", "logprobs", "integer_above_max_value")
        chat["logprobs"], chat["top_logprobs"] = True, k
    return chat


def parse_document(obj: dict[str, Any], limits: ParseLimits) -> GenerationRequest:
    _known_only(obj, _FIELDS)
    if obj.get("prompt") is None:
        raise _err("Missing required parameter: 'prompt'.", "prompt", "missing_required_parameter")
    prompt = _prompt(obj["prompt"])
    if (v := obj.get("echo")) is not None and _bool(v, "echo"):
        raise _unsupported("echo", "true", "false")
    if obj.get("suffix") is not None:
        raise _err("Invalid 'suffix': suffix is not supported by this model.", "suffix", "unsupported_value")
    if (v := obj.get("best_of")) is not None and _int(v, "best_of", 1) != 1:
        raise _unsupported("best_of", str(v), "1")
    if (v := obj.get("n")) is not None and _int(v, "n", 1) != 1:
        raise _unsupported("n", str(v), "1")
    chat = _chat_body(obj, prompt)
    if chat.get("max_tokens") is None:
        chat["max_tokens"] = min(_DEFAULT_MAX_TOKENS, limits.max_tokens_cap)
    req = openai.parse_document(chat, limits)
    return replace(req, api="completions", prompt_text=prompt)


def chat_input(obj: dict[str, Any]) -> ChatInput:
    """Unused by the prompt formats (prompt_text has no template); the prompt as a user turn."""
    return openai.chat_input({"messages": [{"role": "user", "content": _prompt(obj["prompt"])}]})


# --- rendering ---

def new_response_id() -> str:
    return random_id("cmpl-", 29)


def _usage(r: GenerationResult) -> dict[str, Any]:
    return {"prompt_tokens": r.input_tokens, "completion_tokens": r.output_tokens,
            "total_tokens": r.input_tokens + r.output_tokens,
            "prompt_tokens_details": {"cached_tokens": r.cached_tokens}}


def _logprobs(lps: tuple[TokenLogprob, ...], offset: int) -> dict[str, Any]:
    """The legacy logprobs object; offset: the text_offset of the first token."""
    tokens = [t.token.decode("utf-8", "replace") for t in lps]
    offsets = []
    for s in tokens:
        offsets.append(offset)
        offset += len(s)
    return {"tokens": tokens, "token_logprobs": [t.logprob for t in lps],
            "top_logprobs": [{b.decode("utf-8", "replace"): lp for b, lp in t.top} for t in lps],
            "text_offset": offsets}


def render_response(req: GenerationRequest, result: GenerationResult, response_id: str, created: int) -> bytes:
    return dumps({
        "id": response_id, "object": "text_completion", "created": created, "model": req.model,
        "choices": [{"text": result.text, "index": 0,
                     "logprobs": None if result.logprobs is None else _logprobs(result.logprobs, 0),
                     "finish_reason": openai.FINISH_REASON[result.stop_reason]}],
        "usage": _usage(result),
    })


class StreamEncoder:
    """SSE chunks of one streamed completion: one per delta, the finish_reason's, the usage
    chunk when stream_options.include_usage, then [DONE]."""

    __slots__ = ("_head", "_include_usage", "_offset")

    def __init__(self, req: GenerationRequest, response_id: str, created: int, input_tokens: int,
                 cached_tokens: int = 0) -> None:
        del input_tokens, cached_tokens  # usage comes from the final GenerationResult
        self._head = {"id": response_id, "object": "text_completion", "created": int(created), "model": req.model}
        self._include_usage = req.include_usage
        self._offset = 0

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return sse(dumps({**self._head, "choices": choices, **extra}))

    def start(self) -> bytes:
        return b""

    def delta(self, d: TextDelta) -> bytes:
        if not d.text and not d.logprobs:
            return b""
        lp = _logprobs(d.logprobs, self._offset) if d.logprobs else None
        self._offset += len(d.text)
        return self._chunk([{"text": d.text, "index": 0, "logprobs": lp, "finish_reason": None}])

    def tool_call(self, call: ToolCall) -> bytes:
        del call
        return b""                      # no tools on this endpoint

    def finish(self, result: GenerationResult) -> bytes:
        out = self._chunk([{"text": "", "index": 0, "logprobs": None,
                            "finish_reason": openai.FINISH_REASON[result.stop_reason]}])
        if self._include_usage:
            out += self._chunk([], usage=_usage(result))
        return out + b"data: [DONE]\n\n"

    def error(self, err: ApiError) -> bytes:
        return sse(openai.render_error(err))


CODEC: Final = ApiCodec(
    name="completions", decode=openai.decode_body, parse=parse_document, render=render_response,
    stream=StreamEncoder, render_error=openai.render_error, http_status=openai.http_status,
    new_response_id=new_response_id, chat_input=chat_input, render_models=openai.render_models,
    render_model=openai.render_model,
)
