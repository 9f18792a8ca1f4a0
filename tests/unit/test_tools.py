"""The hermes tool-call parser: the same calls and text whatever way the output is cut."""

from __future__ import annotations

import json
import random

import pytest

from zccp.serving.text_assembly import TextAssembler
from zccp.model.prompt import BYTE_FORMAT
from zccp.shared_types import TextDelta, ToolCall
from zccp.serving.hermes_tools import HermesParser, partial_object
from zccp.shared_types import ToolArgsDelta, ToolCallStart


def parse(text: str, pieces: list[str] | None = None) -> tuple[str, list[tuple[str, dict]]]:
    p = HermesParser()
    events = []
    for piece in pieces if pieces is not None else [text]:
        events += p.feed(piece)
    events += p.finish()
    out = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls = [(e.name, e.arguments if e.truncated else json.loads(e.arguments)) for e in events
             if isinstance(e, ToolCall)]
    return out, calls


def cuts(text: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(text):
        n = rng.randint(1, 7)
        out.append(text[i:i + n])
        i += n
    return out


CASES = [
    ("plain text, no calls", "Hello <b>there</b> a < b and <tool_ is not a tag",
     "Hello <b>there</b> a < b and <tool_ is not a tag", []),
    ("text then a call",
     'Let me look. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris \U0001f600"}}\n</tool_call>',
     "Let me look. ", [("get_weather", {"city": "Paris \U0001f600"})]),
    ("a closing tag inside a string", '<tool_call>{"name": "w", "arguments": {"s": "</tool_call> x"}}</tool_call>'
     '<tool_call>{"name": "t", "arguments": {}}</tool_call> after', " after",
     [("w", {"s": "</tool_call> x"}), ("t", {})]),
    ("arguments as a JSON string", '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', "",
     [("f", {"a": 1})]),
    ("no name is text", '<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),
    ("bad JSON is text", "<tool_call>{not json}</tool_call> ok", "<tool_call>{not json}</tool_call> ok", []),
    # cut off (max_tokens): before the name nothing a client could run, so no markup either;
    # inside the arguments a truncated call, its arguments as generated
    ("cut off before the arguments is dropped", 'Hi <tool_call>{"name": "f", "argu', "Hi ", []),
    ("cut off inside the arguments is a truncated call", '<tool_call>{"name": "f", "arguments": {"x": "ab',
     "", [("f", '{"x": "ab')]),
    ("closed by the end of output", '<tool_call>{"name": "f", "arguments": {"x": [1, 2]}}', "", [("f", {"x": [1, 2]})]),
    ("held-back partial tag released", "ends with <tool_c", "ends with <tool_c", []),
]


@pytest.mark.parametrize("name,text,want_text,want_calls", CASES, ids=[c[0] for c in CASES])
def test_same_result_however_the_text_is_cut(name, text, want_text, want_calls):
    assert parse(text) == (want_text, want_calls)
    assert parse(text, list(text)) == (want_text, want_calls)
    for seed in range(5):
        assert parse(text, cuts(text, seed)) == (want_text, want_calls)


def test_nothing_that_could_start_a_tag_is_released_early():
    p = HermesParser()
    assert p.feed("abc <tool") == [TextDelta("abc ")]
    assert p.feed("_call>") == []
    assert p.feed('{"name": "f", "arguments": {}}') == []
    assert p.feed("</tool_call>") == [ToolCall("f", "{}")]


def test_assembler_applies_stop_sequences_before_parsing():
    ids = list('hi <tool_call>{"name": "f", "arguments": {}}</tool_call> END more'.encode())
    asm = TextAssembler(BYTE_FORMAT.detokenizer(()), ("END",), HermesParser())
    events = []
    for t in ids:
        events += asm.feed(t)
        if asm.stop_sequence:
            break
    events += asm.finish()
    # the space after the call is whitespace alone after a call: no text of its own
    assert asm.text == "hi " and asm.tool_calls == [ToolCall("f", "{}")]
    assert asm.stop_reason("end_turn") == "tool_use" and asm.stop_sequence == "END"
    assert asm.stop_reason("max_tokens") == "tool_use"  # the stop sequence ended it, not max_tokens


def test_streamed_arguments_arrive_as_generated_and_concatenate_to_the_call():
    text = 'a <tool_call>\n{"name": "w", "arguments": {"s": "</tool_call> {x}", "n": [1, {"m": 2}]}}\n</tool_call> b'
    p = HermesParser(stream=True)
    events = []
    for ch in text:
        events += p.feed(ch)
    events += p.finish()
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    pieces = [e.text for e in events if isinstance(e, ToolArgsDelta)]
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert starts == [ToolCallStart("w")] and len(pieces) > 1
    assert calls == [ToolCall("w", "".join(pieces))]
    assert json.loads(calls[0].arguments) == {"s": "</tool_call> {x}", "n": [1, {"m": 2}]}
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "a  b"
    # the start event comes before its arguments, the call after them
    kinds = [type(e) for e in events if not isinstance(e, TextDelta)]
    assert kinds[0] is ToolCallStart and kinds[-1] is ToolCall


@pytest.mark.parametrize("cut,want", [
    ('{"city": "Tok', {"city": "Tok"}), ('{"city": "Tokyo", ', {"city": "Tokyo"}), ('{"ci', {}), ("{", {}),
    ('{"a": [1, 2', {"a": [1, 2]}), ('{"a": {"b": "x\\', {"a": {"b": "x"}}), ("", {}), ('{"a": 1}', {"a": 1}),
])
def test_a_truncated_object_closes_into_its_longest_valid_prefix(cut, want):
    assert json.loads(partial_object(cut)) == want


def test_a_forced_call_counts_its_arguments_against_max_tokens():
    """The wrapper is free; the token after the budget's last is not shown; the answer is
    a truncated call whatever the budget."""
    ids = list('<tool_call>\n{"name":"f","arguments":{"x":"abcdef"}}\n</tool_call>'.encode())
    whole = len('{"x":"abcdef"}')
    for budget in range(1, whole + 2):
        asm = TextAssembler(BYTE_FORMAT.detokenizer(()), (), HermesParser(), budget)
        for t in ids:
            asm.feed(t)
            if asm.done:
                break
        asm.finish()
        [call] = asm.tool_calls
        assert call.name == "f" and asm.text == ""
        if budget < whole:
            assert call.truncated and call.arguments == '{"x":"abcdef"}'[:budget] and asm.billed == budget
            assert asm.stop_reason("stop_sequence") == "max_tokens"
        else:
            assert not call.truncated and json.loads(call.arguments) == {"x": "abcdef"} and asm.billed == whole
            assert asm.stop_reason("end_turn") == "tool_use"


def test_whitespace_after_a_call_is_shown_only_before_more_text():
    p = HermesParser(stream=True)
    out = []
    for piece in ('A <tool_call>{"name": "f", "arguments": {}}</tool_call>', "\n", "<tool_call>",
                  '{"name": "g", "arguments": {}}</tool_call>', " \n", "then", " more", "\n"):
        out += p.feed(piece)
    out += p.finish()
    texts = [e.text for e in out if isinstance(e, TextDelta)]
    assert texts == ["A ", " \nthen", " more"]
    assert [e.name for e in out if isinstance(e, ToolCall)] == ["f", "g"]
