"""The seam between the engine and an API front end: one ApiCodec per API.

A codec turns a request body into a GenerationRequest and results, streams and
errors back into that API's bytes. The engine picks one by the slot's API flag
through the registry in zccp.api (codec_for); nothing else knows which API it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from zccp.api.common import ParseLimits
from zccp.shared_types import (
    ApiError,
    ApiKind,
    ChatInput,
    GenerationRequest,
    GenerationResult,
    TextDelta,
    ToolArgsDelta,
    ToolCall,
    ToolCallStart,
)


class StreamEncoder(Protocol):
    """SSE bytes for one streamed answer: start(), delta()* and tool_call()*, then
    finish() or error()."""

    def start(self) -> bytes: ...
    def delta(self, d: TextDelta) -> bytes: ...
    def tool_call(self, call: ToolCall) -> bytes: ...
    # a tool call streamed as generated: tool_start(), tool_args()*, then tool_call() closes it
    def tool_start(self, start: ToolCallStart) -> bytes: ...
    def tool_args(self, piece: ToolArgsDelta) -> bytes: ...
    def finish(self, result: GenerationResult) -> bytes: ...
    def error(self, err: ApiError) -> bytes: ...


class ChoiceStream(StreamEncoder, Protocol):
    """One choice's part of a stream of several (start() and error() unused): its deltas and
    finish_choice(); close() ends the whole stream once, with the total usage."""

    def finish_choice(self, result: GenerationResult) -> bytes: ...
    def close(self, total: GenerationResult) -> bytes: ...


@dataclass(frozen=True)
class ModelInfo:
    """A served model, as GET /v1/models lists it."""

    name: str
    created: int                  # unix seconds


@dataclass(frozen=True)
class ApiCodec:
    name: ApiKind
    # the body as a JSON object, parsed once (or this API's 400)
    decode: Callable[[bytes | memoryview], dict[str, Any]]
    # a decoded body validated into a request (or this API's 4xx)
    parse: Callable[[dict[str, Any], ParseLimits], GenerationRequest]
    # (req, result, response id, created) -> the non-streamed response body
    render: Callable[[GenerationRequest, GenerationResult, str, int], bytes]
    # (req, response id, created, input tokens[, reused prompt tokens]) -> the stream's encoder
    stream: Callable[..., StreamEncoder]
    render_error: Callable[[ApiError], bytes]
    http_status: Callable[[ApiError], int]
    new_response_id: Callable[[], str]
    # a validated body as chat-template messages (backends with a chat template)
    chat_input: Callable[[dict[str, Any]], ChatInput]
    # GET /v1/models in this API's shape, and GET /v1/models/{id}
    render_models: Callable[[list[ModelInfo]], bytes]
    render_model: Callable[[ModelInfo], bytes]
    # several choices in one answer (OpenAI's n, several prompts): (req, results in index
    # order, total usage, created) -> the body; None: one choice only
    render_choices: Callable[[GenerationRequest, list[GenerationResult], GenerationResult, int], bytes] | None = None
    # (req, response id, created, 0, 0, index=i) -> choice i's part of a stream of several; None: not streamed
    stream_choice: Callable[..., ChoiceStream] | None = None

    def parse_body(self, body: bytes | memoryview, limits: ParseLimits) -> GenerationRequest:
        return self.parse(self.decode(body), limits)
