"""The two upstream APIs on the wire: a request body for each, and each one's answer
(an SSE stream) read back as the engine's own events.

Requests are built from what the client's codec already made of the body: the
GenerationRequest (sampling) and its ChatInput (the conversation in chat-template shape,
tool calls and tool results included), so the client's API never reaches the upstream
as such: OpenAI in, Anthropic out (or the reverse) is the same code as same-to-same.

A streamed request is streamed from the upstream, a whole one asked whole (no SSE to
parse, no per-token notices upstream). Each API's reader turns the upstream's stream
events, or its whole answer, into TextDelta, ToolCall (whole, in the upstream's order,
its id and arguments kept) and one Finish. A streamed answer's tool call also streams:
ToolCallStart once its name is known, ToolArgsDelta for each piece of its arguments as the
upstream sends them, then its ToolCall (docs/tools.md); one call streams at a time, and text
the upstream sends while a call is open is held until that call ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from zccp.shared_types import (ApiError, ChatInput, GenerationRequest, StopReason, TextDelta, ToolArgsDelta, ToolCall,
                               ToolCallStart)

# OpenAI finish_reason -> the engine's (Anthropic's) stop reason; content_filter has no
# counterpart and ends the turn.
FINISH_TO_STOP: dict[str, StopReason] = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                                         "function_call": "tool_use", "content_filter": "end_turn"}
ANTHROPIC_STOPS: frozenset[str] = frozenset({"end_turn", "max_tokens", "stop_sequence", "tool_use"})
ANTHROPIC_VERSION = "2023-06-01"


@dataclass(frozen=True)
class Finish:
    """The end of an upstream answer: why it stopped and what it counted."""

    stop_reason: StopReason
    stop_sequence: str | None
    input_tokens: int | None         # every prompt token (cache reads included); None: not reported
    output_tokens: int | None
    cached_tokens: int = 0


Event = TextDelta | ToolCallStart | ToolArgsDelta | ToolCall | Finish


class UpstreamBroken(Exception):
    """The answer stopped making sense or stopped mid-way (after its first byte: no retry)."""


# -- requests -------------------------------------------------------------------------------

def _json_args(raw: Any) -> str:
    return raw if isinstance(raw, str) else orjson.dumps(raw).decode()


def _args_obj(raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    try:
        return orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        return {"arguments": raw}       # Anthropic needs an object: the text, kept whole


def openai_body(req: GenerationRequest, chat: ChatInput, model: str) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for m in chat.messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            messages.append({"role": "assistant", "content": m.get("content") or None, "tool_calls": [
                {"id": c["id"], "type": "function",
                 "function": {"name": c["function"]["name"], "arguments": _json_args(c["function"]["arguments"])}}
                for c in m["tool_calls"]]})
        elif m["role"] == "tool":
            messages.append({"role": "tool", "tool_call_id": m["tool_call_id"], "content": m["content"]})
        else:
            messages.append({"role": m["role"], "content": m["content"]})
    s = req.sampling
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": s.max_tokens,
                            "temperature": s.temperature, "stream": req.stream}
    if req.stream:
        body["stream_options"] = {"include_usage": True}
    if s.top_p is not None:
        body["top_p"] = s.top_p
    if s.seed is not None:
        body["seed"] = s.seed
    if s.stop:
        body["stop"] = list(s.stop)
    if s.presence_penalty:
        body["presence_penalty"] = s.presence_penalty
    if s.frequency_penalty:
        body["frequency_penalty"] = s.frequency_penalty
    if chat.tools:
        body["tools"] = chat.tools
        if chat.tool_choice is not None:
            body["tool_choice"] = chat.tool_choice
    c = s.constraint
    if c is not None and c.kind == "json":
        body["response_format"] = ({"type": "json_object"} if c.schema is None else
                                   {"type": "json_schema",
                                    "json_schema": {"name": "answer", "schema": orjson.loads(c.schema)}})
    if req.user:
        body["user"] = req.user
    return body


def anthropic_body(req: GenerationRequest, chat: ChatInput, model: str) -> dict[str, Any]:
    s = req.sampling
    if s.constraint is not None and s.constraint.kind == "json":
        raise ApiError(400, "invalid_request_error",
                       "structured output (a JSON answer) is not forwarded to an Anthropic-API upstream")
    system: list[str] = []
    messages: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        # consecutive turns of one role are one message (tool results, then the user's text)
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    for m in chat.messages:
        role = m["role"]
        if role == "system":
            system.append(m["content"])
        elif role == "tool":
            add("user", [{"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}])
        elif role == "assistant":
            blocks = [{"type": "text", "text": m["content"]}] if m.get("content") else []
            blocks += [{"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                        "input": _args_obj(c["function"]["arguments"])} for c in m.get("tool_calls") or ()]
            add("assistant", blocks or [{"type": "text", "text": ""}])
        else:
            add("user", [{"type": "text", "text": m["content"]}])
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": s.max_tokens,
                            "temperature": min(s.temperature, 1.0), "stream": req.stream}
    if system:
        body["system"] = "\n\n".join(system)
    if s.top_p is not None:
        body["top_p"] = s.top_p
    if s.top_k is not None:
        body["top_k"] = s.top_k
    if s.stop:
        body["stop_sequences"] = list(s.stop)
    if chat.tools:
        body["tools"] = [{"name": t["function"]["name"], "description": t["function"].get("description") or "",
                          "input_schema": t["function"].get("parameters") or {"type": "object"}}
                         for t in chat.tools]
        tc = chat.tool_choice
        if tc == "required":
            body["tool_choice"] = {"type": "any"}
        elif isinstance(tc, dict):
            body["tool_choice"] = {"type": "tool", "name": tc["function"]["name"]}
    if req.user:
        body["metadata"] = {"user_id": req.user}
    return body


# -- answers --------------------------------------------------------------------------------

def _obj(data: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise UpstreamBroken(f"not JSON in the upstream's stream: {data[:80]!r}") from None
    if not isinstance(doc, dict):
        raise UpstreamBroken("a stream event that is not an object")
    return doc


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def stream_error(doc: dict[str, Any]) -> ApiError:
    """An error event inside an upstream's stream, as the engine's ApiError (kind kept)."""
    err = doc.get("error")
    msg = err.get("message") if isinstance(err, dict) else None
    kind = err.get("type") if isinstance(err, dict) else None
    status = 529 if kind == "overloaded_error" else 502
    return ApiError(status, "overloaded_error" if status == 529 else "api_error",
                    f"the upstream failed mid-answer: {msg if isinstance(msg, str) else 'error event'}")


class OpenAIReader:
    """chat.completion.chunk events -> events. Tool-call fragments are gathered per
    `index` and each call is released whole, in index order, once the next one starts or
    the answer finishes; the lowest open index streams its arguments meanwhile."""

    def __init__(self) -> None:
        self._calls: dict[int, list[Any]] = {}     # index -> [id, name, argument pieces]
        self._open: int | None = None              # the call whose arguments stream
        self._held: list[str] = []                 # text sent while a call streams
        self._released = 0
        self._reason: StopReason | None = None
        self._usage: dict[str, Any] | None = None
        self.done = False

    def _release(self, below: int) -> Iterator[ToolCall | TextDelta]:
        for i in sorted(k for k in self._calls if k < below):
            cid, name, parts = self._calls.pop(i)
            if not name:
                raise UpstreamBroken(f"tool call {i} without a name")
            yield ToolCall(name, "".join(parts) or "{}", cid)
            if self._open == i:
                self._open = None
                if self._held:
                    yield TextDelta("".join(self._held))
                    self._held.clear()

    def _stream(self, i: int, piece: str) -> Iterator[ToolCallStart | ToolArgsDelta]:
        """Call i's arguments as they come: the open call's next piece, or its start (with
        what came before it) once it is the lowest index left and its name is known."""
        if self._open == i:
            if piece:
                yield ToolArgsDelta(piece)
            return
        cid, name, parts = self._calls[i]
        if self._open is None and name and i == min(self._calls):
            self._open = i
            yield ToolCallStart(name, cid)
            if text := "".join(parts):
                yield ToolArgsDelta(text)

    def feed(self, data: bytes) -> Iterator[Event]:
        if data.strip() == b"[DONE]":
            yield from self._end()
            return
        doc = _obj(data)
        if "error" in doc:
            raise_error(doc)
        if isinstance(doc.get("usage"), dict):
            self._usage = doc["usage"]
        for ch in doc.get("choices") or ():
            if not isinstance(ch, dict) or ch.get("index", 0) != 0:
                continue
            delta = ch.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                if self._open is None:
                    yield TextDelta(text)
                else:
                    self._held.append(text)
            for tc in delta.get("tool_calls") or ():
                i = tc.get("index", 0)
                if not isinstance(i, int):
                    raise UpstreamBroken("a tool call without an index")
                if self._open is not None and i < self._open:
                    raise UpstreamBroken(f"tool call {i} after call {self._open} began")
                if i not in self._calls:
                    yield from self._release(i)
                    self._calls[i] = [None, "", []]
                slot = self._calls[i]
                fn = tc.get("function") or {}
                if tc.get("id"):
                    slot[0] = tc["id"]
                if fn.get("name"):
                    slot[1] += fn["name"]
                args = fn.get("arguments")
                piece = args if isinstance(args, str) else ""
                if piece:
                    slot[2].append(piece)
                yield from self._stream(i, piece)
            reason = ch.get("finish_reason")
            if isinstance(reason, str):
                self._reason = FINISH_TO_STOP.get(reason, "end_turn")

    def whole(self, data: bytes) -> Iterator[Event]:
        """A non-streamed chat.completion."""
        doc = _obj(data)
        choices = doc.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise UpstreamBroken("a chat.completion without choices")
        msg = choices[0].get("message") or {}
        if isinstance(msg.get("content"), str) and msg["content"]:
            yield TextDelta(msg["content"])
        for i, tc in enumerate(msg.get("tool_calls") or ()):
            fn = tc.get("function") or {}
            self._calls[i] = [tc.get("id"), fn.get("name") or "", [fn.get("arguments") or ""]]
        self._reason = FINISH_TO_STOP.get(str(choices[0].get("finish_reason")), "end_turn")
        self._usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else None
        yield from self._end()

    def closed(self) -> Iterator[Event]:
        """The body ended cleanly without [DONE] (transformers serve sends none): an
        answer once its finish_reason came."""
        if not self.done:
            yield from self._end()

    def _end(self) -> Iterator[Event]:
        if self._reason is None:
            raise UpstreamBroken("the stream ended without a finish_reason")
        yield from self._release(1 << 30)
        u = self._usage or {}
        details = u.get("prompt_tokens_details") or {}
        self.done = True
        yield Finish(self._reason, None, _int(u.get("prompt_tokens")), _int(u.get("completion_tokens")),
                     _int(details.get("cached_tokens") if isinstance(details, dict) else None) or 0)


class AnthropicReader:
    """Messages stream events -> events: text deltas as they come, each tool_use block
    streamed (its start, its input_json_delta pieces) and released whole at its
    content_block_stop."""

    def __init__(self) -> None:
        self._tools: dict[int, list[Any]] = {}      # block index -> [id, name, json pieces]
        self._held: list[str] = []                  # text sent while a tool_use block is open
        self._input: int | None = None
        self._cached = 0
        self._output: int | None = None
        self._reason: StopReason | None = None
        self._stop_seq: str | None = None
        self.done = False

    def feed(self, data: bytes) -> Iterator[Event]:
        doc = _obj(data)
        t = doc.get("type")
        if t == "content_block_delta":
            d = doc.get("delta") or {}
            if d.get("type") == "text_delta" and d.get("text"):
                if self._tools:
                    self._held.append(d["text"])
                else:
                    yield TextDelta(d["text"])
            elif d.get("type") == "input_json_delta" and doc.get("index") in self._tools:
                piece = d.get("partial_json")
                if isinstance(piece, str) and piece:
                    self._tools[doc["index"]][2].append(piece)
                    yield ToolArgsDelta(piece)
        elif t == "content_block_start":
            b = doc.get("content_block") or {}
            if b.get("type") == "tool_use":
                if self._tools:                      # one block at a time, as the API sends them
                    raise UpstreamBroken("a tool_use block began before the last one ended")
                if not b.get("name") or not isinstance(b["name"], str):
                    raise UpstreamBroken("a tool_use block without a name")
                pre = b.get("input")
                first = orjson.dumps(pre).decode() if pre else ""
                self._tools[doc.get("index", -1)] = [b.get("id"), b["name"], [first] if first else []]
                yield ToolCallStart(b["name"], b.get("id") if isinstance(b.get("id"), str) else None)
                if first:
                    yield ToolArgsDelta(first)
        elif t == "content_block_stop" and doc.get("index") in self._tools:
            cid, name, parts = self._tools.pop(doc["index"])
            yield ToolCall(name, "".join(parts) or "{}", cid)
            if self._held:
                yield TextDelta("".join(self._held))
                self._held.clear()
        elif t == "message_start":
            self._usage((doc.get("message") or {}).get("usage") or {})
        elif t == "message_delta":
            d = doc.get("delta") or {}
            if d.get("stop_reason") in ANTHROPIC_STOPS:
                self._reason = d["stop_reason"]
                self._stop_seq = d.get("stop_sequence") if isinstance(d.get("stop_sequence"), str) else None
            elif isinstance(d.get("stop_reason"), str):
                self._reason = "end_turn"     # pause_turn, refusal: no counterpart; the turn ends
            self._usage(doc.get("usage") or {})
        elif t == "message_stop":
            if self._reason is None:
                raise UpstreamBroken("message_stop without a stop_reason")
            self.done = True
            yield Finish(self._reason, self._stop_seq, self._input, self._output, self._cached)
        elif t == "error":
            raise_error(doc)

    def whole(self, data: bytes) -> Iterator[Event]:
        """A non-streamed message."""
        doc = _obj(data)
        if doc.get("type") != "message" or not isinstance(doc.get("content"), list):
            raise UpstreamBroken("an answer that is not a message")
        for b in doc["content"]:
            if not isinstance(b, dict):
                continue
            if b.get("type") == "text" and b.get("text"):
                yield TextDelta(b["text"])
            elif b.get("type") == "tool_use":
                if not b.get("name"):
                    raise UpstreamBroken("a tool_use block without a name")
                yield ToolCall(b["name"], orjson.dumps(b.get("input") or {}).decode(), b.get("id"))
        reason = doc.get("stop_reason")
        self._reason = reason if reason in ANTHROPIC_STOPS else "end_turn"
        self._stop_seq = doc.get("stop_sequence") if isinstance(doc.get("stop_sequence"), str) else None
        self._usage(doc.get("usage") or {})
        self.done = True
        yield Finish(self._reason, self._stop_seq, self._input, self._output, self._cached)

    def closed(self) -> Iterator[Event]:
        """The body ended before message_stop: broken."""
        if not self.done:
            raise UpstreamBroken("the stream ended before message_stop")
        yield from ()

    def _usage(self, u: dict[str, Any]) -> None:
        if not isinstance(u, dict):
            return
        if (n := _int(u.get("input_tokens"))) is not None:
            read = _int(u.get("cache_read_input_tokens")) or 0
            made = _int(u.get("cache_creation_input_tokens")) or 0
            self._input, self._cached = n + read + made, read
        if (n := _int(u.get("output_tokens"))) is not None:
            self._output = n


def raise_error(doc: dict[str, Any]) -> None:
    raise UpstreamStreamError(stream_error(doc))


class UpstreamStreamError(Exception):
    """An error event the upstream sent inside its stream (after the first byte)."""

    def __init__(self, err: ApiError) -> None:
        super().__init__(str(err))
        self.err = err


def reader_for(api: str) -> OpenAIReader | AnthropicReader:
    return OpenAIReader() if api == "openai" else AnthropicReader()
