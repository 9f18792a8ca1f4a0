"""The JSON schema the grammar is compiled from: objects closed to unlisted properties
unless the schema says otherwise (zccp.model.grammar._closed)."""

from __future__ import annotations

import json

import llguidance

from zccp.model.grammar import _closed, _schema


def test_objects_that_list_properties_are_closed_at_every_depth():
    s = {"type": "object", "properties": {
        "a": {"type": "object", "properties": {"x": {"type": "string"}}},
        "b": {"type": "array", "items": {"type": "object", "properties": {"y": {"type": "integer"}}}},
        "c": {"anyOf": [{"type": "object", "properties": {"z": {"type": "boolean"}}}, {"type": "null"}]}},
        "$defs": {"D": {"type": "object", "properties": {"w": {"type": "string"}}}}}
    out = _closed(s)
    assert out["additionalProperties"] is False
    assert out["properties"]["a"]["additionalProperties"] is False
    assert out["properties"]["b"]["items"]["additionalProperties"] is False
    assert out["properties"]["c"]["anyOf"][0]["additionalProperties"] is False
    assert out["$defs"]["D"]["additionalProperties"] is False
    assert "additionalProperties" not in s          # the request's own schema is not changed


def test_what_the_schema_says_is_kept():
    open_ = {"type": "object", "properties": {"a": {}}, "additionalProperties": True}
    typed = {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "integer"}}
    pattern = {"type": "object", "properties": {"a": {}}, "patternProperties": {"^x": {}}}
    bare = {"type": "object"}                                          # no properties listed: any object
    parts = {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}
    assert _closed(open_) == open_ and _closed(typed) == typed and _closed(pattern) == pattern
    assert _closed(bare) == bare and _closed(parts) == parts
    assert _schema(None) == {"type": "object"}                         # JSON mode stays any object


def test_a_closed_schema_refuses_an_extra_key():
    m = llguidance.LLMatcher(llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes())),
                             llguidance.LLMatcher.grammar_from_json_schema(
                                 _schema(json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}}))))
    assert not m.is_error()
    assert m.validate_tokens(list(b'{"a":1,')) < len(b'{"a":1,')      # no second key


class _Bytes:
    """A byte vocabulary (256 ids + EOS) for llguidance."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b""]

    def __call__(self, s):
        return list(s)
