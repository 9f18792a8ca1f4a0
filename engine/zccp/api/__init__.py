"""API front ends: each turns request bytes into a GenerationRequest and renders
results, errors and SSE streams back into that API's bytes, behind one ApiCodec.

    codec_for("anthropic" | "openai" | "completions" | "responses") -> ApiCodec
    api_for(openai flag, request.openai_api) -> the slot's API
"""

from __future__ import annotations

from ..transport.abi import OpenAIApi
from ..shared_types import ApiKind
from . import anthropic, completions, openai, responses
from .codec import ApiCodec
from .common import ParseLimits

__all__ = ["ApiCodec", "ParseLimits", "CODECS", "codec_for", "api_for"]

CODECS: dict[ApiKind, ApiCodec] = {c.name: c for c in (anthropic.CODEC, openai.CODEC, completions.CODEC,
                                                       responses.CODEC)}

_OPENAI: dict[int, ApiKind] = {OpenAIApi.CHAT: "openai", OpenAIApi.COMPLETIONS: "completions",
                               OpenAIApi.RESPONSES: "responses"}


def codec_for(kind: ApiKind) -> ApiCodec:
    return CODECS[kind]


def api_for(openai_flag: bool, openai_api: int) -> ApiKind:
    """The API of a slot: ZCCP_FLAG_API_OPENAI and request.openai_api (shared memory: a value
    nginx never writes is Chat Completions, whose parser then judges the body)."""
    if not openai_flag:
        return "anthropic"
    return _OPENAI.get(int(openai_api), "openai")
