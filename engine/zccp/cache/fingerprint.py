"""Fingerprints and cache keys: the Python side of lua/zccp/fingerprint.lua.

Both implement docs/fingerprint.md byte for byte (golden vectors in
shm_abi/vectors/fingerprint_vectors.json; tests/integration/test_fingerprint_identity.py
compares them through a real nginx). nginx fingerprints bodies of at most
DECODE_LIMIT bytes; the engine calls compute() for the larger ones and gets
exactly what nginx would have computed had it decoded them.

    compute(api, body, masks) -> Fingerprint | None
    estimate_jaccard(sig_a, sig_b) -> float
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import orjson

from zccp.masks import EMPTY_MASKS, MaskError, MaskSet, load_lua_data

try:  # vectorised MinHash; the pure-Python path below gives the same values
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None

__all__ = [
    "Fingerprint", "compute", "estimate_jaccard", "csf_signature", "prompt_text", "canonical_request",
    "tokenize", "shingle_hashes", "minhash", "band_keys", "csf_key_of", "fnv1a32", "fnv1a64",
    "canonical_number", "MINHASH_A", "MINHASH_B", "DECODE_LIMIT", "MAX_TOKENS", "NUM_PERM", "BANDS",
    "ROWS", "MAX_DEPTH", "EXACT_PREFIX",
]

_TABLES_PATH = Path(__file__).resolve().parents[2] / "lua" / "zccp" / "fp_tables.lua"
_T = load_lua_data(_TABLES_PATH)

MAX_TOKENS: int = _T["max_tokens"]
NUM_PERM: int = _T["num_perm"]
BANDS: int = _T["bands"]
ROWS: int = _T["rows"]
DECODE_LIMIT: int = _T["decode_limit"]
SEED: int = (_T["seed_hi"] << 32) | _T["seed_lo"]
MAX_DEPTH = 128                      # JSON nesting deeper than this: no fingerprint (cjson's limit in nginx)
EXACT_PREFIX = b"zccp-exact/1\n"
EXCLUDED_KEYS = frozenset({"stream", "stream_options", "metadata", "user"})
MASKED_KEYS = frozenset({"content", "text"})

_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF
MERSENNE_61 = (1 << 61) - 1
EMPTY_SLOT = _M32                    # signature value when the prompt has no shingle

assert BANDS * ROWS == NUM_PERM


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
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        yield z ^ (z >> 31)


def _minhash_params() -> tuple[tuple[int, ...], tuple[int, ...]]:
    gen = _splitmix64(SEED)
    a_s, b_s = [], []
    for _ in range(NUM_PERM):
        a = 0
        while a == 0:
            a = next(gen) % MERSENNE_61
        a_s.append(a)
        b_s.append(next(gen) % MERSENNE_61)
    return tuple(a_s), tuple(b_s)


MINHASH_A, MINHASH_B = _minhash_params()


# --------------------------------------------------------------------------- tokenizer

def _char_classes() -> tuple[str, str]:
    """Regex classes (over the surrogateescape-decoded text) for CJK code points and word chars."""
    cjk: list[tuple[int, int]] = []
    other: list[tuple[int, int]] = []  # S or C: not word characters
    for lo, hi, cls in _T["ranges"]:
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


def _tokenize_source(prefix, limit: int = MAX_TOKENS) -> tuple[list[bytes], bool]:
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
    return _tokenize_source(lambda n: (text[:n], n >= len(text)), limit)


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
    sh = [a + b" " + b for a, b in zip(tokens, tokens[1:])]
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


def _minhash_py(xs: Sequence[int]) -> tuple[int, ...]:
    if not xs:
        return (EMPTY_SLOT,) * NUM_PERM
    P = MERSENNE_61
    return tuple(min(((a * x + b) % P) & _M32 for x in xs) for a, b in zip(MINHASH_A, MINHASH_B))


if _np is not None:
    # a = AH * 2^29 + AL (AH < 2^32, AL < 2^29), as in fingerprint.lua
    _AH = _np.array([a >> 29 for a in MINHASH_A], dtype=_np.uint64)[:, None]
    _AL = _np.array([a & ((1 << 29) - 1) for a in MINHASH_A], dtype=_np.uint64)[:, None]
    _B = _np.array(MINHASH_B, dtype=_np.uint64)[:, None]

_NP_ROWS = 16   # MinHash functions per numpy block (keeps the temporaries in cache)


def _minhash_np(xs: Sequence[int]) -> tuple[int, ...]:
    """Same arithmetic as fingerprint.lua: with a = AH*2^29 + AL and x < 2^32,
    s = ((AH*x mod 2^32) << 29) + (AH*x >> 32) + AL*x + b < 2^63 is a*x + b mod P;
    r = (s & P) + (s >> 61) <= P + 3, and r mod P has the low 32 bits of r + ((r + 1) >> 61)."""
    if not xs:
        return (EMPTY_SLOT,) * NUM_PERM
    np = _np
    x = np.array(xs, dtype=np.uint64)[None, :]
    u = np.uint64
    m32, p61, s29, s32, s61, one = u(_M32), u(MERSENNE_61), u(29), u(32), u(61), u(1)
    out: list[int] = []
    for i in range(0, NUM_PERM, _NP_ROWS):
        h = _AH[i:i + _NP_ROWS] * x
        s = h & m32
        s <<= s29
        h >>= s32
        s += h
        np.multiply(_AL[i:i + _NP_ROWS], x, out=h)
        s += h
        s += _B[i:i + _NP_ROWS]
        np.right_shift(s, s61, out=h)
        s &= p61
        s += h                      # r
        np.add(s, one, out=h)
        h >>= s61                   # 1 iff r >= P
        s += h
        s &= m32
        out.extend(s.min(axis=1).tolist())
    return tuple(out)


def minhash(xs: Sequence[int]) -> tuple[int, ...]:
    """128 values: min over shingles of ((a_i*x + b_i) mod (2^61-1)) & 0xffffffff."""
    xs = list(dict.fromkeys(xs))
    if _np is not None and len(xs) > 8:
        return _minhash_np(xs)
    return _minhash_py(xs)


def band_keys(sig: Sequence[int]) -> tuple[int, ...]:
    out = []
    for i in range(BANDS):
        data = bytes([i]) + b"".join(v.to_bytes(4, "little") for v in sig[i * ROWS:(i + 1) * ROWS])
        out.append(fnv1a64(data))
    return tuple(out)


def csf_key_of(sig: Sequence[int]) -> int:
    return fnv1a64(b"".join(v.to_bytes(4, "little") for v in sig))


def csf_signature(text: bytes) -> tuple[tuple[int, ...], int, bool]:
    """(signature, tokens seen, complete) of an already-masked prompt text."""
    toks, complete = tokenize(text)
    return minhash(shingle_hashes(toks)), len(toks), complete


def estimate_jaccard(sig_a: Sequence[int], sig_b: Sequence[int]) -> float:
    """MinHash estimate of the Jaccard similarity of two prompts' shingle sets."""
    if len(sig_a) != len(sig_b) or not sig_a:
        raise ValueError("signatures must have the same, non-zero length")
    return sum(1 for a, b in zip(sig_a, sig_b) if a == b) / len(sig_a)


