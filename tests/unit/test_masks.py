"""zccp.cache.mask_store and mask_apply: the Lua data reader, PCRE (ngx.re) semantics, the default patterns,
ordering, and the broken-pattern / last-good fallback. Python only; the Lua side is
compared with this in tests/integration/test_fingerprint_identity.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from zccp.cache.mask_apply import MaskError, MaskSet
from zccp.cache.mask_store import default_patterns_path, load_masks
from zccp.config.lua_data import LuaDataError, parse_lua_data

REPO = Path(__file__).resolve().parents[2]
PATTERNS = REPO / "lua" / "zccp" / "mask_patterns.lua"


@pytest.fixture(scope="module")
def defaults() -> MaskSet:
    ms = load_masks(PATTERNS, REPO / "build" / "no-such-last-good.lua")
    assert not ms.errors, ms.errors
    return ms


# --------------------------------------------------------------------------- the reader

def test_reader_literals():
    src = rb"""-- comment
    --[==[ long
    comment ]==]
    return {
        a = 1, b = -2.5, c = 0x1F, d = true, e = false, f = nil;
        s1 = "q\"\\\n\t\65\x41\z
              end", s2 = 'single', s3 = [[
raw \d [x] ]], s4 = [=[a]]b]=],
        [ "key" ] = { 1, 2, { x = "y" } },
        "positional",
    }"""
    v = parse_lua_data(src)
    assert v["a"] == 1 and v["b"] == -2.5 and v["c"] == 31 and v["d"] is True and v["e"] is False
    assert v["f"] is None
    assert v["s1"] == b'q"\\\n\tAAend'
    assert v["s2"] == b"single" and v["s3"] == rb"raw \d [x] " and v["s4"] == b"a]]b"
    assert v[b"key"] == [1, 2, {"x": b"y"}]
    assert v[1] == b"positional"


def test_reader_lua_q_format_roundtrip():
    # what zccp.fp.mask_store writes with string.format("%q") for the last-good file
    assert parse_lua_data(b'return { "a\\\nb\\0c\\13\\"" }') == [b'a\nb\x00c\r"']


@pytest.mark.parametrize("src", [b"return { a = b }", b"return { 1 .. 2 }", b'return { "x" } junk',
                                 b'return { "unfinished }', b"return { [[x }", b'return { "\\q" }'])
def test_reader_rejects_code(src):
    with pytest.raises(LuaDataError):
        parse_lua_data(src)


def test_default_path():
    assert default_patterns_path() == PATTERNS


# --------------------------------------------------------------------------- PCRE semantics

def gsub(pattern: bytes, repl: bytes, text: bytes) -> bytes:
    return MaskSet.from_patterns([("t", pattern, repl)]).apply(text)


@pytest.mark.parametrize("pattern,repl,text,want", [
    # values observed from ngx.re.gsub(text, pattern, repl, "jo") in nginx 1.22 / lua 0.10.23
    (rb"(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)(k)(l)", b"$12|${12}|$0|$$|x", b"abcdefghijklm", b"l|l|abcdefghijkl|$|xm"),
    (rb"(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)(k)(l)", b"${0}${1}$3$9", b"abcdefghijklm", b"abcdefghijklacim"),
    (rb"(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)(k)(l)", b"$1a", b"abcdefghijklm", b"aam"),
    (rb"(b)(x)?", b"$99", b"abc", b"ac"),
    (rb"(b)(x)?", b"$$1", b"abc", b"a$1c"),
    (rb"(b)(x)?", b"${1}2", b"abc", b"ab2c"),
    (rb"(b)(x)?", b"$01", b"abc", b"abc"),
    (b"", b"-", b"abc", b"-a-b-c-"),
    (rb"x*", b"-", b"abc", b"-a-b-c-"),
    (rb"a|", b"-", b"aaa", b"----"),
    (rb"\d", b"#", "é1٣".encode(), "é#٣".encode()),        # \d is ASCII only (byte mode)
    (rb"\w+", b"W", "naïve".encode(), b"W\xc3\xafW"),      # \w too: the UTF-8 bytes are not word chars
])
def test_ngx_re_semantics(pattern, repl, text, want):
    assert gsub(pattern, repl, text) == want


@pytest.mark.parametrize("repl", [b"$a", b"${1", b"$", b"${x}", b"$1$", b"${}"])
def test_bad_templates(repl):
    with pytest.raises(MaskError, match="replacement template"):
        MaskSet.from_patterns([("t", b"b", repl)])


def test_bad_pattern_strict_and_lenient():
    with pytest.raises(MaskError, match="mask bad"):
        MaskSet.from_patterns([("bad", b"(x", b"")])
    ms = MaskSet.from_patterns([("ok", b"x", b"y"), ("bad", b"(x", b""), ("ok2", b"y", b"z")], strict=False)
    assert ms.names == ("ok", "ok2") and ms.errors[0][0] == "bad"
    assert ms.apply(b"x") == b"z"


def test_apply_returns_same_object_when_unchanged(defaults):
    t = b"nothing to mask here"
    assert defaults.apply(t) is t
    assert defaults.apply_changed(t) == (t, False)
    # a replacement equal to the match is not a change
    same = MaskSet.from_patterns([("same", b"abc", b"$0")])
    out, changed = same.apply_changed(b"xabcx")
    assert out == b"xabcx" and not changed


# --------------------------------------------------------------------------- the defaults

@pytest.mark.parametrize("text,want", [
    (b"id 123e4567-e89b-12d3-a456-426614174000.", b"id <uuid>."),
    (b"ID 123E4567-E89B-12D3-A456-426614174000", b"ID <uuid>"),
    (b"at 2024-05-01T12:30:00Z ok", b"at <timestamp> ok"),
    (b"at 2024-05-01 12:30 ok", b"at <timestamp> ok"),
    (b"at 2024-05-01T12:30:00.123+02:00.", b"at <timestamp>."),
    (b"at 2024-05-01T12:30:00,5-0500", b"at <timestamp>"),
    (b"mail dr.who@example.org, or a_b+c@mail.co.uk!", b"mail <email>, or <email>!"),
    (b"ms 1714566600123 s 1714566600", b"ms <epoch_ms> s <epoch>"),
    (b"patient_id: P123456789", b"patient_id: <id>"),
    (b"order 12345678 ref AB1234567", b"order <id> ref <id>"),
])
def test_each_default_pattern(defaults, text, want):
    out, changed = defaults.apply_changed(text)
    assert out == want and changed


@pytest.mark.parametrize("text", [
    b"date only 2024-05-01", b"short 123456", b"version 1.2.3", b"not@an-email", b"x1714566600y",
    b"123e4567-e89b-12d3-a456-4266141740zz", "東京 ＠ｅｘａｍｐｌｅ．ｃｏｍ".encode(),
])
def test_defaults_leave_near_misses(defaults, text):
    assert defaults.apply(text) == text


def test_default_names_and_order(defaults):
    assert defaults.names == ("uuid", "iso8601", "email", "epoch_millis", "epoch_seconds", "long_id")


def test_ordering_matters():
    a = ("num", rb"\d+", b"<n>")
    b = ("tag", rb"<n>", b"NUM")
    assert MaskSet.from_patterns([a, b]).apply(b"x 42") == b"x NUM"
    assert MaskSet.from_patterns([b, a]).apply(b"x 42") == b"x <n>"
    # in the defaults, uuid runs before long_id: a UUID is one <uuid>, not pieces
    d = load_masks(PATTERNS, REPO / "build" / "no-such-last-good.lua")
    assert d.apply(b"00000000-1234-5678-9999-123456789012") == b"<uuid>"


# --------------------------------------------------------------------------- files, errors, fallback

def write(path: Path, entries) -> None:
    lines = ["return {"]
    for name, pat, repl in entries:
        lines.append(f"    {{ name = [=[{name}]=], pattern = [=[{pat}]=], replacement = [=[{repl}]=] }},")
    lines.append("}")
    path.write_text("\n".join(lines) + "\n")


def write_last_good(path: Path, entries) -> None:
    # the format zccp.fp.mask_store writes: string.format("%q")-style strings
    def q(s: str) -> str:
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
    path.write_text("return {\n" + "".join(
        f"    {{ name = {q(n)}, pattern = {q(p)}, replacement = {q(r)} }},\n" for n, p, r in entries) + "}\n")


def test_broken_pattern_reported_by_name_others_work(tmp_path):
    p = tmp_path / "m.lua"
    write(p, [("digits", r"\d+", "#"), ("broken", r"(unclosed", "x"), ("word", r"secret", "***")])
    ms = load_masks(p, tmp_path / "lg.lua")
    assert [n for n, _ in ms.errors] == ["broken"]
    assert "missing )" in ms.errors[0][1]
    assert ms.names == ("digits", "word")
    assert ms.apply(b"secret 42") == b"*** #"


def test_broken_pattern_keeps_previous_good_version(tmp_path):
    p, lg = tmp_path / "m.lua", tmp_path / "lg.lua"
    write_last_good(lg, [("digits", r"\d+", "#"), ("gone", "zzz", "")])
    write(p, [("new", "hello", "bye"), ("digits", r"\d+(", "#")])
    ms = load_masks(p, lg)
    assert [n for n, _ in ms.errors] == ["digits"]
    assert ms.names == ("new", "digits")                   # at its new position; "gone" stays gone
    assert ms.patterns[1].pattern == rb"\d+"
    assert ms.apply(b"hello 42") == b"bye #"


def test_unreadable_file_keeps_whole_last_good_set(tmp_path):
    p, lg = tmp_path / "m.lua", tmp_path / "lg.lua"
    write_last_good(lg, [("digits", r"\d+", "#"), ("word", "secret", "***")])
    p.write_text("return { this is not a table")
    ms = load_masks(p, lg)
    assert len(ms.errors) == 1 and ms.errors[0][0] == str(p)
    assert ms.names == ("digits", "word")
    ms2 = load_masks(tmp_path / "missing.lua", lg)
    assert ms2.names == ("digits", "word") and len(ms2.errors) == 1


def test_shape_errors(tmp_path):
    p = tmp_path / "m.lua"
    p.write_text('return { { pattern = "x" }, { name = "a", pattern = "x" }, { name = "a", pattern = "y" },'
                 ' { name = "b", pattern = 5 }, "str" }')
    ms = load_masks(p, tmp_path / "lg.lua")
    assert ms.names == ("a",) and ms.patterns[0].replacement == b""
    assert [n for n, _ in ms.errors] == ["#1", "a", "b", "#5"]


def test_digest_is_order_and_content_sensitive():
    a = MaskSet.from_patterns([("x", b"a", b"b"), ("y", b"c", b"d")])
    b = MaskSet.from_patterns([("y", b"c", b"d"), ("x", b"a", b"b")])
    assert a.digest != b.digest
    assert a.digest == MaskSet.from_patterns([("x", b"a", b"b"), ("y", b"c", b"d")]).digest
    assert MaskSet().digest == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


# --------------------------------------------------------------------------- prefilters

def test_prefilters_cover_the_defaults(defaults):
    assert all(p.prefilter for p in defaults.patterns)
    assert all(len(c.prefilter) == len(p.prefilter) for c, p in zip(defaults._compiled, defaults.patterns, strict=True))


def test_prefilters_are_necessary_conditions(defaults):
    """Every string a default pattern matches is found by each of its prefilters, and
    apply() with prefilters equals plain gsubs in order."""
    import random

    r = random.Random(12)
    alpha = ["a", "Z", "-", "@", ".", "1", "0", "7", "9", "f", "T", " ", ":", "+", "_", "\n", "é"]
    samples = [b"123e4567-e89b-12d3-a456-426614174000", b"2024-05-01T12:30:00Z", b"a.b@example.com",
               b"1700000000123", b"1700000000", b"P123456789", b"id 12345678", b"x-1111-2222-3333-y"]
    texts = []
    for _ in range(3000):
        parts = [r.choice(alpha) for _ in range(r.randint(0, 30))]
        if r.random() < 0.5:
            parts.insert(r.randint(0, len(parts)), r.choice(samples).decode())
        texts.append("".join(parts).encode())
    for t in texts:
        for c in defaults._compiled:
            if c.regex.gsub(t)[1]:
                assert all(f.search(t) for f in c.prefilter), (c.regex.pattern, t)
        plain = t
        for c in defaults._compiled:
            new, n = c.regex.gsub(plain)
            if n:
                plain = new
        assert defaults.apply(t) == plain, t


def test_reader_long_strings_in_lists():
    assert parse_lua_data("return { [[a]], [==[b]]==], x = { [[c]] }, [1 + 0 == 1 and 3 or 3] = nil }"
                          .split(", [1")[0] + " }") == {"x": [b"c"], 1: b"a", 2: b"b]"}


def test_the_combined_prefilter_only_when_every_entry_has_one(defaults):
    assert defaults._any is not None
    bare = MaskSet.from_patterns([("a", rb"\d{3}", b"<n>", [rb"\d"]), ("b", rb"x+", b"<x>")])
    assert bare._any is None and bare.apply(b"xx 123") == b"<x> <n>"
    refers = MaskSet.from_patterns([("a", rb"(\w)\1", b"<d>", [rb"(\w)\1"])])
    assert refers._any is None and refers.apply(b"abba") == b"a<d>a"
    both = MaskSet.from_patterns([("a", rb"\d{3}", b"<n>", [rb"\d"]), ("b", rb"x+", b"<x>", [rb"x"])])
    assert both._any is not None
    assert both.apply(b"nothing here") == b"nothing here" and both.apply(b"xx 123") == b"<x> <n>"
