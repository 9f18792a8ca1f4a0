"""The content-similarity fingerprint (docs/fingerprint.md §4–§5): tokens, word
2-shingles, the one-permutation MinHash signature (optimal densification), LSH band
keys and csf_key. The Python side of lua/zccp/fp/csf.lua, byte for byte.

    csf_signature(masked_text) -> (signature, tokens seen, complete)
    band_keys(signature), csf_key_of(signature), estimate_jaccard(sig_a, sig_b)
"""

from __future__ import annotations

import itertools
import re
from typing import Any, Sequence

from zccp.cache.fp.tables import BANDS, BIN_BITS, MAX_TOKENS, NUM_PERM, RANGES, ROWS, SEED

_np: Any   # numpy, or None where it is missing
try:  # vectorised MinHash; the pure-Python path below gives the same values
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None

_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF
EMPTY_SLOT = _M32                    # signature value when the text has no shingle
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_BIN_SHIFT = 64 - BIN_BITS

# --------------------------------------------------------------------------- hashes

def fnv1a32(data: bytes, h: int = 0x811C9DC5) -> int:
    for c in data:
        h = ((h ^ c) * 0x01000193) & _M32
    return h


def fnv1a64(data: bytes, h: int = 0xCBF29CE484222325) -> int:
    for c in data:
        h = ((h ^ c) * 0x100000001B3) & _M64
    return h


def _splitmix64(seed: int):
    state = seed
    while True:
        state = (state + 0x9E3779B97F4A7C15) & _M64
        yield mix64(state)


def mix64(z: int) -> int:
    """splitmix64's output function (a bijection of 64-bit values)."""
    z = ((z ^ (z >> 30)) * _MIX1) & _M64
    z = ((z ^ (z >> 27)) * _MIX2) & _M64
    return z ^ (z >> 31)


def _probe_table() -> tuple[tuple[int, ...], ...]:
    """Row i: the order in which an empty bin i looks for a filled bin (a Fisher-Yates
    permutation of the bins drawn from splitmix64 seeded with SEED, rows in order)."""
    gen = _splitmix64(SEED)
    rows = []
    for _ in range(NUM_PERM):
        perm = list(range(NUM_PERM))
        for j in range(NUM_PERM - 1, 0, -1):
            r = next(gen) % (j + 1)
            perm[j], perm[r] = perm[r], perm[j]
        rows.append(tuple(perm))
    return tuple(rows)


PROBE = _probe_table()


# --------------------------------------------------------------------------- tokenizer

def _char_classes() -> tuple[str, str]:
    """Regex classes (over the surrogateescape-decoded text) for CJK code points and word chars."""
    cjk: list[tuple[int, int]] = []
    other: list[tuple[int, int]] = []  # S or C: not word characters
    for lo, hi, cls in RANGES:
        other.append((lo, hi))
        if cls == b"C":
            cjk.append((lo, hi))
        elif cls != b"S":
            raise ValueError(f"fp_tables.lua: unknown class {cls!r}")
    # word: [0-9a-z] and every non-ASCII code point outside the table (lone surrogates
    # U+DC80..U+DCFF stand for invalid UTF-8 bytes: word bytes too)
    word: list[tuple[int, int]] = [(0x30, 0x39), (0x61, 0x7A)]
    nxt = 0x80
    for lo, hi in sorted(other):
        if lo > nxt:
            word.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= 0x10FFFF:
        word.append((nxt, 0x10FFFF))

    def cls_src(rs):
        return "".join(re.escape(chr(lo)) + ("-" + re.escape(chr(hi)) if hi > lo else "") for lo, hi in rs)

    return cls_src(cjk), cls_src(word)


_CJK_CLASS, _WORD_CLASS = _char_classes()
_TOKEN_RE = re.compile(f"[{_CJK_CLASS}]|[{_WORD_CLASS}]+")
_ASCII_TOKEN_RE = re.compile(rb"[0-9a-z]+")   # the same rules on lowercased ASCII-only text
_FIRST_PREFIX = 16384                          # bytes of text tokenized first (then 4x, ...)


def _tokenize_prefix(b: bytes, limit: int, final: bool) -> tuple[list[bytes], bool] | None:
    """Tokens of `b`, a prefix of the text (`final`: all of it). None when `b` is too short
    to decide: only tokens before the last one found are certainly whole (the cut can
    split the last word or UTF-8 sequence), so a prefix decides once it holds limit + 2."""
    low = b.lower()  # bytes.lower(): ASCII only
    if low.isascii():
        toks = _ASCII_TOKEN_RE.findall(low)
    else:
        s = low.decode("utf-8", "surrogateescape")
        toks = [t.encode("utf-8", "surrogateescape")
                for t in itertools.islice((m.group() for m in _TOKEN_RE.finditer(s)), limit + 2)]
    if final:
        return toks[:limit], len(toks) <= limit
    if len(toks) >= limit + 2:
        return toks[:limit], False
    return None


def tokenize_prefixes(prefix, limit: int = MAX_TOKENS) -> tuple[list[bytes], bool]:
    """prefix(n) -> (at least the first n bytes of the text or all of it, whether that is all)."""
    n = _FIRST_PREFIX
    while True:
        b, final = prefix(n)
        r = _tokenize_prefix(b, limit, final)
        if r is not None:
            return r
        n *= 4


def tokenize(text: bytes, limit: int = MAX_TOKENS) -> tuple[list[bytes], bool]:
    """The first `limit` tokens of the (unmasked-here) prompt text, and whether that was all of them."""
    return tokenize_prefixes(lambda n: (text[:n], n >= len(text)), limit)