# --------------------------------------------------------------------------- JSON

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_ESCAPE = re.compile(rb"\\(?:u([0-9a-fA-F]{4})|.)", re.S)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid number {name}")


def _lone_surrogate_escape(body: bytes) -> bool:
    """True when a \\uD800-\\uDFFF escape is not half of a high+low pair (cjson rejects those)."""
    if not _SURROGATE_ESCAPE.search(body):
        return False
    pending_high = -1  # end offset of an unpaired high surrogate escape
    for m in _ESCAPE.finditer(body):
        u = m.group(1)
        cp = int(u, 16) if u is not None else -1
        if pending_high >= 0:
            if m.start() == pending_high and 0xDC00 <= cp <= 0xDFFF:
                pending_high = -1
                continue
            return True
        if 0xD800 <= cp <= 0xDBFF:
            pending_high = m.end()
        elif 0xDC00 <= cp <= 0xDFFF:
            return True
    return pending_high >= 0


def _decode(body: bytes) -> Any:
    """What lua-cjson (decode_invalid_numbers off) accepts, as Python values; None when it would not."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    # cjson also takes raw control characters and invalid UTF-8 inside strings: the
    # surrogateescape round trip keeps those bytes (U+DC80..U+DCFF <-> 0x80..0xFF).
    if _lone_surrogate_escape(body):
        return None
    try:
        return json.loads(body.decode("utf-8", "surrogateescape"), strict=False, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return None


def _too_deep(v: Any) -> bool:
    stack = [(v, 1)]
    while stack:
        x, d = stack.pop()
        if d > MAX_DEPTH:
            return True
        if isinstance(x, dict):
            stack.extend((y, d + 1) for y in x.values() if isinstance(y, (dict, list)))
        elif isinstance(x, list):
            stack.extend((y, d + 1) for y in x if isinstance(y, (dict, list)))
    return False


def _s(v: str | bytes) -> bytes:
    return v if isinstance(v, bytes) else v.encode("utf-8", "surrogateescape")


def canonical_number(v: int | float) -> bytes:
    """The shortest of %.15g/%.16g/%.17g that reads back as the same double; 0 for ±0."""
    try:
        f = float(v)
    except OverflowError:
        f = float("inf") if v > 0 else float("-inf")
    if f != f:
        return b"nan"
    if f == 0:
        return b"0"
    if f in (float("inf"), float("-inf")):
        return b"inf" if f > 0 else b"-inf"
    for p in (15, 16, 17):
        s = "%.*g" % (p, f)
        if float(s) == f:
            return s.encode()
    raise AssertionError("unreachable")


_STR_ESC = re.compile(rb'["\\\x00-\x1f]')


def _esc_byte(c: int) -> bytes:
    if c == 0x22:
        return b'\\"'
    if c == 0x5C:
        return b"\\\\"
    return b"\\u%04x" % c


def _esc(m: re.Match) -> bytes:
    return _esc_byte(m.group()[0])


_LONG_STR = 64
# long strings: one str.replace / bytes.replace per special character present (each
# presence test is a memchr); the backslash first, so that no escape is escaped again
_ESC_ORDER = [0x5C, 0x22] + list(range(32))
_ESC_BYTES = [(bytes([c]), _esc_byte(c)) for c in _ESC_ORDER]


_NP_SCAN = 8192


def _put_str(v: str | bytes, out: list[bytes]) -> None:
    if len(v) > _LONG_STR:
        b = _s(v)
        if _np is not None and len(b) > _NP_SCAN:
            # which specials occur: the control bytes at once, then the two others
            a = _np.frombuffer(b, dtype=_np.uint8)
            ctl = set(_np.unique(a[a < 32]).tolist())
            escs = [(ch, esc) for ch, esc in _ESC_BYTES if ch[0] in ctl or (ch[0] >= 32 and ch in b)]
        else:
            escs = [(ch, esc) for ch, esc in _ESC_BYTES if ch in b]
        for ch, esc in escs:   # in _ESC_ORDER: the backslash first
            b = b.replace(ch, esc)
        out.extend((b'"', b, b'"'))   # no copy of a long string here: the final join copies
        return
    b = _s(v)
    if _STR_ESC.search(b):
        b = _STR_ESC.sub(_esc, b)
    out.append(b'"' + b + b'"')


def _cj(v: Any, out: list[bytes]) -> None:
    if isinstance(v, (str, bytes)):
        _put_str(v, out)
    elif v is None:
        out.append(b"null")
    elif v is True:
        out.append(b"true")
    elif v is False:
        out.append(b"false")
    elif isinstance(v, (int, float)):
        out.append(canonical_number(v))
    elif isinstance(v, list):
        if not v:
            out.append(b"[]")
            return
        out.append(b"[")
        for i, x in enumerate(v):
            if i:
                out.append(b",")
            _cj(x, out)
        out.append(b"]")
    elif isinstance(v, dict):
        if not v:
            out.append(b"[]")  # lua-cjson decodes {} and [] alike
            return
        out.append(b"{")
        for i, (k, x) in enumerate(sorted(((_s(k), x) for k, x in v.items()), key=lambda kv: kv[0])):
            if i:
                out.append(b",")
            _put_str(k, out)
            out.append(b":")
            _cj(x, out)
        out.append(b"}")
    else:  # pragma: no cover
        raise TypeError(type(v))


class _Masker:
    def __init__(self, masks: MaskSet):
        self.masks = masks
        self.changed = False

    def text(self, s: str | bytes) -> str | bytes:
        """The masked string (`s` itself when there are no masks)."""
        if not self.masks.patterns:
            return s
        out, changed = self.masks.apply_changed(_s(s))
        if changed:
            self.changed = True
        return out

    def walk(self, v: Any) -> None:
        """Replace, in place, every string that is the value of a `content` or `text` member."""
        if isinstance(v, dict):
            for k, x in v.items():
                if isinstance(x, str) and k in MASKED_KEYS:
                    v[k] = self.text(x)
                elif isinstance(x, (dict, list)):
                    self.walk(x)
        elif isinstance(v, list):
            for x in v:
                if isinstance(x, (dict, list)):
                    self.walk(x)


def _mask_doc(doc: dict, masks: MaskSet) -> bool:
    m = _Masker(masks)
    system = doc.get("system")
    if isinstance(system, str):
        doc["system"] = m.text(system)
    elif isinstance(system, (dict, list)):
        m.walk(system)
    messages = doc.get("messages")
    if isinstance(messages, (dict, list)):
        m.walk(messages)
    return m.changed


def canonical_request(api: str, doc: dict) -> bytes:
    """The exact key's byte form of an (already masked) decoded request."""
    return b"".join(_canonical_pieces(api, doc))


