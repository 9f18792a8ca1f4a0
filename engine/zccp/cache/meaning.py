"""When two final user turns mean the same: the rule a near hit must pass (docs/cache.md,
"What a NEAR means").

A turn is read as a sequence of *units*: its words (Unicode NFC, case-folded; a CJK code
point is a word of its own) and every symbol that can carry meaning, in order. Not
units: whitespace, letter case, prose punctuation, format characters. Two turns are the
same request when their units are one sequence once the filler words of
near_words.lua (beside this module) are set aside; any other difference (a number, a negation, a
quantifier or comparison word, another word, another symbol, another order) is not.
The masks ran before (both turns hold the same placeholder where they replaced values).

Only the engine applies this rule (nginx's fingerprint is unchanged): both turns of a
comparison are read by this module with the list in force, so an edit of the list can
never make an old record pass under a rule it was not read with.
"""

from __future__ import annotations

import hashlib
import logging
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from zccp.cache.fp.tables import RANGES
from zccp.config.lua_data import load_lua_data

log = logging.getLogger("zccp.cache.meaning")

# The one list (a Lua literal table, read with zccp.config.lua_data): only the engine reads it.
NEAR_WORDS = Path(__file__).with_name("near_words.lua")

Units = list[str]

_ASCII_PROSE = ".,;:!?'\"()-"
# zero-width and other format characters: invisible, removed before reading (they join no words apart)
_FORMAT = dict.fromkeys([0xAD, *range(0x200B, 0x2010), *range(0x2060, 0x2065), 0xFEFF])


def _cjk_class() -> str:
    return "".join(re.escape(chr(lo)) + ("-" + re.escape(chr(hi)) if hi > lo else "")
                   for lo, hi, cls in RANGES if cls == b"C")


def _unit_re(prose: str) -> re.Pattern[str]:
    cjk = _cjk_class()
    p = "".join(re.escape(c) for c in dict.fromkeys(_ASCII_PROSE + prose))
    return re.compile(
        f"[{cjk}]"                              # a CJK code point: a word of its own
        f"|[^\\W_{cjk}]+"                       # a word (letters and digits)
        r"|(?<=\d)[^\w\s](?=\d)"                # anything between two digits: 1.5, 1,5, 10:30, 3-4
        r"|(?<!\w)[.,](?=\d)"                   # a leading decimal point: .5
        "|(?<=\\d)['\"\u2032\u2033\u2019\u201d]"   # feet, inches, minutes after a number: 5'
        r"|!(?=[\w=])"                          # code's negation: !done, !=
        r"|(?<![^\W\d_])-|-(?![^\W\d_])"        # a hyphen that does not join two letters: -5, --x, a - b
        f"|[^\\w\\s{p}]|_"             # every other symbol: + = < > % $ € ≤ emoji _ ...
    )


@dataclass(frozen=True)
class NearWords:
    """The filler phrases (as units) and the unit reader of one word list."""

    anywhere: frozenset[str]
    start: tuple[tuple[str, ...], ...]         # longest first
    end: tuple[tuple[str, ...], ...]           # longest first
    protected: frozenset[str]
    digest: bytes                              # of everything above and the punctuation
    unit_re: re.Pattern[str]

    def units(self, text: str) -> Units:
        """The units of a turn's text (already masked). Per whitespace-separated chunk: a
        chunk of ASCII letters and digits is one word as it stands (most of them: the
        regex's alternatives cost ten times more); the rest go through the regex (its
        lookarounds see the same neighbours: whitespace is no word, digit or letter)."""
        out: Units = []
        find = self.unit_re.findall
        chunks = unicodedata.normalize("NFC", text.translate(_FORMAT)).casefold().split()
        for i, chunk in enumerate(chunks):
            if chunk.isascii() and chunk.isalnum():
                out.append(chunk)
            elif chunk.strip("-") or _between_numbers(chunks, i):
                out += find(chunk)
            # else: hyphens standing alone between words are a dash ("a - b", "---"): punctuation
        return out

    def core(self, units: Units) -> Units:
        """The units with the filler set aside: what must be equal."""
        u = [x for x in units if x not in self.anywhere] if not self.anywhere.isdisjoint(units) else []
        u = u or list(units)                   # a turn of filler only is itself
        i, j = 0, len(u)
        while True:
            m = _match(u, i, j, self.start, True)
            if not m:
                break
            i += m
        while True:
            m = _match(u, i, j, self.end, False)
            if not m:
                break
            j -= m
        return u[i:j]


