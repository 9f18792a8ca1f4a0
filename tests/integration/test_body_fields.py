"""zccp.plugins.limits.body_fields, run by real nginx (the test-only location of
tests/support/nginx/body_fields_test.conf): the output reservation's one-pass reading of a
body gives what cjson's decode of it gives, member for member, or leaves the body to the
decode; never another value (a body that under-reserves slips past an output-token limit)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.fp_nginx import records, snippet_nginx

SNIPPET = Path(__file__).resolve().parents[1] / "support" / "nginx" / "body_fields_test.conf"
WANTED = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n", "prompt")


@pytest.fixture(scope="module")
def ngx(tmp_path_factory):
    srv = snippet_nginx(tmp_path_factory.mktemp("body_fields"), SNIPPET)
    yield srv
    srv.stop()


def fields(ngx, bodies: list[bytes]) -> list[tuple[str, str]]:
    out = ngx.post("/_limits/fields", records(bodies, lambda b: ("b", b))).decode().split("\n")
    assert out[-1] == "" and len(out) - 1 == len(bodies)
    return [tuple(line.split(" | ")) for line in out[:-1]]  # type: ignore[misc]


def check(ngx, bodies: list[bytes], malformed: bool = False) -> list[str]:
    """Every body: read in one pass, the same as the decode, or left to it. malformed: bodies
    that are not all JSON; one cjson cannot decode may be read all the same (the engine's
    parser refuses it: nothing is generated, the reservation comes back). Returns the
    reader's answers."""
    got = fields(ngx, bodies)
    for body, (read, decoded) in zip(bodies, got, strict=True):
        assert read == "NIL" or read == decoded or (malformed and decoded == "NIL"), (body[:300], read, decoded)
    return [r for r, _ in got]


