"""A near hit must mean the same (zccp.cache.meaning, zccp.cache.near): two final user
turns are one request only when their units (words and meaningful symbols) are the same
sequence once the filler words are set aside. Records read back from Redis are input:
malformed ones are misses, never crashes. (The live path: tests/integration/test_near_meaning.py.)"""

from __future__ import annotations

import struct

import orjson
import pytest

from zccp.cache.mask_apply import MaskSet
from zccp.cache.meaning import load_near_words, near_words
from zccp.cache.near import (MAX_UNIT_BYTES, RECORD_VERSION, NearRecord, TurnUnits, choose, index_name,
                             turn_units)

W = near_words()
BASE = ("Should I enable 2FA on the admin account before the audit on 5 May? "
        "We have 30 users, all of them on Linux, and the limit is less than 10 GB per user.")


def doc(text) -> dict:
    return {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": text}]}


def same(a: str, b: str) -> bool:
    return W.core(W.units(a)) == W.core(W.units(b))


def own(text) -> TurnUnits:
    return TurnUnits(doc(text), None)


def record(text, prefix=b"p" * 32) -> NearRecord:
    units = turn_units(doc(text), None, W)
    assert units is not None
    return NearRecord(prefix, False, units)


# ------------------------------------------------------------------------------ the rule

@pytest.mark.parametrize("variant", [
    BASE.replace(" ", "  "), BASE.replace(", ", ",\n"), "\t" + BASE + "\n",              # whitespace
    BASE.upper(), BASE.lower(), BASE.title(),                                           # case
    BASE.replace("?", "!"), BASE.replace(",", ""), BASE.replace("audit", '"audit"'),    # punctuation
    BASE.replace("?", "…?"), BASE.replace("2FA", "(2FA)"),
    "Please " + BASE, "Hi, " + BASE.lower(), "Hey there, kindly: " + BASE,                  # filler, politeness
    BASE + " Thanks in advance!", "Hello there! " + BASE + " Thank you.",
    BASE.replace("Should I", "Should I, please,"),
])
def test_format_and_filler_variants_mean_the_same(variant):
    assert same(BASE, variant), (W.core(W.units(BASE)), W.core(W.units(variant)))


@pytest.mark.parametrize("kind,variant", [
    ("negation", BASE.replace("Should I", "Should I not")),
    ("negation", BASE.replace("enable", "never enable")),
    ("number", BASE.replace("30", "300")), ("number", BASE.replace("5 May", "6 May")),
    ("number", BASE.replace("10 GB", "1.0 GB")),
    ("antonym", BASE.replace("enable", "disable")), ("antonym", BASE.replace("before", "after")),
    ("antonym", BASE.replace("less", "more")),
    ("quantifier", BASE.replace("all of them", "some of them")),
    ("entity", BASE.replace("Linux", "Windows")), ("entity", BASE.replace("May", "June")),
    ("unit", BASE.replace("GB", "MB")), ("unit", BASE.replace("10 GB", "10 %")),
    ("reorder", BASE.replace("admin account before the audit", "audit before the admin account")),
    ("filler_mid", BASE.replace("the admin", "the hello admin")),      # a greeting word inside: a word
    ("typo", BASE.replace("account", "acount")),                        # typos are not shown safe: miss
])
def test_meaning_changes_differ(kind, variant):
    assert not same(BASE, variant), kind


@pytest.mark.parametrize("a,b", [
    ("x = -5", "x = 5"), ("if (!done) return", "if (done) return"), ("a != b", "a == b"),
    ("a < b", "a > b"), ("x <= 5", "x >= 5"), ("2+2", "2-2"), ("1.5", "15"), ("1.5", "1,5"),
    ("0.5", ".5"), ("cost 5$", "cost 5€"), ("5'", "5"), ("50%", "50"), ("rate ≤ 3", "rate ≥ 3"),
    ("call foo_bar()", "call foo bar()"), ("call foo_bar()", "call fooBar()"), ("user.name", "user_name"),
    ("use --force", "use force"), ("range 3-4", "range 34"), ("5 - 3", "5 3"), ("5 - 3", "5 + 3"),
    ("a - b", "a + b"), ("ok 👍", "ok 👎"), ("a[0]", "a(0)"),
    ("东京", "京东"), ("Café", "Cafe"), ("résumé", "resume"),
])
def test_symbols_that_carry_meaning_differ(a, b):
    assert not same(a, b), (W.units(a), W.units(b))


@pytest.mark.parametrize("a,b", [
    ("well-known facts", "well known facts"), ("东京 塔", "东京塔"), ("CAFÉ", "café"),
    ("Café", "Cafe\u0301"),                    # NFC: one letter, however it is spelled
    ("zero\u200bwidth", "zerowidth"), ("“quoted”", '"quoted"'), ("a — b", "a b"),
    ("note: this", "note - this"), ("a --- b", "a b"),      # a dash standing alone is punctuation
])
def test_spelling_that_does_not_change_the_text_is_the_same(a, b):
    assert same(a, b), (W.units(a), W.units(b))


def test_filler_is_set_aside_only_where_it_is_filler():
    assert same("Can you explain TCP?", "Explain TCP")
    assert not same("Explain what can you do with TCP", "Explain what do with TCP")
    assert same("Explain TCP, thanks", "Explain TCP")
    assert not same("Write a thank you note", "Write a note")       # "thank you" inside: a word
    assert not same("Write a hello world program", "Write a world program")
    assert not same("thanks", "hi")                                # a turn of filler only is itself
    assert not same("please", "pls")


def test_masked_values_are_the_same_placeholder():
    masks = MaskSet.from_patterns([{"name": "email", "pattern": r"[a-z]+@[a-z]+\.[a-z]+", "replacement": "<email>"}])
    a, b = doc("Write to ann@north.com today"), doc("write to bob@south.org today!")
    ua, ub = turn_units(a, masks, W), turn_units(b, masks, W)
    assert ua == ub == ["write", "to", "<", "email", ">", "today"]
    assert a["messages"][0]["content"] == "Write to ann@north.com today"      # the request is not changed


def test_a_filler_phrase_holding_a_protected_word_or_a_digit_is_refused(tmp_path):
    p = tmp_path / "w.lua"
    p.write_text('return { filler_anywhere = { "please", "not", "2" }, filler_start = { "could you", "do not" },'
                 ' filler_end = { "thanks" }, negations = { "not" }, quantifiers = {}, comparisons = {} }')
    w = load_near_words(p)
    assert w.anywhere == {"please"} and w.start == (("could", "you"),)
    assert w.digest != W.digest
    # every default filler phrase survives the check (no protected word, no digit)
    assert "please" in W.anywhere and ("thank", "you") in W.end and ("could", "you") in W.start


@pytest.mark.parametrize("content", [
    [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}],
    "", "  ...  ", "x" * (MAX_UNIT_BYTES + 1),
])
def test_turns_without_near_hits_have_no_units(content):
    assert turn_units({"messages": [{"role": "user", "content": content}]}, None, W) is None
    assert turn_units({"messages": []}, None, W) is None
    assert turn_units({"messages": [{"role": "assistant", "content": "hi there"}]}, None, W) is None


