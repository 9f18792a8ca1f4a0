"""Near-duplicate candidates: the near record kept in Redis for each stored request whose
final user turn allows near hits, and the exact check a candidate must pass.

The LSH bands only find candidates, and the MinHash estimate from 128 values has a
standard error of about 0.03 around the 0.85 threshold: unrelated prompts with a true
Jaccard of 0.81-0.84 were served. So the record also keeps the candidate's set of word
2-shingles, the ones its MinHash read (fingerprint.md §3-§4: the masked final turn, at
most 1024 tokens), each as a 32-bit hash, sorted and unique; a candidate is served only
when the *exact* Jaccard of its set and the request's is at least `cache.similarity_threshold`. The request's own set
is computed only when there is a candidate to check (TurnShingles, once per request), so
a miss costs nothing more; a store computes it to write the record.

The shingle hash is not the spec's FNV-1a (only the engine makes and reads these sets):
the CRC-32 (zlib's, in C) of each token, the two of a shingle joined into 64 bits and
mixed by splitmix64's finalizer (a bijection), the high 32 bits kept; a one-token text's
one 1-shingle is its token's CRC-32 with the top bit set, mixed alike. All in numpy: a
quarter of the time of hashing each shingle's bytes.

Record, version 2 (little-endian):

    version u8 = 2 | prefix key 32 | entry in `shared` u8 (1) or the near owner (0)
    | signature 128 x u32 | n u16 | n x u32 shingle hashes, strictly increasing

A record read back from Redis is input: anything else (version 1 records, which had no
version byte and no shingles, a wrong length, unsorted or too many hashes) is None,
which the lookup treats as a miss.
"""

from __future__ import annotations

import copy
import logging
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zccp.abi import MINHASH_COUNT
from zccp.cache.fp.canonical import as_bytes
from zccp.cache.fp.csf import estimate_jaccard, tokens_of_text
from zccp.cache.fp.prompt import final_turn
from zccp.cache.fp.tables import MAX_TOKENS
from zccp.cache.mask_apply import MaskError, MaskSet, mask_doc

log = logging.getLogger("zccp.cache.near")

RECORD_VERSION = 2
_HEAD = struct.Struct(f"<B32sB{MINHASH_COUNT}IH")       # version .. n
MAX_SHINGLES = MAX_TOKENS                                # a near turn has 1..MAX_TOKENS tokens
# Candidates whose estimate is this far below the threshold are still checked exactly:
# three standard errors of the 128-value estimate at J = 0.85 (a near-duplicate whose
# estimate fell just short is then served; the exact check decides either way).
VERIFY_MARGIN = 0.10

Shingles = np.ndarray    # sorted, unique uint32 shingle hashes (shingle_set)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_ONE = np.uint64(1 << 63)


@dataclass(frozen=True)
class NearRecord:
    prefix: bytes                 # the stored request's prefix key
    shared_entry: bool            # its entry is under `shared` (else under the near owner)
    signature: tuple[int, ...]    # its MINHASH_COUNT MinHash values
    shingles: Shingles            # its final user turn's shingle hashes

    def encode(self) -> bytes:
        return _HEAD.pack(RECORD_VERSION, self.prefix, 1 if self.shared_entry else 0, *self.signature,
                          len(self.shingles)) + self.shingles.astype("<u4", copy=False).tobytes()

    @classmethod
    def decode(cls, raw: Any) -> NearRecord | None:
        """The record in `raw` (bytes from Redis), or None when it is not a well-formed version-2 record."""
        if not isinstance(raw, (bytes, bytearray)) or len(raw) < _HEAD.size:
            return None
        head = _HEAD.unpack_from(raw)
        version, prefix, where, n = head[0], head[1], head[2], head[-1]
        if version != RECORD_VERSION or where > 1 or not 1 <= n <= MAX_SHINGLES or len(raw) != _HEAD.size + 4 * n:
            return None
        sh = np.frombuffer(raw, dtype="<u4", count=n, offset=_HEAD.size).astype(np.uint32)
        if n > 1 and not bool(np.all(sh[1:] > sh[:-1])):
            return None
        return cls(prefix, where == 1, head[3:-1], sh)


