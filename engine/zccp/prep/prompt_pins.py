"""Anthropic's cache_control breakpoints as prompt positions: how many of the prompt's
tokens each breakpoint covers (docs/cache.md, "Prompt caching").

A breakpoint marks "the prompt up to and including this block". The backend's own prompt
format says where that is: the request is cut right after the marked block
(zccp.api.anthropic.cut_at), the cut is encoded as a prefix (no generation prompt, as a
warm-up encodes), and the breakpoint covers the tokens that cut shares with the whole
prompt. So the position is exact for any chat template: a template that closes a message
the cut leaves open, or lays tools out after the system prompt, makes the shared part
shorter, never longer. A cut the API would refuse on its own (a tool_use left without its
result, a prefill ending in a space) pins nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from zccp.api import anthropic
from zccp.api.common import ParseLimits
from zccp.model.prompt import Prompt, PromptFormat
from zccp.model.tokenizer import PromptTooLong
from zccp.shared_types import ApiError, ChatInput, GenerationRequest, Pin

# Ids a cut may take beyond the whole prompt's (a template closing a message the cut ends in).
_SLACK = 64


def shared_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two 1-D id arrays."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def _chat(cut: dict[str, Any]) -> Callable[[], ChatInput]:
    return lambda: anthropic.chat_input(cut)


def pin_points(fmt: PromptFormat, doc: dict[str, Any], req: GenerationRequest, limits: ParseLimits,
               ids: np.ndarray) -> tuple[Pin, ...]:
    """The prompt prefix each of req's breakpoints covers (ids: the whole prompt's)."""
    pins: list[Pin] = []
    import torch   # pins are for a backend with a prefix cache: one that computes with torch

    scratch = torch.empty(len(ids) + _SLACK, dtype=torch.int32)
    for mark in req.cache_marks:
        cut = anthropic.cut_at(doc, mark)
        try:
            creq = anthropic.parse_warmup(cut, limits)
            n = fmt.encode_into(Prompt(creq, _chat(cut)), scratch, generation_prompt=False)
        except (ApiError, PromptTooLong, ValueError):      # a cut its own request would be refused for
            continue
        tokens = shared_prefix(scratch[:n].numpy(), ids)
        if tokens:
            pins.append(Pin(tokens, mark.ttl_s))
    return tuple(pins)
