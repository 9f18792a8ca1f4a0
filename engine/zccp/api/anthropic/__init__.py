"""Anthropic Messages API (`POST /v1/messages`): parse (request validation),
cache_marks (the cache_control breakpoints), chat (chat-template input), render (answers, errors) and
stream (SSE events), assembled into one ApiCodec."""

from __future__ import annotations

from typing import Final

from ..codec import ApiCodec
from ..common import ParseLimits
from .chat import chat_input
from .cache_marks import cut_at
from .parse import decode_body, parse_count_tokens, parse_document, parse_request, parse_warmup
from .render import (
    STATUS_BY_KIND,
    http_status,
    new_response_id,
    render_count,
    render_error,
    render_model,
    render_models,
    render_response,
)
from .stream import StreamEncoder

__all__ = [
    "ParseLimits", "parse_request", "parse_document", "parse_count_tokens", "parse_warmup", "decode_body",
    "cut_at", "chat_input", "render_response", "render_error", "render_count", "render_models", "render_model",
    "StreamEncoder", "http_status", "new_response_id", "STATUS_BY_KIND", "CODEC",
]

CODEC: Final = ApiCodec(
    name="anthropic", decode=decode_body, parse=parse_document, render=render_response, stream=StreamEncoder,
    render_error=render_error, http_status=http_status, new_response_id=new_response_id,
    chat_input=chat_input, render_models=render_models, render_model=render_model,
)