def _exact_key(pieces: list[bytes]) -> bytes:
    """SHA-256 of the joined pieces, without copying the long ones into one string."""
    h = hashlib.sha256()
    small: list[bytes] = []
    for p in pieces:
        if len(p) > 4096:
            if small:
                h.update(b"".join(small))
                small.clear()
            h.update(p)
        else:
            small.append(p)
    if small:
        h.update(b"".join(small))
    return h.digest()


def _canonical_pieces(api: str, doc: dict) -> list[bytes]:
    top: dict[Any, Any] = {}
    for k, v in doc.items():
        if v is None or k in EXCLUDED_KEYS:
            continue
        top[k] = v
    if api == "openai" and "max_completion_tokens" in top:
        top["max_tokens"] = top.pop("max_completion_tokens")
    out = [EXACT_PREFIX, api.encode(), b"\n"]
    _cj(top, out)
    return out


# lua-cjson decodes {} and [] to the same empty table: an empty container is both
# an object and an array, exactly as fingerprint.lua sees it.
def _is_obj(v: Any) -> bool:
    return isinstance(v, dict) or (isinstance(v, list) and not v)


def _is_arr(v: Any) -> bool:
    return isinstance(v, list) or (isinstance(v, dict) and not v)


def _text_pieces(content: Any, out: list) -> None:
    if isinstance(content, (str, bytes)):
        out.append(content)
        return
    if content is None:
        return
    if _is_arr(content):
        for i, blk in enumerate(content):
            if i:
                out.append(b"\n")
            t = blk.get("type") if isinstance(blk, dict) else None   # [] has no type either
            if isinstance(t, (str, bytes)):
                txt = blk.get("text")
                if _s(t) == b"text" and isinstance(txt, (str, bytes)):
                    out.append(txt)
                else:
                    out.extend((b"[", t, b"]"))
            else:
                out.append(b"[?]")
        return
    out.append(b"[?]")


