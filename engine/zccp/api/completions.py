"""OpenAI legacy Completions (`POST /v1/completions`): a prompt string in, its continuation out.

The prompt is the model's input as is (no chat template: GenerationRequest.prompt_text).
Validation and sampling are Chat Completions' (zccp.api.openai): the body is checked
here for what only this API has (prompt, echo, suffix, best_of, logprobs as an integer),
then read as the equivalent chat body. Errors are OpenAI's, in OpenAI's shape.

Served: `prompt` (a string, strings, token ids, lists of token ids: each prompt gets `n`
choices, `choices[i].index` = prompt index * n + choice index, as vLLM numbers them),
`n`, `max_tokens` (default 16, as OpenAI's), `temperature`, `top_p`, `stop`, `seed`,
`stream` (+ `stream_options`), `logprobs` (0..5: the legacy shape, tokens +
token_logprobs + top_logprobs + text_offset), `logit_bias`, `presence_penalty`,
`frequency_penalty`, `user`. Refused with a 400: `echo: true`, `suffix`, `best_of` > 1.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Final

from ..shared_types import (
    MAX_CHOICES,
    ApiError,
    ChatInput,
    GenerationRequest,
    GenerationResult,
    TextDelta,
    TokenLogprob,
    ToolArgsDelta,
    ToolCall,
    ToolCallStart,
)
from . import openai
from .bounds import never_fits
from .codec import ApiCodec
from .common import ParseLimits, dumps, random_id, sse
from .fields import is_int
from .openai.parse import _known_only
from .openai.vllm import FIELDS as VLLM_FIELDS
from .openai.render import _usage
from .openai.wording import _bool, _empty_array, _err, _int, _type_err, _unsupported

_FIELDS: Final = VLLM_FIELDS | frozenset({
    "model", "prompt", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop", "seed",
    "user", "logit_bias", "presence_penalty", "frequency_penalty", "logprobs", "echo", "suffix", "best_of",
})
# What reads as the same field of a chat body.
_SHARED: Final = ("model", "max_tokens", "temperature", "top_p", "stream", "stream_options", "stop", "seed", "user",
                  "logit_bias", "presence_penalty", "frequency_penalty", *sorted(VLLM_FIELDS))
_DEFAULT_MAX_TOKENS: Final = 16     # OpenAI's for this endpoint
_MAX_LOGPROBS: Final = 5


def _token_ids(v: list[Any], param: str) -> tuple[int, ...]:
    if not v:
        raise _err(f"Invalid '{param}': empty array. A prompt of token ids needs at least one id.", param,
                   "empty_array")
    if not all(is_int(x) and x >= 0 for x in v):
        raise _type_err(param, "an array of non-negative integers", v)
    return tuple(v)


def _prompts(v: Any) -> tuple[str | tuple[int, ...], ...]:
    """OpenAI's four shapes of `prompt`: a string, strings, token ids, lists of token ids."""
    if isinstance(v, str):
        return (v,)
    if not isinstance(v, list):
        raise _type_err("prompt", "one of a string, array of strings, array of integers or array of "
                        "arrays of integers", v)
    if not v:
        raise _empty_array("prompt")
    if all(isinstance(x, str) for x in v):
        return tuple(v)
    if all(is_int(x) for x in v):
        return (_token_ids(v, "prompt"),)
    if all(isinstance(x, list) for x in v):
        return tuple(_token_ids(x, f"prompt[{i}]") for i, x in enumerate(v))
    raise _type_err("prompt", "one of a string, array of strings, array of integers or array of arrays "
                    "of integers (not mixed)", v)


def _chat_body(obj: dict[str, Any], first: str) -> dict[str, Any]:
    """The chat body that asks for the same sampling (its parser checks those fields; `n` is
    this endpoint's: several choices here may stream and carry logprobs)."""
    chat: dict[str, Any] = {k: obj[k] for k in _SHARED if k in obj}
    chat["messages"] = [{"role": "user", "content": first}]
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
    prompts = _prompts(obj["prompt"])
    if (v := obj.get("echo")) is not None and _bool(v, "echo"):
        raise _unsupported("echo", "true", "false")
    if obj.get("suffix") is not None:
        raise _err("Invalid 'suffix': suffix is not supported by this model.", "suffix", "unsupported_value")
    if (v := obj.get("best_of")) is not None and _int(v, "best_of", 1) != 1:
        raise _unsupported("best_of", str(v), "1")
    n = _int(v, "n", 1) if (v := obj.get("n")) is not None else 1
    if len(prompts) * n > MAX_CHOICES:
        raise _err(f"Invalid 'n': {len(prompts)} prompt(s) x n={n} is {len(prompts) * n} choices; at most "
                   f"{MAX_CHOICES} in one request.", "n", "integer_above_max_value")
    if (why := never_fits(len(prompts) * n, limits.max_queue)) is not None:
        raise _err(f"Invalid 'n': {why}.", "n", "integer_above_max_value")
    first = prompts[0]
    chat = _chat_body(obj, first if isinstance(first, str) else "")
    if chat.get("max_tokens") is None:
        chat["max_tokens"] = min(_DEFAULT_MAX_TOKENS, limits.max_tokens_cap)
    req = openai.parse_document(chat, limits)
    return replace(req, api="completions", n=n, prompts=prompts, prompt_text=first if isinstance(first, str) else None)


