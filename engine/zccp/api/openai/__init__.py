"""OpenAI Chat Completions API (`POST /v1/chat/completions`): wording (OpenAI's errors),
parse (request validation), chat (chat-template input), render (answers, errors) and
stream (SSE chunks), assembled into one ApiCodec. Completions and Responses reuse them."""

from __future__ import annotations

from typing import Final

from ..codec import ApiCodec
from ..common import ParseLimits
from .chat import chat_input
from .parse import decode_body, parse_document, parse_request
from .render import (
    FINISH_REASON,
    http_status,
    new_response_id,
    render_choices,
    render_error,
    render_model,
    render_models,
    render_response,
)
from .stream import StreamEncoder
from .wording import OpenAIApiError

__all__ = [
    "ParseLimits", "OpenAIApiError", "parse_request", "parse_document", "decode_body", "chat_input",
    "render_response", "render_choices", "render_error", "render_models", "render_model",
    "StreamEncoder", "http_status", "new_response_id", "FINISH_REASON", "CODEC",
]

CODEC: Final = ApiCodec(
    name="openai", decode=decode_body, parse=parse_document, render=render_response, stream=StreamEncoder,
    render_error=render_error, http_status=http_status, new_response_id=new_response_id,
    chat_input=chat_input, render_models=render_models, render_model=render_model, render_choices=render_choices,
    stream_choice=StreamEncoder,
)
