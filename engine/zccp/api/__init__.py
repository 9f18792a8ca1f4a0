"""API front ends: each module turns request bytes into a GenerationRequest and
renders results, errors and SSE streams back into that API's bytes.

Both modules expose the same functions (parse_request, render_response,
render_error, http_status, new_response_id, StreamEncoder), so the engine can
pick one by ApiKind with `module_for(kind)`.
"""

from __future__ import annotations

from types import ModuleType

from ..request import ApiKind
from . import anthropic, openai
from .common import ParseLimits

__all__ = ["ParseLimits", "anthropic", "openai", "module_for"]


def module_for(kind: ApiKind) -> ModuleType:
    return anthropic if kind == "anthropic" else openai
