"""OpenAI Chat Completions API: the SSE chunks of one streamed completion."""

from __future__ import annotations

from typing import Any, Final

from ...shared_types import (
    ApiError,
    GenerationRequest,
    GenerationResult,
    TextDelta,
    ToolArgsDelta,
    ToolCall,
    ToolCallStart,
)
from ..common import dumps, sse
from .render import FINISH_REASON, _call_id, _error_obj, _logprob_items, _usage

_DONE: Final = b"data: [DONE]\n\n"
_FIRST_CHOICE: Final = (b'{"index":0,"delta":{"role":"assistant","content":"","refusal":null},'
                        b'"logprobs":null,"finish_reason":null}')
_FIRST_CALL: Final = (b'{"index":0,"delta":{"role":"assistant","content":null,"refusal":null},'
                       b'"logprobs":null,"finish_reason":null}')
_DELTA_HEAD: Final = b'{"index":0,"delta":{"content":'
_DELTA_TAIL: Final = b'},"logprobs":null,"finish_reason":null}'


class StreamEncoder:
    """SSE bytes for one streamed completion: start(), delta()* and tool calls (tool_start(),
    tool_args()*, tool_call(); or tool_call() alone), then finish() or error(). A tool call
    is a chunk with its id, type and name and empty arguments, then its arguments as they
    are generated (delta.tool_calls, indexed in call order; content null).

    One choice of several (n > 1, zccp.serving.choices): `index` is the choice's, every chunk carries
    it; start() is its role chunk, finish_choice() its finish chunk, and close() (called once,
    on one of them) the usage chunk of the whole answer and [DONE]."""

    __slots__ = ("_head", "_tail", "_include_usage", "_calls", "_open", "_index", "_first", "_delta_head")

    def __init__(self, req: GenerationRequest, response_id: str, created: int, input_tokens: int,
                 cached_tokens: int = 0, written: object = None, index: int = 0) -> None:
        # usage is reported from the final GenerationResult (OpenAI has no cache writes)
        del input_tokens, cached_tokens, written
        # Every chunk is: _head + <choices items> + _tail.
        self._head = (b'data: {"id":' + dumps(response_id)
                      + b',"object":"chat.completion.chunk","created":' + str(int(created)).encode()
                      + b',"model":' + dumps(req.model) + b',"choices":[')
        self._include_usage = req.include_usage
        self._tail = b'],"usage":null}\n\n' if req.include_usage else b"]}\n\n"
        self._calls = 0
        self._open = False         # a call's arguments are streaming
        self._index = index
        # a forced call has no text: its role chunk says content null, as OpenAI's does
        c = req.sampling.constraint
        first = _FIRST_CALL if c is not None and c.kind == "tool_call" and req.tool_use else _FIRST_CHOICE
        if index == 0:
            self._first, self._delta_head = first, _DELTA_HEAD
        else:                                   # the same bytes with this choice's index
            at = b'{"index":%d,' % index
            self._first = first.replace(b'{"index":0,', at, 1)
            self._delta_head = _DELTA_HEAD.replace(b'{"index":0,', at, 1)

    def start(self) -> bytes:
        return self._head + self._first + self._tail

    def delta(self, d: TextDelta) -> bytes:
        if d.logprobs:
            choice = {"index": self._index, "delta": {"content": d.text},
                      "logprobs": {"content": _logprob_items(d.logprobs), "refusal": None}, "finish_reason": None}
            return self._head + dumps(choice) + self._tail
        if not d.text:
            return b""
        return self._head + self._delta_head + dumps(d.text) + _DELTA_TAIL + self._tail

    def _tool_chunk(self, item: dict[str, Any]) -> bytes:
        # content null, as OpenAI sends it with tool calls (not "": the SDK would see a text delta)
        choice = {"index": self._index, "delta": {"content": None, "tool_calls": [item]}, "logprobs": None,
                  "finish_reason": None}
        return self._head + dumps(choice) + self._tail

    def tool_start(self, start: ToolCallStart, call_id: str | None = None) -> bytes:
        """A call's first chunk: its id, type and name, arguments "" (they follow, tool_args())."""
        self._open = True
        return self._tool_chunk({"index": self._calls, "id": call_id or start.id or _call_id(), "type": "function",
                                 "function": {"name": start.name, "arguments": ""}})

    def tool_args(self, piece: ToolArgsDelta) -> bytes:
        if not piece.text or not self._open:
            return b""
        return self._tool_chunk({"index": self._calls, "function": {"arguments": piece.text}})

    def tool_call(self, call: ToolCall) -> bytes:
        """The call is complete (or cut short); one that was not streamed (an upstream's) is
        its first chunk and its arguments in one."""
        out = b""
        if not self._open:
            out = self.tool_start(ToolCallStart(call.name), call.id) + self.tool_args(ToolArgsDelta(call.arguments))
        self._open = False
        self._calls += 1
        return out

    def finish_choice(self, result: GenerationResult) -> bytes:
        reason = FINISH_REASON[result.stop_reason].encode()
        return (self._head + b'{"index":%d,"delta":{},"logprobs":null,"finish_reason":"' % self._index
                + reason + b'"}' + self._tail)

    def close(self, total: GenerationResult) -> bytes:
        """The end of the whole stream: the usage chunk (stream_options.include_usage), [DONE]."""
        if self._include_usage:
            return self._head + b'],"usage":' + dumps(_usage(total)) + b"}\n\n" + _DONE
        return _DONE

    def finish(self, result: GenerationResult) -> bytes:
        return self.finish_choice(result) + self.close(result)

    def error(self, err: ApiError) -> bytes:
        return sse(dumps(_error_obj(err)))


