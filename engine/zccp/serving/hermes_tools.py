"""Tool calls in a model's output: the hermes form, parsed as the text streams.

    <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>

(Qwen2.5, Hermes 2 Pro and many others; vLLM calls this parser "hermes"; a forced call's
grammar writes it compactly, zccp.model.grammar.) The parser takes the generated text in
whatever pieces it arrives and returns, in order, the plain text to show and the calls.

A call whose head is `{"name": <string>, "arguments": {` (or "parameters") is streamed:
ToolCallStart once the name is known, ToolArgsDelta pieces of the arguments object as
they are generated (a small JSON scanner that understands strings finds where the object
ends, so a literal "</tool_call>" inside an argument does not end the call, vLLM issue
45167), then the ToolCall whole. Once started, a call is a call: cut short at the end of
the output it is a ToolCall with truncated=True and the arguments as generated (what the
real APIs answer at max_tokens); text between the arguments and the closing tag is dropped.

A call in any other shape (arguments as a JSON string, keys in another order) is read
whole with json.JSONDecoder.raw_decode once complete. What is not a call at all (bad
JSON, no "name") is given back as text, never dropped; a call cut off before its name
(nothing a client could run) is dropped, so no `<tool_call>` markup leaks as text.
"""

from __future__ import annotations

import json
import re
from typing import Final

import orjson

from zccp.shared_types import OutputConstraint, TextDelta, ToolArgsDelta, ToolCall, ToolCallStart

START: Final = "<tool_call>"
END: Final = "</tool_call>"
_DECODER: Final = json.JSONDecoder()
# the head of a call whose arguments can stream: up to the arguments object's "{"
_HEAD: Final = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*\{')
_HEAD_MAX: Final = 4096           # a head not matched within this many characters is read whole

Event = TextDelta | ToolCall | ToolCallStart | ToolArgsDelta

_TEXT, _HEAD_STATE, _ARGS, _TAIL = range(4)


def is_forced_call(c: OutputConstraint | None) -> bool:
    return c is not None and c.kind == "tool_call"


def wrapper_tokens(c: OutputConstraint) -> int:
    """At most how many tokens a forced call's fixed wrapper takes (the grammar's compact
    `<tool_call>\\n{"name":"…","arguments":` and `}\\n</tool_call>`, as bytes: no token is
    shorter than a byte; the name escaped or not), plus the EOS: what the scheduler allows past max_tokens, which
    counts the arguments only (docs/tools.md)."""
    longest = max((len(json.dumps(name).encode()) + len(name.encode()) for name, _ in c.tools), default=0)
    return len(START) + len('\n{"name":,"arguments":') + longest + len('}\n') + len(END) + 1


def _partial_suffix(buf: str, tag: str) -> int:
    """Length of the longest suffix of buf that is a proper prefix of tag."""
    for k in range(min(len(tag) - 1, len(buf)), 0, -1):
        if buf.endswith(tag[:k]):
            return k
    return 0


def _call(obj: object) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):           # some models send the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))   # json: integers exact



def _object_text(raw: str) -> str:
    """Complete arguments as sent: the generated text when it is strict JSON (orjson: no
    NaN), else a strict re-serialisation of what the scanner found."""
    try:
        if isinstance(orjson.loads(raw), dict):
            return raw
    except orjson.JSONDecodeError:
        pass
    return partial_object(raw)


def partial_object(text: str) -> str:
    """The longest prefix of a cut-off JSON object that closes into a valid object, closed
    (`{"city": "Tok` -> `{"city": "Tok"}`); "{}" when none does. What Anthropic's non-streamed
    tool_use `input` (an object, never a string) carries for a truncated call. The prefix's
    own text, never a re-serialisation: orjson reads an integer past 64 bits as a float, and
    JSON numbers keep their digits."""
    closers: list[str] = []       # closers[i]: what closes text[:i] (a string's quote first)
    stack: list[str] = []
    in_str = esc = False
    for ch in text:
        closers.append(('"' if in_str else "") + "".join(reversed(stack)))
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]" and stack:
            stack.pop()
    closers.append(('"' if in_str else "") + "".join(reversed(stack)))
    for i in range(len(text), 0, -1):
        candidate = text[:i].rstrip().rstrip(",") + closers[i] if not closers[i].startswith('"') \
            else text[:i] + closers[i]
        try:
            obj = orjson.loads(candidate)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return candidate
    return "{}"


