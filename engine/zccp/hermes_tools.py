"""Tool calls in a model's output: the hermes form, parsed as the text streams.

    <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>

(Qwen2.5, Hermes 2 Pro and many others; vLLM calls this parser "hermes".) The
parser takes the generated text in whatever pieces it arrives and returns, in
order, the plain text to show and each call once it is complete. It holds back
only what could still be the start of a tag; the JSON is read with
json.JSONDecoder.raw_decode, which understands strings, so a literal "</tool_call>"
inside an argument does not end the call (vLLM issue 45167). Anything that is not
a well-formed call (bad JSON, no "name", no closing tag at the end) is given back
as text, never dropped.
"""

from __future__ import annotations

import json
from typing import Final

from zccp.shared_types import TextDelta, ToolCall

START: Final = "<tool_call>"
END: Final = "</tool_call>"
_DECODER: Final = json.JSONDecoder()

Event = TextDelta | ToolCall


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
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


class HermesParser:
    """feed(text) / finish() -> [TextDelta | ToolCall], in output order."""

    def __init__(self) -> None:
        self._buf = ""
        self._in_call = False

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[Event]:
        return self._drain(final=True)

    def _drain(self, final: bool) -> list[Event]:
        out: list[Event] = []
        while True:
            if not self._in_call:
                i = self._buf.find(START)
                if i >= 0:
                    if i:
                        out.append(TextDelta(self._buf[:i]))
                    self._buf = self._buf[i + len(START):]
                    self._in_call = True
                    continue
                hold = 0 if final else _partial_suffix(self._buf, START)
                text = self._buf[: len(self._buf) - hold]
                if text:
                    out.append(TextDelta(text))
                self._buf = self._buf[len(self._buf) - hold:]
                return out
            body = self._buf.lstrip()
            try:
                obj, end = _DECODER.raw_decode(body)
            except json.JSONDecodeError:
                if not final and self._may_still_parse(body):
                    return out                   # the JSON is not complete yet
                return out + self._give_back()
            rest = body[end:].lstrip()
            call = _call(obj)
            if call is not None and (rest.startswith(END) or (final and not rest)):
                out.append(call)
                self._buf = rest[len(END):] if rest.startswith(END) else ""
                self._in_call = False
                continue
            if call is not None and not final and END.startswith(rest):
                return out                       # "</tool_" so far: wait for the rest of the tag
            return out + self._give_back()

    @staticmethod
    def _may_still_parse(body: str) -> bool:
        # raw_decode fails on a JSON value that is merely cut short; a body that does
        # not even start like an object never becomes a call.
        return body == "" or body.startswith("{")

    def _give_back(self) -> list[Event]:
        """Not a call after all: the tag and what followed it are text."""
        text, self._buf, self._in_call = START + self._buf, "", False
        return [TextDelta(text)]