def _entry(role: Any, content: Any, out: list) -> None:
    out.extend((role if isinstance(role, (str, bytes)) else b"?", b": "))
    _text_pieces(content, out)
    out.append(b"\n")


def _prompt_pieces(api: str, doc: dict) -> list:
    """The prompt text as a list of str / bytes pieces (str pieces encode with surrogateescape)."""
    out: list = []
    messages = doc.get("messages")
    msgs = messages if isinstance(messages, list) else []
    if api == "anthropic":
        if "system" in doc and doc["system"] is not None:
            _entry(b"system", doc["system"], out)
        for m in msgs:
            if _is_obj(m):
                m = m or {}
                _entry(m.get("role"), m.get("content"), out)
            else:
                _entry(None, b"[?]", out)
    else:
        rest: list = []
        for m in msgs:
            if _is_obj(m):
                m = m or {}
                role = m.get("role")
                first = isinstance(role, (str, bytes)) and _s(role) in (b"system", b"developer")
                _entry(role, m.get("content"), out if first else rest)
            else:
                _entry(None, b"[?]", rest)
        out.extend(rest)
    return out


def prompt_text(api: str, doc: dict) -> bytes:
    """The (already masked) prompt text the CSF reads: `role: text\\n` per entry."""
    return b"".join(_s(p) for p in _prompt_pieces(api, doc))


