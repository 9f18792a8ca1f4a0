"""Mask patterns (docs/fingerprint.md §2): the Python side of lua/zccp/masks.lua.

Masks rewrite volatile values (IDs, UUIDs, timestamps, e-mail addresses) in the
prompt text before any cache key or fingerprint is computed (never in what the
model sees). The patterns live in ONE file, lua/zccp/mask_patterns.lua, which
nginx loads as Lua and this module reads with the literal-only reader
(zccp.lua_data); matching goes through the very PCRE library nginx uses
(zccp.cache.pcre), so both sides mask byte for byte alike.

    load_masks(path=None, last_good_path=None) -> MaskSet
    MaskSet.apply(data: bytes) -> bytes   (the same object when nothing matched)
"""

from __future__ import annotations

import hashlib
import re
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from zccp.cache.fp.tables import MASKED_KEYS
from zccp.lua_data import LuaDataError, load_lua_data
from zccp.cache.pcre import MaskError, Regex
from zccp.paths import lua_file

log = logging.getLogger("zccp.cache.masks")

__all__ = ["MaskSource", "MaskError", "MaskPattern", "MaskSet", "load_masks", "default_patterns_path", "mask_doc",
           "collect_literals", "EMPTY_MASKS"]


def default_patterns_path() -> Path:
    """lua/zccp/mask_patterns.lua of the installed data files (ZCCP_MASK_PATTERNS overrides)."""
    env = os.environ.get("ZCCP_MASK_PATTERNS")
    return Path(env) if env else lua_file("mask_patterns.lua")


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
        (zccp.masks.digest() in Lua gives the same: compare them to detect drift)."""
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


def _read_entries(path: Path) -> list[Any]:
    data = load_lua_data(path)
    if not isinstance(data, list):
        raise MaskError(f"{path}: expected `return {{ {{ name = ..., pattern = ..., replacement = ... }}, ... }}`")
    return data


def _prefilter_of(e: dict) -> tuple[bytes, ...]:
    """The entry's `prefilter` list (strings only; anything else is ignored: speed only)."""
    pf = e.get("prefilter")
    return tuple(x for x in pf if isinstance(x, bytes)) if isinstance(pf, list) else ()


def default_last_good_path(path: Path) -> Path:
    return path.with_name(path.stem + ".last_good.lua")


def load_masks(path: str | Path | None = None, last_good_path: str | Path | None = None) -> MaskSet:
    """The mask set nginx's zccp.masks has in force for the same files (docs/fingerprint.md):

    each entry of `path` (default lua/zccp/mask_patterns.lua) that compiles is used;
    one that does not is reported in `errors` by its name and replaced, at its
    position, by the entry of the same name in `last_good_path` (the set nginx last
    had in force; default: <path's stem>.last_good.lua next to it), else dropped. If
    `path` itself cannot be read or parsed, the whole last-good set is used.
    Unlike nginx, this never writes the last-good file.
    """
    path = Path(path) if path is not None else default_patterns_path()
    lg = Path(last_good_path) if last_good_path is not None else default_last_good_path(path)
    errors: list[tuple[str, str]] = []

    prev: dict[bytes, dict] = {}
    try:
        if lg.exists():
            for e in _read_entries(lg):
                if (isinstance(e, dict) and isinstance(e.get("name"), bytes) and isinstance(e.get("pattern"), bytes)
                        and isinstance(e.get("replacement"), bytes) and e["name"] not in prev):
                    prev[e["name"]] = e
    except (OSError, LuaDataError, MaskError):
        prev = {}

    try:
        entries = _read_entries(path)
    except (OSError, LuaDataError, MaskError) as e:
        errors.append((str(path), str(e)))
        entries = list(prev.values())
        prev = {}

    good: list[MaskPattern] = []
    seen: set[bytes] = set()
    for idx, e in enumerate(entries, 1):
        e = e if isinstance(e, dict) else {}
        name = e.get("name")
        label = name.decode("utf-8", "replace") if isinstance(name, bytes) and name else f"#{idx}"
        if not isinstance(name, bytes) or not name:
            errors.append((label, "entry needs a non-empty string `name`"))
            continue
        if name in seen:
            errors.append((label, "duplicate name"))
            continue
        seen.add(name)
        pat, repl = e.get("pattern"), e.get("replacement")
        try:
            if not isinstance(pat, bytes):
                raise MaskError("`pattern` must be a string")
            if repl is None:
                repl = b""
            if not isinstance(repl, bytes):
                raise MaskError("`replacement` must be a string")
            Regex(pat, repl)
        except MaskError as err:
            errors.append((label, str(err)))
            if name not in prev:
                continue
            e = prev[name]
            pat, repl = e["pattern"], e["replacement"]
            try:
                Regex(pat, repl)
            except MaskError:
                continue
        good.append(MaskPattern(name.decode("utf-8", "surrogateescape"), pat, repl, _prefilter_of(e)))
    return MaskSet.build(good, errors, str(path))


class MaskSource:
    """The mask set nginx has in force, followed by its digest rather than by the file.

    nginx names, in every slot, the digest of the set it applied (request.mask_digest) and
    writes that set to its last-good file on every start and reload. The engine starts from
    the files nginx reads; when a slot names a set it does not hold, it loads the last-good
    file. So nginx and the engine switch together when nginx reloads, whatever the patterns
    file says meanwhile, and the workers of the previous generation, finishing their
    requests during a graceful reload, keep theirs. A digest the engine cannot find gets
    None: that request is served uncached (when in doubt, miss).
    """

    KEEP = 4                  # sets held at once (the current one and the ones before it)
    RETRY_S = 1.0             # an unknown digest is looked for again after this long

    def __init__(self, path: Path | None = None, last_good: Path | None = None) -> None:
        self.path = path or default_patterns_path()
        self.last_good = last_good
        first = self._load(self.path, last_good)
        self._sets: dict[str, MaskSet] = {first.digest: first}
        self._current = first
        self._missing: dict[str, float] = {}

    @staticmethod
    def _load(path: Path, last_good: Path | None) -> MaskSet:
        masks = load_masks(path, last_good)
        for name, err in masks.errors:
            log.error("mask pattern %s not applied: %s", name, err)
        return masks

    def get(self, digest: str | None = None) -> MaskSet | None:
        """The set named by `digest` (hex), or the latest one when nginx named none."""
        if digest is None:
            return self._current
        masks = self._sets.get(digest)
        return masks if masks is not None else self._follow(digest)

    def _follow(self, digest: str) -> MaskSet | None:
        now = time.monotonic()
        if self.last_good is None or now < self._missing.get(digest, 0.0):
            return None
        masks: MaskSet | None = None
        if self.last_good.is_file():
            masks = self._load(self.last_good, self.last_good)
            self._sets[masks.digest] = masks
            self._current = masks
            while len(self._sets) > self.KEEP:
                del self._sets[next(iter(self._sets))]
        if masks is not None and masks.digest == digest:
            log.info("mask set %s now in force: nginx (re)loaded %d pattern(s)", digest[:12], len(masks))
            return masks
        if len(self._missing) > 64:
            self._missing.clear()
        self._missing[digest] = now + self.RETRY_S
        log.warning("nginx applied mask set %s, which %s does not hold: serving its requests uncached",
                    digest[:12], self.last_good)
        return None