def shingle_set(tokens: list[bytes]) -> Shingles:
    """The hashes of the word 2-shingles of `tokens` (one token: its 1-shingle), sorted and unique."""
    h = np.fromiter(map(zlib.crc32, tokens), dtype=np.uint64, count=len(tokens))
    z = h | _ONE if h.size == 1 else (h[:-1] << np.uint64(32)) | h[1:]
    z ^= z >> np.uint64(30)
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    a = (z >> np.uint64(32)).astype(np.uint32)
    a.sort()
    return a[np.concatenate(([True], a[1:] != a[:-1]))] if a.size > 1 else a


def exact_jaccard(a: Shingles, b: Shingles) -> float:
    """|a ∩ b| / |a ∪ b| of two sorted, unique hash arrays (0.0 when both are empty)."""
    if a.size == 0 or b.size == 0:
        return 0.0
    if a.size > b.size:
        a, b = b, a
    idx = np.searchsorted(b, a)
    idx[idx == b.size] = 0
    inter = int(np.count_nonzero(b[idx] == a))
    return inter / (a.size + b.size - inter)


def turn_shingles(doc: dict, masks: MaskSet | None) -> Shingles | None:
    """The shingle set of the request's final user turn, exactly what the MinHash read
    (fingerprint.md §3-§4), or None when the turn allows no near hits.

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
    toks = tokens_of_text(b"".join(as_bytes(p) for p in turn))
    if not 1 <= len(toks) <= MAX_TOKENS:
        return None                    # no tokens, or more than the fingerprint reads: not near-able
    return shingle_set(toks)


@dataclass
class TurnShingles:
    """One request's shingle set, computed when first asked (a candidate to check, or a
    store) and kept: a lookup that finds no candidate never computes it."""

    doc: dict | None
    masks: MaskSet | None          # None: doc is already masked
    _value: Shingles | None = field(default=None, init=False, repr=False)
    _done: bool = field(default=False, init=False, repr=False)

    def get(self) -> Shingles | None:
        """The set, or None (no near hits for this request: nothing to check, nothing to store)."""
        if not self._done:
            self._done = True
            try:
                self._value = turn_shingles(self.doc, self.masks) if self.doc is not None else None
            except Exception:   # a bug here must cost a near hit, not the lookup or the store
                log.exception("the final turn's shingle set failed; no near hit for this request")
        return self._value


@dataclass(frozen=True)
class Verdict:
    """The candidate a near lookup would serve, and why not when none."""

    key: bytes | None             # the candidate's exact key (hex, as stored in the band sets)
    record: NearRecord | None
    similarity: float             # its exact Jaccard (0.0 when none)
    reason: str                   # "near" | "not_found" | "not_similar"


def choose(flat: list[Any], prefix: bytes, signature: tuple[int, ...], threshold: float,
           own: TurnShingles | None) -> Verdict:
    """The best candidate among the lookup script's (key, record) pairs: the same prefix
    key, an estimate within VERIFY_MARGIN of the threshold, and the highest exact Jaccard,
    which must reach the threshold. `own` is asked for the request's set only when some
    candidate gets that far."""
    cands: list[tuple[float, bytes, NearRecord]] = []
    for key, raw in zip(flat[0::2], flat[1::2], strict=False):
        rec = NearRecord.decode(raw)
        if rec is None or rec.prefix != prefix or not isinstance(key, bytes):
            continue
        cands.append((estimate_jaccard(rec.signature, signature), key, rec))
    if not cands:
        return Verdict(None, None, 0.0, "not_found")
    floor = threshold - VERIFY_MARGIN
    cands = sorted((c for c in cands if c[0] >= floor), key=lambda c: c[0], reverse=True)
    mine = own.get() if cands and own is not None else None
    if mine is None:
        return Verdict(None, None, 0.0, "not_similar")
    best: tuple[float, bytes, NearRecord] | None = None
    for _, key, rec in cands:
        j = exact_jaccard(mine, rec.shingles)
        if j >= threshold and (best is None or j > best[0]):
            best = (j, key, rec)
    if best is None:
        return Verdict(None, None, 0.0, "not_similar")
    return Verdict(best[1], best[2], best[0], "near")