def _prefix_of(pieces: list):
    """prefix(n) -> (at least the first n bytes of the joined pieces, or all of them; whether all)."""
    def prefix(n: int) -> tuple[bytes, bool]:
        out: list[bytes] = []
        size = 0
        for k, p in enumerate(pieces):
            if size >= n:
                return b"".join(out), False
            need = n - size
            if len(p) > need:    # a str of more than `need` code points has more than `need` bytes
                b = (p[:need].encode("utf-8", "surrogateescape") if isinstance(p, str) else p[:need])
                out.append(b)
                return b"".join(out), False
            b = _s(p)
            out.append(b)
            size += len(b)
        return b"".join(out), True
    return prefix


# --------------------------------------------------------------------------- compute

@dataclass(frozen=True)
class Fingerprint:
    csf_key: int                    # uint64: FNV-1a 64 over the 128 signature values
    bands: tuple[int, ...]          # 16 uint64 LSH band keys
    exact_key: bytes                # 32 bytes: SHA-256 of the canonical masked request
    tokens: int                     # prompt tokens the CSF saw (<= 1024)
    complete: bool                  # the CSF saw the whole prompt
    masked: bool                    # a mask pattern changed some text
    signature: tuple[int, ...] = () # the 128 MinHash values (uint32)

    def jaccard(self, other: "Fingerprint | Sequence[int]") -> float:
        sig = other.signature if isinstance(other, Fingerprint) else other
        return estimate_jaccard(self.signature, sig)


def _parse(api: str, body: bytes | bytearray | memoryview | str) -> dict | None:
    if api not in ("anthropic", "openai"):
        raise ValueError(f"api must be 'anthropic' or 'openai', not {api!r}")
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogateescape")
    elif not isinstance(body, bytes):
        body = bytes(body)
    doc = _decode(body)
    if not isinstance(doc, dict) or _too_deep(doc):
        return None
    return doc


def compute(api: str, body: bytes | bytearray | memoryview | str | None, masks: MaskSet = EMPTY_MASKS,
            *, debug: dict | None = None, doc: dict | None = None) -> Fingerprint | None:
    """The fingerprint nginx computes for `body` (at any size), or None where nginx's
    decoder would fail (not a JSON object, nested deeper than MAX_DEPTH, ...).

    doc: the body already decoded by `orjson.loads(body)` (it must be exactly that: the
    result of a successful orjson parse of these bytes, not a fallback decoder's). It is
    used instead of decoding again, and it is changed in place (masked strings). body may
    then be None."""
    if doc is None:
        doc = _parse(api, body)
        if doc is None:
            return None
    else:
        if api not in ("anthropic", "openai"):
            raise ValueError(f"api must be 'anthropic' or 'openai', not {api!r}")
        if not isinstance(doc, dict) or _too_deep(doc):
            return None
    try:
        masked = _mask_doc(doc, masks)
    except MaskError:  # a PCRE runtime failure (match limit ...): nginx returns nil, err too
        return None
    canon = _canonical_pieces(api, doc)
    pieces = _prompt_pieces(api, doc)
    toks, complete = _tokenize_source(_prefix_of(pieces))
    sig = minhash(shingle_hashes(toks))
    if debug is not None:
        debug["canonical"] = b"".join(canon)
        debug["prompt"] = b"".join(_s(p) for p in pieces)
    return Fingerprint(
        csf_key=csf_key_of(sig),
        bands=band_keys(sig),
        exact_key=_exact_key(canon),
        tokens=len(toks),
        complete=complete,
        masked=masked,
        signature=sig,
    )