def _between_numbers(chunks: list[str], i: int) -> bool:
    """A chunk between one ending and one starting with a digit ("5 - 3": a minus)."""
    return 0 < i < len(chunks) - 1 and chunks[i - 1][-1].isdigit() and chunks[i + 1][0].isdigit()


def _match(u: Units, i: int, j: int, phrases: tuple[tuple[str, ...], ...], at_start: bool) -> int:
    """The length of the first (longest) phrase at u[i] (or ending at u[j]), leaving at least one unit."""
    for ph in phrases:
        n = len(ph)
        if n < j - i and tuple(u[i:i + n] if at_start else u[j - n:j]) == ph:
            return n
    return 0


def _phrases(raw: object, protected: frozenset[str], reader: NearWords | None, where: str) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    if not isinstance(raw, list):
        raise ValueError(f"{where}: not a list")
    for item in raw:
        if not isinstance(item, bytes):
            raise ValueError(f"{where}: {item!r} is not a string")
        text = item.decode("utf-8")
        units = tuple(reader.units(text)) if reader is not None else tuple(text.split())
        bad = [w for w in units if w in protected or any(c.isdigit() for c in w)]
        if not units or bad:
            log.error("near_words %s: %r refused (protected or numeric: %s)", where, text, bad)
            continue
        out.append(units)
    return sorted(set(out), key=lambda p: (-len(p), p))


def load_near_words(path: str | Path) -> NearWords:
    """The list in `path`; a phrase holding a protected word or a digit is refused (logged)."""
    data = load_lua_data(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a table")
    prose = data.get("prose_punctuation", b"")
    if not isinstance(prose, bytes):
        raise ValueError(f"{path}: prose_punctuation is not a string")
    protected: set[str] = set()
    for name in ("negations", "quantifiers", "comparisons"):
        for w in data.get(name, []):
            protected.add(w.decode("utf-8").casefold())
    prot = frozenset(protected)
    rx = _unit_re(prose.decode("utf-8"))
    reader = NearWords(frozenset(), (), (), prot, b"", rx)
    anywhere = _phrases(data.get("filler_anywhere", []), prot, reader, "filler_anywhere")
    if any(len(p) != 1 for p in anywhere):
        raise ValueError(f"{path}: filler_anywhere holds single words only")
    start = _phrases(data.get("filler_start", []), prot, reader, "filler_start")
    end = _phrases(data.get("filler_end", []), prot, reader, "filler_end")
    h = hashlib.sha256(b"zccp-near-words/1\n" + prose)
    for group in (anywhere, start, end):
        h.update(b"\x00".join(" ".join(p).encode() for p in group) + b"\x01")
    return NearWords(frozenset(p[0] for p in anywhere), tuple(start), tuple(end), prot, h.digest(), rx)


@lru_cache(maxsize=1)
def near_words() -> NearWords:
    """The list in force: NEAR_WORDS, read once per process."""
    return load_near_words(NEAR_WORDS)


@lru_cache(maxsize=1)
def near_words_or_none() -> NearWords | None:
    """near_words(), or None when the file cannot be read (logged once): then no request
    has near hits, and exact hits go on."""
    try:
        return near_words()
    except Exception as exc:
        log.error("%s: %s; near hits are off", NEAR_WORDS, exc)
        return None