def tokens_of_text(text: bytes) -> list[bytes]:
    """Every token of the whole text, by the tokenizer above (what tokenize() returns for a
    text of at most MAX_TOKENS tokens), in one findall and, for non-ASCII text, one encode:
    no limit, no per-token objects (the exact check of a near candidate, zccp.cache.near)."""
    low = text.lower()
    if low.isascii():
        return _ASCII_TOKEN_RE.findall(low)
    words = _TOKEN_RE.findall(low.decode("utf-8", "surrogateescape"))
    if not words:
        return []
    # a token never holds "\n" (not a word character): encode them all at once, then split
    return "\n".join(words).encode("utf-8", "surrogateescape").split(b"\n")


def shingle_hashes(tokens: Sequence[bytes]) -> list[int]:
    """FNV-1a 32 of each word 2-shingle ("t1 t2"); a single token is one 1-shingle; none: none."""
    if len(tokens) == 1:
        return [fnv1a32(tokens[0])]
    if _np is not None and len(tokens) > 16:
        return _shingle_hashes_np(tokens)
    states = [fnv1a32(t) for t in tokens]
    return [fnv1a32(tokens[j + 1], fnv1a32(b" ", states[j])) for j in range(len(tokens) - 1)]


_NP_COLS = 48   # shingle bytes hashed column by column; longer shingles finish in Python


def _shingle_hashes_np(tokens: Sequence[bytes]) -> list[int]:
    """FNV-1a 32 of every shingle at once: one numpy step per byte position."""
    np = _np
    sh = [a + b" " + b for a, b in itertools.pairwise(tokens)]
    n = len(sh)
    lens = np.fromiter(map(len, sh), dtype=np.int64, count=n)
    cols = min(int(lens.max()), _NP_COLS)
    # fixed-width rows, NUL-padded (a token never contains NUL: it is a separator)
    arr = np.array(sh, dtype=f"S{cols}").view(np.uint8).reshape(n, cols)
    h = np.full(n, 0x811C9DC5, dtype=np.uint32)
    prime = np.uint32(0x01000193)
    shortest = int(lens.min())
    for c in range(cols):
        nh = (h ^ arr[:, c]) * prime
        h = nh if c < shortest else np.where(lens > c, nh, h)
    out = h.tolist()
    if cols < lens.max():
        for j in np.flatnonzero(lens > cols).tolist():
            out[j] = fnv1a32(sh[j][cols:], out[j])
    return out


def _bins_py(xs: Sequence[int]) -> dict[int, int]:
    """bin -> minimum value, over the shingle hashes xs (one mix each)."""
    out: dict[int, int] = {}
    for x in xs:
        z = mix64(x ^ SEED)
        b, v = z >> _BIN_SHIFT, z & _M32
        if v < out.get(b, 1 << 32):
            out[b] = v
    return out


def _bins_np(xs: Sequence[int]) -> dict[int, int]:
    """The same with numpy: mix every hash at once, then the smallest value of each bin."""
    np = _np
    z = np.array(xs, dtype=np.uint64) ^ np.uint64(SEED)
    z ^= z >> np.uint64(30)
    z *= np.uint64(_MIX1)
    z ^= z >> np.uint64(27)
    z *= np.uint64(_MIX2)
    z ^= z >> np.uint64(31)
    # bin in the high word, value in the low one: sorted, a bin's first entry is its minimum
    k = np.sort(((z >> np.uint64(_BIN_SHIFT)) << np.uint64(32)) | (z & np.uint64(_M32)))
    b = k >> np.uint64(32)
    first = np.flatnonzero(np.concatenate(([True], b[1:] != b[:-1])))
    return dict(zip(b[first].tolist(), (k[first] & np.uint64(_M32)).tolist(), strict=False))


def minhash(xs: Sequence[int]) -> tuple[int, ...]:
    """The NUM_PERM values of one-permutation MinHash over shingle hashes xs: bin i holds
    the smallest value mixed into it; an empty bin copies the first filled bin of PROBE[i]
    (optimal densification); no shingle at all: EMPTY_SLOT everywhere."""
    if not xs:
        return (EMPTY_SLOT,) * NUM_PERM
    bins = _bins_np(xs) if _np is not None and len(xs) > 32 else _bins_py(xs)
    out = []
    for i in range(NUM_PERM):
        v = bins.get(i)
        if v is None:
            v = bins[next(j for j in PROBE[i] if j in bins)]
        out.append(v)
    return tuple(out)


def band_keys(sig: Sequence[int]) -> tuple[int, ...]:
    out = []
    for i in range(BANDS):
        data = bytes([i]) + b"".join(v.to_bytes(4, "little") for v in sig[i * ROWS:(i + 1) * ROWS])
        out.append(fnv1a64(data))
    return tuple(out)


def csf_key_of(sig: Sequence[int]) -> int:
    return fnv1a64(b"".join(v.to_bytes(4, "little") for v in sig))


def csf_signature(text: bytes) -> tuple[tuple[int, ...], int, bool]:
    """(signature, tokens seen, complete) of an already-masked text."""
    toks, complete = tokenize(text)
    return minhash(shingle_hashes(toks)), len(toks), complete


def csf_of_prefixes(prefix) -> tuple[tuple[int, ...], int, bool]:
    """csf_signature() of a text given as prefix(n) (see tokenize_prefixes)."""
    toks, complete = tokenize_prefixes(prefix)
    return minhash(shingle_hashes(toks)), len(toks), complete


def estimate_jaccard(sig_a: Sequence[int], sig_b: Sequence[int]) -> float:
    """MinHash estimate of the Jaccard similarity of two texts' shingle sets."""
    if len(sig_a) != len(sig_b) or not sig_a:
        raise ValueError("signatures must have the same, non-zero length")
    return sum(1 for a, b in zip(sig_a, sig_b, strict=False) if a == b) / len(sig_a)