ORDINARY = [
    {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
    {"model": "m", "messages": [{"role": "user", "content": "say \"max_tokens\": 1 \\ ok"}], "max_tokens": 4096},
    {"model": "m", "max_completion_tokens": 500, "max_tokens": 1, "n": 3, "messages": []},
    {"model": "m", "max_output_tokens": 77, "input": "x"},
    {"model": "m", "prompt": ["a", "b", "c"], "n": 2, "max_tokens": 9},
    {"model": "m", "prompt": [[1, 2], [3]], "max_tokens": 9},
    {"model": "m", "prompt": [1, 2, 3], "max_tokens": 9},
    {"model": "m", "prompt": [], "max_tokens": 9},
    {"model": "m", "prompt": [None, None], "max_tokens": 9},
    {"model": "m", "prompt": {"a": 1, "b": 2}, "max_tokens": 9},
    {"model": "m", "max_tokens": None, "n": None},
    {"model": "m", "max_tokens": True, "n": False},
    {"model": "m", "max_tokens": "16", "n": "2"},
    {"model": "m", "max_tokens": 1.5e3, "n": -1, "temperature": 0.7},
    {"model": "m", "max_tokens": {"nested": 1}, "n": [3]},
    # a tool schema and metadata that name the members one level down: not the request's
    {"model": "m", "tools": [{"name": "t", "input_schema": {"type": "object", "properties": {
        "max_tokens": {"type": "integer"}, "n": 1}}}], "metadata": {"max_tokens": 1, "prompt": ["a", "b"]},
     "messages": [{"role": "user", "content": [{"type": "text", "text": "max_tokens"}]}]},
    {"model": "m", "metadata": {"max_tokens": 1}},
    {},
]


def test_ordinary_bodies_are_read_in_one_pass_as_the_decode_reads_them(ngx):
    bodies = []
    for doc in ORDINARY:
        bodies.append(json.dumps(doc).encode())
        bodies.append(json.dumps(doc, indent=2).encode())               # whitespace everywhere
        bodies.append(json.dumps(doc, separators=(",", ":")).encode())  # none
        bodies.append(json.dumps(doc, ensure_ascii=False).encode() + b"\n")
    answers = check(ngx, bodies)
    assert "NIL" not in answers, [b[:120] for b, a in zip(bodies, answers, strict=True) if a == "NIL"]


def test_hostile_bodies_get_the_decodes_value_or_are_left_to_it(ngx):
    top = b'{"max_tokens": 4096, "messages": []}'
    bodies = [
        b'{"max\\u005ftokens": 1, "max_tokens": 4096}',          # cjson reads the escaped name: left to it
        b'{"max_tokens": 4096, "max\\u005ftokens": 1}',
        b'{"max_tokens": 1, "max_tokens": 4096}',                # the last one, as cjson's table
        b'{"max_tokens": 4096, "max_tokens": 1}',
        b'{"metadata": {"max_tokens": 1}, "max_tokens": 4096}',
        b'{"s": "\\"max_tokens\\": 1, ", "max_tokens": 4096}',   # the name inside a string
        b'{"s": "\\\\", "max_tokens": 4096}',                     # an escaped backslash before the quote
        b'{"max_tokens": "\\u0031\\u0036"}',                      # an escaped number string: left to the decode
        b'{"max_tokens": NaN}', b'{"max_tokens": Infinity}', b'{"max_tokens": 0x10}', b'{"max_tokens": +5}',
        b'{"max_tokens": 1e400}', b'{"max_tokens": -0}', b'{"n": 1e308, "max_tokens": 2}',
        b'{"prompt": [NaN, "a"], "max_tokens": 2}', b'{"prompt": [-1, "a"]}', b'{"prompt": [ "a" , "b" ]}',
        top + b" trailing", top + b"}", top[:-1], b"[1, 2]", b'"max_tokens"', b"", b"   ", b"{",
        b'{"max_tokens" 5}', b'{"max_tokens": }', b'{max_tokens: 5}', b'{"a": [1, 2}, "max_tokens": 5}',
        b'{"deep": ' + b"[" * 1010 + b"]" * 1010 + b', "max_tokens": 2000}',   # past cjson's depth: refused there
        b'{"deep": ' + b"[" * 400 + b"]" * 400 + b', "max_tokens": 2000}',
        b'\xef\xbb\xbf' + top, b"\t\r\n " + top + b"\r\n",
        # raw NUL bytes (a string with escapes is walked by libc's strcspn, which stops at a NUL):
        # inside a string value, a member name, between members, and ending the body
        b'{"s": "a\x00\\"max_tokens\\": 1", "max_tokens": 4096}', b'{"s\x00": 1, "max_tokens": 4096}',
        b'{"s": "x\x00", "max_tokens": 4096}', b'{"max_tokens": 4096,\x00 "n": 2}', top + b"\x00",
        b'{"s": "\x00\x00\\\x00', b'{"s": "' + b"\x00" * 300 + b'", "max_tokens": 7}',
    ]
    answers = check(ngx, bodies, malformed=True)
    assert answers[0] == "NIL" and answers[1] == "NIL"
    assert answers[2].startswith("OK 4096 ") and answers[3].startswith("OK 1 ")
    assert answers[4].startswith("OK 4096 ") and answers[5].startswith("OK 4096 ") and answers[6].startswith("OK 4096 ")
    nul = answers[-7:]
    assert nul[0].startswith("OK 4096 ") and nul[1].startswith("OK 4096 ") and nul[2].startswith("OK 4096 ")
    assert nul[5] == "NIL" and nul[6].startswith("OK 7 ")   # a body ending inside its string; 300 NULs passed over


# JSON documents whose top level names the wanted members among others, at any depth, with
# every kind of value, then written with random whitespace and repeated members.
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                    st.floats(allow_nan=False, allow_infinity=False, width=32),
                    st.text(alphabet=st.sampled_from('ab0123456789.e-"\\ \n\u00e9{}[],:'), max_size=8))
names = st.one_of(st.sampled_from(WANTED), st.text(alphabet="abmnx_tokens\"\\", max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.lists(st.tuples(names, inner), max_size=4)), max_leaves=12)


def write(v, rnd: random.Random) -> str:
    ws = lambda: rnd.choice(["", "", " ", "\n  ", "\t"])  # noqa: E731
    if isinstance(v, list) and v and all(isinstance(x, tuple) for x in v):
        return "{" + ",".join(f"{ws()}{json.dumps(k)}{ws()}:{ws()}{write(x, rnd)}{ws()}" for k, x in v) + "}"
    if isinstance(v, list):
        return "[" + ",".join(ws() + write(x, rnd) + ws() for x in v) + "]"
    return json.dumps(v, ensure_ascii=rnd.random() < 0.5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(names, values), max_size=8), min_size=20, max_size=20), st.integers(0, 2**32))
def test_any_document_is_read_as_the_decode_reads_it_or_left_to_it(ngx, docs, seed):
    rnd = random.Random(seed)
    bodies = [write(members, rnd).encode() if members else b"{}" for members in docs]
    check(ngx, bodies)