class HermesParser:
    """feed(text) / finish() -> events, in output order. stream: also ToolCallStart and
    ToolArgsDelta as a call is generated (a streamed answer); without it only TextDelta and
    whole ToolCall values come back."""

    def __init__(self, stream: bool = False) -> None:
        self._stream = stream
        self._buf = ""
        self._state = _TEXT
        self._name = ""
        self._args: list[str] = []           # the open call's arguments so far
        self._depth = 0                      # the scanner: nesting, inside a string, after a backslash
        self._in_str = False
        self._esc = False
        self.args_chars = 0                  # argument characters generated so far, every call
        self._called = False                 # a call has ended: whitespace alone is no text now
        self._blank = ""                     # whitespace after a call, shown only if text follows

    @property
    def in_args(self) -> bool:
        """Inside a call's arguments object (what a forced call's budget counts)."""
        return self._state == _ARGS

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[Event]:
        return self._drain(final=True)

    def _drain(self, final: bool) -> list[Event]:
        out: list[Event] = []
        while True:
            state = self._state
            if state == _TEXT:
                i = self._buf.find(START)
                if i >= 0:
                    self._text(out, self._buf[:i])
                    self._blank = ""             # whitespace between two calls: no block of its own
                    self._buf = self._buf[i + len(START):]
                    self._state = _HEAD_STATE
                    continue
                hold = 0 if final else _partial_suffix(self._buf, START)
                self._text(out, self._buf[: len(self._buf) - hold])
                self._buf = self._buf[len(self._buf) - hold:]
                return out
            if state == _HEAD_STATE:
                if not self._head(out, final):
                    return out
            elif state == _ARGS:
                self._scan(out)
                if self._state == _ARGS:
                    if final:
                        self._end_call(out, truncated=True)
                    return out
            else:
                i = self._buf.find(END)
                if i < 0 and not final:
                    return out                   # what is left of `}\n</tool_call>`
                self._buf = self._buf[i + len(END):] if i >= 0 else ""
                self._end_call(out, truncated=False)

    def _text(self, out: list[Event], text: str) -> None:
        """Text to show. After a call, whitespace alone is held back: a streamed answer would
        show it as a block of its own (between two tool_use blocks, or after the last) that the
        whole answer has not, and that the real APIs refuse as input."""
        if self._called:
            if not text or text.isspace():
                self._blank += text
                return
            text, self._blank = self._blank + text, ""
        if text:
            out.append(TextDelta(text))

    def _head(self, out: list[Event], final: bool) -> bool:
        """The call's head; True when the state moved on (drain again)."""
        m = _HEAD.match(self._buf) if len(self._buf) <= _HEAD_MAX or final else None
        if m is not None:
            try:
                name = json.loads(m.group(1))
            except json.JSONDecodeError:
                name = ""
            if name:
                self._name, self._args = name, ["{"]
                self._depth, self._in_str, self._esc = 1, False, False
                self.args_chars += 1
                self._buf = self._buf[m.end():]
                self._state = _ARGS
                if self._stream:
                    out += [ToolCallStart(name), ToolArgsDelta("{")]
                return True
        return self._whole(out, final)

    def _whole(self, out: list[Event], final: bool) -> bool:
        """A call in another shape, read once complete (the pre-streaming reading)."""
        body = self._buf.lstrip()
        try:
            obj, end = _DECODER.raw_decode(body)
        except json.JSONDecodeError:
            if not final and (body == "" or body.startswith("{")):
                return False                     # the JSON is not complete yet
            if final and (body == "" or body.startswith("{")) and self._cut_short(body):
                self._buf, self._state = "", _TEXT   # cut off before its name: nothing to show
                return True
            out += self._give_back()
            return True
        rest = body[end:].lstrip()
        call = _call(obj)
        if call is not None and (rest.startswith(END) or (final and not rest)):
            out.append(call)
            self._called = True
            self._buf = rest[len(END):] if rest.startswith(END) else ""
            self._state = _TEXT
            return True
        if call is not None and not final and END.startswith(rest):
            return False                         # "</tool_" so far: wait for the rest of the tag
        out += self._give_back()
        return True

    @staticmethod
    def _cut_short(body: str) -> bool:
        """The body is the start of some JSON value (cut off), not malformed JSON."""
        if not body:
            return True
        for close in ('"}', "}", '"]}', "]}", '":0}', ":0}", "0}"):
            try:
                _DECODER.raw_decode(body + close)
                return True
            except json.JSONDecodeError:
                continue
        return False

    def _scan(self, out: list[Event]) -> None:
        """Consume argument characters up to the end of the arguments object."""
        buf, depth, in_str, esc = self._buf, self._depth, self._in_str, self._esc
        i = 0
        while i < len(buf) and depth:
            ch = buf[i]
            if in_str:
                if esc:
                    esc = False
                elif ch == "\\":
                    esc = True
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
            i += 1
        self._depth, self._in_str, self._esc = depth, in_str, esc
        if i:
            piece, self._buf = buf[:i], buf[i:]
            self._args.append(piece)
            self.args_chars += i
            if self._stream:
                out.append(ToolArgsDelta(piece))
        if not depth:
            self._state = _TAIL

    def _end_call(self, out: list[Event], truncated: bool) -> None:
        raw = "".join(self._args)
        out.append(ToolCall(self._name, raw if truncated else _object_text(raw), truncated=truncated))
        self._args, self._name, self._state, self._called = [], "", _TEXT, True

    def _give_back(self) -> list[Event]:
        """Not a call after all: the tag and what followed it are text."""
        text, self._buf, self._state = START + self._buf, "", _TEXT
        out: list[Event] = []
        self._text(out, text)
        return out