def chat_input(obj: dict[str, Any]) -> ChatInput:
    """Unused by the prompt formats (prompt_text has no template); the first prompt as a user turn."""
    first = _prompts(obj["prompt"])[0]
    return openai.chat_input({"messages": [{"role": "user", "content": first if isinstance(first, str) else ""}]})


# --- rendering ---

def new_response_id() -> str:
    return random_id("cmpl-", 29)


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


def _choice(r: GenerationResult, index: int) -> dict[str, Any]:
    return {"text": r.text, "index": index,
            "logprobs": None if r.logprobs is None else _logprobs(r.logprobs, 0),
            "finish_reason": openai.FINISH_REASON[r.stop_reason]}


def render_response(req: GenerationRequest, result: GenerationResult, response_id: str, created: int) -> bytes:
    return dumps({"id": response_id, "object": "text_completion", "created": created, "model": req.model,
                  "choices": [_choice(result, 0)], "usage": _usage(result)})


def render_choices(req: GenerationRequest, results: list[GenerationResult], total: GenerationResult,
                   created: int) -> bytes:
    """Several choices (several prompts, or n > 1), in index order; total: the usage (every
    prompt once, every choice's completion)."""
    return dumps({"id": new_response_id(), "object": "text_completion", "created": created, "model": req.model,
                  "choices": [_choice(r, i) for i, r in enumerate(results)], "usage": _usage(total)})


class StreamEncoder:
    """SSE chunks of one streamed choice (`index`): one per delta, the finish_reason's; then,
    once for the whole answer (close), the usage chunk when stream_options.include_usage and
    [DONE]. finish() is both, for an answer of one choice."""

    __slots__ = ("_head", "_include_usage", "_offset", "_index")

    def __init__(self, req: GenerationRequest, response_id: str, created: int, input_tokens: int,
                 cached_tokens: int = 0, index: int = 0) -> None:
        del input_tokens, cached_tokens  # usage comes from the final GenerationResult
        self._head = {"id": response_id, "object": "text_completion", "created": int(created), "model": req.model}
        self._include_usage = req.include_usage
        self._offset = 0
        self._index = index

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return sse(dumps({**self._head, "choices": choices, **extra}))

    def start(self) -> bytes:
        return b""

    def delta(self, d: TextDelta) -> bytes:
        if not d.text and not d.logprobs:
            return b""
        lp = _logprobs(d.logprobs, self._offset) if d.logprobs else None
        self._offset += len(d.text)
        return self._chunk([{"text": d.text, "index": self._index, "logprobs": lp, "finish_reason": None}])

    def tool_call(self, call: ToolCall) -> bytes:
        del call
        return b""                      # no tools on this endpoint

    def tool_start(self, start: ToolCallStart) -> bytes:
        del start
        return b""

    def tool_args(self, piece: ToolArgsDelta) -> bytes:
        del piece
        return b""

    def finish_choice(self, result: GenerationResult) -> bytes:
        return self._chunk([{"text": "", "index": self._index, "logprobs": None,
                             "finish_reason": openai.FINISH_REASON[result.stop_reason]}])

    def close(self, total: GenerationResult) -> bytes:
        out = self._chunk([], usage=_usage(total)) if self._include_usage else b""
        return out + b"data: [DONE]\n\n"

    def finish(self, result: GenerationResult) -> bytes:
        return self.finish_choice(result) + self.close(result)

    def error(self, err: ApiError) -> bytes:
        return sse(openai.render_error(err))


CODEC: Final = ApiCodec(
    name="completions", decode=openai.decode_body, parse=parse_document, render=render_response,
    stream=StreamEncoder, render_error=openai.render_error, http_status=openai.http_status,
    new_response_id=new_response_id, chat_input=chat_input, render_models=openai.render_models,
    render_model=openai.render_model, render_choices=render_choices, stream_choice=StreamEncoder,
)
