"""API front ends: each turns request bytes into a GenerationRequest and renders
results, errors and SSE streams back into that API's bytes, behind one ApiCodec.

    codec_for("anthropic" | "openai") -> ApiCodec
"""

from __future__ import annotations

from ..shared_types import ApiKind
from . import anthropic, openai
from .codec import ApiCodec
from .common import ParseLimits

__all__ = ["ApiCodec", "ParseLimits", "CODECS", "codec_for"]

CODECS: dict[ApiKind, ApiCodec] = {anthropic.CODEC.name: anthropic.CODEC, openai.CODEC.name: openai.CODEC}


def codec_for(kind: ApiKind) -> ApiCodec:
    return CODECS[kind]