# ------------------------------------------------------------------------------ the check

def test_a_candidate_that_reads_the_same_is_served_and_one_that_does_not_is_not():
    p = b"p" * 32
    rec = record(BASE)
    v = choose([b"k1", rec.encode()], p, own("Please " + BASE.upper()))
    assert v.key == b"k1" and v.reason == "near" and 0.9 < v.similarity < 1.0
    v = choose([b"k1", rec.encode()], p, own(BASE.replace("enable", "disable")))
    assert v.key is None and v.reason == "meaning_differs"
    # the first candidate that passes wins; another prefix key is no candidate
    v = choose([b"x", record(BASE, b"q" * 32).encode(), b"bad", record(BASE + " 2").encode(), b"k", rec.encode()],
               p, own(BASE + "  "))
    assert v.key == b"k" and v.similarity == 1.0
    assert choose([b"x", record(BASE, b"q" * 32).encode()], p, own(BASE)).reason == "not_found"


def test_the_index_name_is_the_same_for_turns_that_read_the_same():
    p = b"p" * 32
    a, b, c = own(BASE), own("Hi! " + BASE.lower() + " Thanks"), own(BASE.replace("30", "31"))
    assert a.index(p) == b.index(p) != c.index(p)
    assert a.index(p) != a.index(b"q" * 32)
    assert a.index(p) == index_name(p, W.core(W.units(BASE)), W)
    assert TurnUnits({"messages": []}, None).index(p) is None


