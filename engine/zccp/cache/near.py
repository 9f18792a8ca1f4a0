"""Near hits: the near record kept in Redis for each stored request whose final user turn
allows them, the near index that finds it, and the check a candidate must pass.

A near hit must mean the same (docs/cache.md, "What a NEAR means"): the stored request's
final turn and this one may differ only in whitespace, letter case, prose punctuation,
filler words and the values the masks replaced (zccp.cache.meaning). So the record keeps
the stored turn's units (its masked words and meaningful symbols, bounded), and the near
index is keyed by the digest of the units with the filler set aside: a request finds the
records whose turn reads the same, whatever its length, and each candidate is checked
against its units with the word list in force before it is served. A word-shingle
similarity, however high, serves nothing: "enable 2FA" and "disable 2FA" in a long prompt
are one word apart.

Record, version 3 (little-endian):

    version u8 = 3 | prefix key 32 | entry in `shared` u8 (1) or the near owner (0)
    | n u32 | n bytes: the units, UTF-8, separated by one space

A record read back from Redis is input: anything else (version 2 records with shingle
sets, a wrong length, bytes that are not the units of some text) is None, which the
lookup treats as a miss.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import struct
from dataclasses import dataclass, field
from typing import Any

from zccp.cache.fp.canonical import as_bytes
from zccp.cache.fp.prompt import final_turn
from zccp.cache.mask_apply import MaskError, MaskSet, mask_doc
from zccp.cache.meaning import NearWords, Units, near_words_or_none

log = logging.getLogger("zccp.cache.near")

RECORD_VERSION = 3
_HEAD = struct.Struct("<B32sBI")       # version, prefix key, where, n
# A turn whose units take more bytes than this is exact-only (the record stays bounded;
# a near-able turn has at most 1024 fingerprint tokens: about 6 KiB of English).
MAX_UNIT_BYTES = 32768


def _pack(units: Units) -> bytes:
    return " ".join(units).encode("utf-8", "surrogatepass")


@dataclass(frozen=True)
class NearRecord:
    prefix: bytes                 # the stored request's prefix key
    shared_entry: bool            # its entry is under `shared` (else under the near owner)
    units: Units                  # its final user turn's units

    def encode(self) -> bytes:
        packed = _pack(self.units)
        return _HEAD.pack(RECORD_VERSION, self.prefix, 1 if self.shared_entry else 0, len(packed)) + packed

    @classmethod
    def decode(cls, raw: Any) -> NearRecord | None:
        """The record in `raw` (bytes from Redis), or None when it is not a well-formed version-3 record."""
        if not isinstance(raw, (bytes, bytearray)) or len(raw) < _HEAD.size:
            return None
        version, prefix, where, n = _HEAD.unpack_from(raw)
        if version != RECORD_VERSION or where > 1 or not 1 <= n <= MAX_UNIT_BYTES or len(raw) != _HEAD.size + n:
            return None
        try:
            units = bytes(raw[_HEAD.size:]).decode("utf-8", "surrogatepass").split(" ")
        except UnicodeDecodeError:
            return None
        if "" in units:
            return None                # two spaces, or one at an end: not what encode() writes
        return cls(prefix, where == 1, units)


def turn_units(doc: dict, masks: MaskSet | None, words: NearWords) -> Units | None:
    """The units of the request's masked final user turn (fingerprint.md §3), or None when
    the turn allows no near hits (no units, or more than MAX_UNIT_BYTES of them).

    doc: the decoded request; masks: the mask set to apply to its final turn (a copy of
    it: doc is not changed), or None when doc is already masked (the engine fingerprinted
    it itself)."""
    msgs = doc.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return None
    view: dict = {"messages": [msgs[-1]]}
    if masks is not None and masks.patterns:
        view = {"messages": [copy.deepcopy(msgs[-1])]}
        try:
            mask_doc(view, masks)      # the masks of §2 see the final turn's strings exactly as in doc
        except MaskError:
            return None
    turn = final_turn(view)
    if turn is None:
        return None
    units = words.units(b"".join(as_bytes(p) for p in turn).decode("utf-8", "surrogateescape"))
    if not units or len(_pack(units)) > MAX_UNIT_BYTES:
        return None
    return units


def index_name(prefix: bytes, core: Units, words: NearWords) -> str:
    """The near index's key name for a turn whose units, filler set aside, are `core`
    (hex): the same for every turn that reads the same under this word list."""
    return hashlib.sha256(b"zccp-near/3\n" + words.digest + prefix + _pack(core)).hexdigest()


@dataclass
class TurnUnits:
    """One request's final-turn units and index name, computed when first asked (a near
    lookup or a store) and kept."""

    doc: dict | None
    masks: MaskSet | None          # None: doc is already masked
    words: NearWords | None = field(default_factory=near_words_or_none)   # None: the list is broken
    _units: Units | None = field(default=None, init=False, repr=False)
    _core: Units | None = field(default=None, init=False, repr=False)
    _done: bool = field(default=False, init=False, repr=False)

    def _compute(self) -> None:
        if self._done:
            return
        self._done = True
        if self.words is None or self.doc is None:
            return
        try:
            self._units = turn_units(self.doc, self.masks, self.words)
            self._core = self.words.core(self._units) if self._units is not None else None
        except Exception:   # a bug here must cost a near hit, not the lookup or the store
            self._units = self._core = None
            log.exception("the final turn's units failed; no near hit for this request")

    def get(self) -> Units | None:
        """The units, or None (no near hits for this request: nothing to look up, nothing to store)."""
        self._compute()
        return self._units

    def core(self) -> Units | None:
        """The units with the filler set aside (None as for get())."""
        self._compute()
        return self._core

    def index(self, prefix: bytes) -> str | None:
        core = self.core()
        return None if core is None or self.words is None else index_name(prefix, core, self.words)


@dataclass(frozen=True)
class Verdict:
    """The candidate a near lookup would serve, and why not when none."""

    key: bytes | None             # the candidate's exact key (hex, as stored in the index)
    record: NearRecord | None
    similarity: float             # Jaccard of the two turns' unit sets, filler included (0.0 when none)
    reason: str                   # "near" | "not_found" | "meaning_differs"


def same_meaning(own_core: Units, record: NearRecord, words: NearWords) -> bool:
    """The check of one candidate: its units, filler set aside by the list in force, are this request's."""
    return words.core(record.units) == own_core


def choose(flat: list[Any], prefix: bytes, own: TurnUnits) -> Verdict:
    """The first candidate among the lookup script's (key, record) pairs whose record has
    this prefix key and whose turn means the same as this one's."""
    mine, core, words = own.get(), own.core(), own.words
    found = False
    for key, raw in zip(flat[0::2], flat[1::2], strict=False):   # an odd tail (malformed reply) is dropped
        rec = NearRecord.decode(raw)
        if rec is None or rec.prefix != prefix or not isinstance(key, bytes):
            continue
        found = True
        if mine is not None and core is not None and words is not None and same_meaning(core, rec, words):
            a, b = set(mine), set(rec.units)
            return Verdict(key, rec, len(a & b) / len(a | b), "near")
    return Verdict(None, None, 0.0, "meaning_differs" if found else "not_found")
