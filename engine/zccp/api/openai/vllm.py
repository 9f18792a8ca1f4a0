"""vLLM's sampling extensions, accepted on the OpenAI endpoints (Chat Completions and
Completions) as vLLM's OpenAI server accepts them: self-hosting clients and benchmark tools
(guidellm sends `ignore_eos`) rely on them. Each is bounded, refused with OpenAI's 400
naming it, and applied as vLLM documents (zccp.model.sampling.Extensions, the sampler's
min_p, the scheduler's stop_token_ids, the text assembler's min_tokens)."""

from __future__ import annotations

from typing import Any, Final

from ..bounds import MAX_REPETITION_PENALTY, MAX_STOP_TOKEN_IDS, MAX_TOKEN_ID_DIGITS, MAX_TOP_K, MIN_REPETITION_PENALTY
from .wording import _arr, _bool, _err, _int, _number

FIELDS: Final = frozenset({"ignore_eos", "min_tokens", "top_k", "min_p", "repetition_penalty", "stop_token_ids"})
_MAX_TOKEN_ID: Final = 10 ** MAX_TOKEN_ID_DIGITS - 1


def _above(param: str, hi: int, v: int) -> Exception:
    return _err(f"Invalid '{param}': integer above maximum value. Expected a value <= {hi}, but got {v} instead.",
                param, "integer_above_max_value")


def extensions(obj: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """The SamplingParams keywords of the extensions `obj` sends (none: {}); JSON null is absent."""
    out: dict[str, Any] = {}
    get = obj.get
    if (v := get("ignore_eos")) is not None:
        out["ignore_eos"] = _bool(v, "ignore_eos")
    if (v := get("min_tokens")) is not None:
        n = _int(v, "min_tokens", 0)
        if n > max_tokens:
            raise _err(f"Invalid 'min_tokens': min_tokens must be less than or equal to max_tokens={max_tokens}, "
                       f"got {n}.", "min_tokens", "invalid_value")
        out["min_tokens"] = n
    if (v := get("top_k")) is not None:
        k = _int(v, "top_k", -1)             # vLLM: -1 (and 0) is no top-k
        if k > MAX_TOP_K:
            raise _above("top_k", MAX_TOP_K, k)
        out["top_k"] = k if k > 0 else None
    if (v := get("min_p")) is not None:
        out["min_p"] = _number(v, "min_p", 0.0, 1.0)
    if (v := get("repetition_penalty")) is not None:
        out["repetition_penalty"] = _number(v, "repetition_penalty", MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY)
    if (v := get("stop_token_ids")) is not None:
        ids = _arr(v, "stop_token_ids")
        if len(ids) > MAX_STOP_TOKEN_IDS:
            raise _err(f"Invalid 'stop_token_ids': array too long. Expected an array with maximum length "
                       f"{MAX_STOP_TOKEN_IDS}, but got an array with length {len(ids)} instead.",
                       "stop_token_ids", "array_above_max_length")
        for i, t in enumerate(ids):
            if _int(t, f"stop_token_ids[{i}]", 0) > _MAX_TOKEN_ID:
                raise _above(f"stop_token_ids[{i}]", _MAX_TOKEN_ID, t)
        out["stop_token_ids"] = tuple(dict.fromkeys(ids))
    return out