# ------------------------------------------------------------------------------ records

def test_a_record_round_trips():
    rec = record("Straße İstanbul ΣΊΣΥΦΟΣ café x=-5 东京 bad \udcff bytes")
    back = NearRecord.decode(rec.encode())
    assert back == rec and rec.encode()[0] == RECORD_VERSION


@pytest.mark.parametrize("raw", [
    None, "text", b"", b"\x03" + b"p" * 32,
    b"p" * 32 + b"\x00" + b"\x01" * 512,                                          # version 1
    b"\x02" + b"p" * 32 + b"\x00" + b"\x00" * 512 + struct.pack("<H", 1) + b"\x00" * 4,   # version 2
    struct.pack("<B32sBI", 3, b"p" * 32, 2, 1) + b"a",                            # where > 1
    struct.pack("<B32sBI", 3, b"p" * 32, 0, 2) + b"a",                            # short
    struct.pack("<B32sBI", 3, b"p" * 32, 0, 0),                                   # no units
    struct.pack("<B32sBI", 3, b"p" * 32, 0, 3) + b"a  ",                          # empty unit
    struct.pack("<B32sBI", 3, b"p" * 32, 0, 2) + b"\xff\xfe",                     # not UTF-8
    struct.pack("<B32sBI", 3, b"p" * 32, 0, MAX_UNIT_BYTES + 1) + b"a" * (MAX_UNIT_BYTES + 1),
])
def test_a_malformed_record_is_none(raw):
    assert NearRecord.decode(raw) is None
    assert choose([b"k", raw], b"p" * 32, own(BASE)).key is None


def test_a_failure_while_reading_the_turn_costs_the_near_hit_only():
    t = TurnUnits({"messages": [{"role": "user", "content": "x"}]}, None)
    t.words = None                             # the word list could not be read
    assert t.get() is None and t.index(b"p" * 32) is None

    class Broken:
        def units(self, text):
            raise RuntimeError("a bug in the reader")
    t = TurnUnits({"messages": [{"role": "user", "content": "x"}]}, None, Broken())  # type: ignore[arg-type]
    assert t.get() is None and t.index(b"p" * 32) is None
    assert choose([b"k", record(BASE).encode()], b"p" * 32, t).key is None


def test_a_broken_word_list_turns_near_hits_off_not_the_engine(tmp_path, caplog):
    from zccp.cache import meaning
    p = tmp_path / "w.lua"
    p.write_text("return { filler_anywhere = ")
    with pytest.raises(ValueError):           # LuaDataError
        load_near_words(p)
    meaning.near_words_or_none.cache_clear()
    real = meaning.near_words
    try:
        meaning.near_words = lambda: load_near_words(p)     # type: ignore[assignment]
        assert meaning.near_words_or_none() is None
    finally:
        meaning.near_words = real                           # type: ignore[assignment]
        meaning.near_words_or_none.cache_clear()
    assert meaning.near_words_or_none() is W


def test_a_body_parsed_by_orjson_gives_the_same_units():
    text = "Ünïcödé wörds, ÉTÉ été — 東京タワー and ASCII"
    assert turn_units(orjson.loads(orjson.dumps(doc(text))), None, W) == W.units(text)


@pytest.mark.parametrize("text", [
    BASE, "x = -5 and y >= 3.5, f(!done) foo_bar well-known 5' 1,000 .5 €5 ≤ 😀 你好 번역하기 Café",
    "a\u00a0b\u3000c\td\ne -x- --y 3-4 a-b- -c", "endswith. 5.\n(5) [a] {b} 'q' \"r\" ok!done !=", "",
])
def test_the_chunked_reader_is_the_regex_over_the_whole_text(text):
    # (but for a dash standing alone between words, which the reader drops: tested above)
    import unicodedata

    from zccp.cache.meaning import _FORMAT
    assert W.units(text) == W.unit_re.findall(unicodedata.normalize("NFC", text.translate(_FORMAT)).casefold())
