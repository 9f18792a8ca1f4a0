"""Anthropic Messages API: the SSE events of one streamed message."""

from __future__ import annotations

from typing import Final

from ...shared_types import (
    NO_WRITE,
    ApiError,
    CacheWrite,
    GenerationRequest,
    GenerationResult,
    TextDelta,
    ToolArgsDelta,
    ToolCall,
    ToolCallStart,
)
from ..common import dumps, sse
from .render import _error_obj, _tool_use_id, _usage

_PING: Final = sse(b'{"type":"ping"}', "ping")
_TEXT_START: Final = b'{"type":"content_block_start","index":%d,"content_block":{"type":"text","text":""}}'
_BLOCK_STOP: Final = b'{"type":"content_block_stop","index":%d}'
_MESSAGE_STOP: Final = sse(b'{"type":"message_stop"}', "message_stop")
_DELTA_HEAD: Final = (b'event: content_block_delta\ndata: {"type":"content_block_delta",'
                      b'"index":%d,"delta":{"type":"text_delta","text":')
_DELTA_TAIL: Final = b"}}\n\n"


class StreamEncoder:
    """SSE bytes for one streamed message: start(), delta()* and tool calls (tool_start(),
    tool_args()*, tool_call(); or tool_call() alone), then finish() or error(). Content
    blocks open as content arrives: a text block at the first text (again after a tool
    call), one tool_use block per call, its input streamed as generated; an answer with
    neither still gets its (empty) text block. The ping follows the first block start."""

    __slots__ = ("_req", "_id", "_input_tokens", "_cached", "_written", "_blocks", "_open", "_tool", "_delta_head")

    def __init__(self, req: GenerationRequest, response_id: str, created: int, input_tokens: int,
                 cached_tokens: int = 0, written: CacheWrite = NO_WRITE) -> None:
        del created
        self._req = req
        self._id = response_id
        self._input_tokens = input_tokens
        self._cached = cached_tokens
        self._written = written
        self._blocks = 0          # content blocks started so far
        self._open = False        # a text block is open
        self._delta_head = b""    # the open text block's delta head (its index), made once per block
        self._tool: int | None = None   # the open tool_use block's index

    def start(self) -> bytes:
        message_start = dumps({
            "type": "message_start",
            "message": {
                "id": self._id,
                "type": "message",
                "role": "assistant",
                "model": self._req.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {**_usage(self._req, self._input_tokens, self._cached, self._written), "output_tokens": 1},
            },
        })
        return sse(message_start, "message_start")

    def _block_start(self, payload: bytes) -> bytes:
        out = sse(payload, "content_block_start")
        if self._blocks == 0:
            out += _PING
        self._blocks += 1
        return out

    def _close_text(self) -> bytes:
        if not self._open:
            return b""
        self._open = False
        return sse(_BLOCK_STOP % (self._blocks - 1), "content_block_stop")

    def delta(self, d: TextDelta) -> bytes:
        if not d.text:
            return b""
        if self._open:
            return self._delta_head + dumps(d.text) + _DELTA_TAIL
        head = self._block_start(_TEXT_START % self._blocks)
        self._open = True
        self._delta_head = _DELTA_HEAD % (self._blocks - 1)
        return head + self._delta_head + dumps(d.text) + _DELTA_TAIL

    def tool_start(self, start: ToolCallStart, call_id: str | None = None) -> bytes:
        """A tool_use block opens (its input streams as input_json_delta, tool_args())."""
        self._tool = self._blocks
        return self._close_text() + self._block_start(dumps({
            "type": "content_block_start", "index": self._tool,
            "content_block": {"type": "tool_use", "id": call_id or start.id or _tool_use_id(), "name": start.name,
                              "input": {}}}))

    def tool_args(self, piece: ToolArgsDelta) -> bytes:
        if not piece.text or self._tool is None:
            return b""
        return sse(dumps({"type": "content_block_delta", "index": self._tool,
                          "delta": {"type": "input_json_delta", "partial_json": piece.text}}), "content_block_delta")

    def tool_call(self, call: ToolCall) -> bytes:
        """The call is complete (or cut short): its block closes; a call that was not
        streamed (an upstream's) opens, sends its input in one delta and closes."""
        out = b""
        if self._tool is None:
            out = self.tool_start(ToolCallStart(call.name), call.id) + self.tool_args(ToolArgsDelta(call.arguments))
        index, self._tool = self._tool, None
        return out + sse(_BLOCK_STOP % index, "content_block_stop")

    def finish(self, result: GenerationResult) -> bytes:
        out = self._close_text()
        if self._blocks == 0:
            out += self._block_start(_TEXT_START % 0) + sse(_BLOCK_STOP % 0, "content_block_stop")
        message_delta = dumps({
            "type": "message_delta",
            "delta": {"stop_reason": result.stop_reason, "stop_sequence": result.stop_sequence},
            # cumulative, as Anthropic sends it: the input and cache fields, not only output_tokens
            # (its message_delta usage has no cache_creation breakdown: message_start has it)
            "usage": {**_usage(self._req, result.input_tokens, result.cached_tokens, result.cache_write,
                                by_ttl=False),
                      "output_tokens": result.output_tokens},
        })
        return out + sse(message_delta, "message_delta") + _MESSAGE_STOP

    def error(self, err: ApiError) -> bytes:
        return sse(dumps(_error_obj(err)), "error")


