"""Mask sets and how they apply (docs/fingerprint.md §2): the Python side of
lua/zccp/fp/mask_apply.lua.

Masks rewrite volatile values (IDs, UUIDs, timestamps, e-mail addresses) in the
prompt text before any cache key or fingerprint is computed (never in what the
model sees). A MaskSet is an ordered, compiled list of patterns with its digest;
matching goes through the very PCRE library nginx uses (zccp.cache.pcre), so both
sides mask byte for byte alike. zccp.cache.mask_store loads the set in force from
lua/zccp/mask_patterns.lua and nginx's last-good file.

    MaskSet.apply(data: bytes) -> bytes   (the same object when nothing matched)
    mask_doc(doc, masks) -> bool          (a decoded request, in place)
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from zccp.cache.fp.tables import MASKED_KEYS
from zccp.cache.pcre import MaskError, Regex

__all__ = ["MaskError", "MaskPattern", "MaskSet", "mask_doc", "collect_literals", "EMPTY_MASKS"]


@dataclass(frozen=True)
class MaskPattern:
    name: str
    pattern: bytes
    replacement: bytes
    # Speed only: regexes that every match of `pattern` contains. When one of them finds
    # nothing in a string, the gsub cannot match there and is skipped.
    prefilter: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class _Compiled:
    regex: Regex
    prefilter: tuple[Regex, ...]        # the entry's prefilters that compile


@dataclass(frozen=True)
class MaskSet:
    """The mask patterns in force, in order; `errors` lists (name, message) of rejected ones."""

    patterns: tuple[MaskPattern, ...] = ()
    errors: tuple[tuple[str, str], ...] = ()
    source: str = ""
    _compiled: tuple[_Compiled, ...] = field(default=(), repr=False, compare=False)
    # Every entry's first prefilter in one alternation: when it finds nothing in a string
    # (most strings), no entry can match and the string costs one scan instead of one per
    # distinct prefilter. None when some entry has no prefilter (or one is not combinable).
    _any: Regex | None = field(default=None, repr=False, compare=False)

    @classmethod
    def build(cls, patterns: Iterable[MaskPattern], errors: Iterable[tuple[str, str]] = (),
              source: str = "") -> "MaskSet":
        """Compile `patterns` (each must compile: MaskError otherwise). A prefilter regex
        shared by several entries is compiled once, so its search runs once per string."""
        pats = tuple(patterns)
        shared: dict[bytes, Regex | None] = {}

        def pre(rx: bytes) -> Regex | None:
            if rx not in shared:
                try:
                    shared[rx] = Regex(rx, b"")
                except MaskError:
                    shared[rx] = None    # a prefilter that does not compile skips nothing
            return shared[rx]

        comp = tuple(_Compiled(Regex(p.pattern, p.replacement),
                               tuple(r for r in map(pre, p.prefilter) if r is not None)) for p in pats)
        return cls(pats, tuple(errors), source, comp, _any_of(pats, shared))

    @classmethod
    def from_patterns(cls, entries: Iterable[Any], strict: bool = True) -> "MaskSet":
        """From (name, pattern, replacement[, prefilter]) tuples or dicts; strict=True raises on a bad one."""
        good: list[MaskPattern] = []
        errors: list[tuple[str, str]] = []
        for idx, e in enumerate(entries, 1):
            if isinstance(e, dict):
                e = (e.get("name"), e.get("pattern"), e.get("replacement"), e.get("prefilter") or ())
            name, pat, repl = (_b(x) for x in e[:3])
            prefilter = tuple(_b(x) for x in (e[3] if len(e) > 3 else ()))
            try:
                if not name:
                    raise MaskError("entry has no name")
                Regex(pat, repl)
            except MaskError as err:
                if strict:
                    raise MaskError(f"mask {name.decode('utf-8', 'replace') or idx}: {err}") from None
                errors.append((name.decode("utf-8", "replace") if name else f"#{idx}", str(err)))
                continue
            good.append(MaskPattern(name.decode("utf-8", "surrogateescape"), pat, repl, prefilter))
        return cls.build(good, errors)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.patterns)

    @property
    def digest(self) -> str:
        """Hex SHA-256 over name NUL pattern NUL replacement NUL, per pattern in order
        (zccp.fp.mask_store.digest() in Lua gives the same: compare them to detect drift)."""
        h = hashlib.sha256()
        for p in self.patterns:
            h.update(p.name.encode("utf-8", "surrogateescape") + b"\0" + p.pattern + b"\0" + p.replacement + b"\0")
        return h.hexdigest()

    def apply(self, data: bytes, literals: list[bytes] | None = None) -> bytes:
        """Every pattern in order; returns `data` itself (same object) when nothing matched.
        literals: a list that receives the text each match replaced (`$0`, as the pattern saw it)."""
        if self._any is not None and not self._any.search(data):
            return data
        found: dict[int, bool] = {}   # prefilter results for the current `data`
        for c in self._compiled:
            skip = False
            for f in c.prefilter:
                hit = found.get(id(f))
                if hit is None:
                    hit = found[id(f)] = f.search(data)
                if not hit:
                    skip = True
                    break
            if skip:
                continue
            new, n = c.regex.gsub(data, literals)
            if n:
                data = new
                found.clear()
        return data

    def apply_changed(self, data: bytes, literals: list[bytes] | None = None) -> tuple[bytes, bool]:
        """(masked, changed): changed is True when the masked text differs from `data`."""
        out = self.apply(data, literals)
        return out, (out is not data and out != data)

    def __len__(self) -> int:
        return len(self.patterns)


EMPTY_MASKS = MaskSet()

# A group reference would point elsewhere once the prefilters share one pattern.
_REFERS = re.compile(rb"\\[1-9gk]|\(\?P[=>]|\(\?[0-9R&+-]")


def _any_of(pats: tuple[MaskPattern, ...], shared: dict[bytes, Regex | None]) -> Regex | None:
    firsts: list[bytes] = []
    for p in pats:
        usable = [rx for rx in p.prefilter if shared.get(rx) is not None]
        if not usable or _REFERS.search(usable[0]):
            return None
        if usable[0] not in firsts:
            firsts.append(usable[0])
    if not firsts:
        return None
    try:
        return Regex(b"|".join(b"(?:" + rx + b")" for rx in firsts), b"")
    except MaskError:
        return None


class _DocMasker:
    """What gets masked in a request (§2): the top-level `system` string, and inside
    `system` and `messages` every string that is the value of a MASKED_KEYS member."""

    def __init__(self, masks: MaskSet, literals: list[bytes] | None = None, in_place: bool = True):
        self.masks = masks
        self.changed = False
        self.literals = literals
        self.in_place = in_place

    def text(self, s: str | bytes) -> str | bytes:
        """The masked string (`s` itself when there are no masks)."""
        if not self.masks.patterns:
            return s
        out, changed = self.masks.apply_changed(s if isinstance(s, bytes) else s.encode("utf-8", "surrogateescape"),
                                                self.literals)
        if changed:
            self.changed = True
        return out

    def walk(self, v: Any) -> None:
        """Replace, in place, every string that is the value of a masked member."""
        if isinstance(v, dict):
            for k, x in v.items():
                if isinstance(x, str) and k in MASKED_KEYS:
                    out = self.text(x)
                    if self.in_place:
                        v[k] = out
                elif isinstance(x, (dict, list)):
                    self.walk(x)
        elif isinstance(v, list):
            for x in v:
                if isinstance(x, (dict, list)):
                    self.walk(x)


def mask_doc(doc: dict, masks: MaskSet, literals: list[bytes] | None = None) -> bool:
    """Mask a decoded request in place (masked strings become bytes); True when a mask
    changed some text. MaskError: a PCRE runtime failure (nginx returns nil, err too).
    literals: a list that receives the values the masks replaced (the cache's guard
    against serving one user's values to another)."""
    return _mask(_DocMasker(masks, literals), doc)


def collect_literals(doc: dict, masks: MaskSet) -> list[bytes]:
    """The values mask_doc() would replace, without changing `doc`."""
    lits: list[bytes] = []
    _mask(_DocMasker(masks, lits, in_place=False), doc)
    return lits


def _mask(m: _DocMasker, doc: dict) -> bool:
    system = doc.get("system")
    if isinstance(system, str):
        out = m.text(system)
        if m.in_place:
            doc["system"] = out
    elif isinstance(system, (dict, list)):
        m.walk(system)
    messages = doc.get("messages")
    if isinstance(messages, (dict, list)):
        m.walk(messages)
    return m.changed


def _b(x: Any) -> bytes:
    if x is None:
        return b""
    if isinstance(x, bytes):
        return x
    if isinstance(x, str):
        return x.encode("utf-8", "surrogateescape")
    raise MaskError(f"expected a string, got {type(x).__name__}")
