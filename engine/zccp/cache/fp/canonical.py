"""The prefix and exact keys (docs/fingerprint.md §6): the canonical byte form of a
decoded, masked request, and the two SHA-256 keys hashed from it. The Python side of
lua/zccp/fp/canonical.lua (and of the hashing in lua/zccp/fp/fingerprint.lua).

    canonical_form(api, doc) -> Canonical (pieces + the place of the final message)
    Canonical.keys(api) -> (prefix_key, exact_key)
    exact_key(api, doc) -> 32 bytes
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Sequence

from zccp.cache.fp.tables import EXACT_PREFIX, EXCLUDED_KEYS, PREFIX_PREFIX

_np: Any   # numpy, or None where it is missing
try:  # finds the special bytes of very long strings at once
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None


def as_bytes(v: str | bytes) -> bytes:
    """A decoded JSON string as the body's bytes (str values: utf-8 + surrogateescape)."""
    return v if isinstance(v, bytes) else v.encode("utf-8", "surrogateescape")


_TWO53, _I64, _U64 = 1 << 53, 1 << 63, 1 << 64


def canonical_number(v: int | float) -> bytes:
    """The shortest of %.15g/%.16g/%.17g that reads back as the same double; 0 for ±0;
    an integer (a JSON literal without fraction or exponent) beyond 2^53 that fits 64 bits
    (what orjson reads as an int): its exact digits."""
    if type(v) is int and not -_TWO53 <= v <= _TWO53 and -_I64 <= v < _U64:
        return b"%d" % v
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
        b = as_bytes(v)
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
    b = as_bytes(v)
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
        _put_object(v, out, _cj_member)
    else:  # pragma: no cover
        raise TypeError(type(v))


def _cj_member(key: bytes, v: Any, out: list[bytes]) -> None:
    _cj(v, out)


def _put_object(v: dict, out: list[bytes], put_value) -> None:
    """An object: members sorted by key bytes, each value written by put_value(key, value, out)."""
    if not v:
        out.append(b"[]")  # lua-cjson decodes {} and [] alike
        return
    out.append(b"{")
    for i, (k, x) in enumerate(sorted(((as_bytes(k), x) for k, x in v.items()), key=lambda kv: kv[0])):
        if i:
            out.append(b",")
        _put_str(k, out)
        out.append(b":")
        put_value(k, x, out)
    out.append(b"}")


def sha256_of(*parts: Sequence[bytes]) -> bytes:
    """SHA-256 of the concatenated pieces of `parts`, without joining long pieces."""
    h = hashlib.sha256()
    small: list[bytes] = []
    for pieces in parts:
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


@dataclass(frozen=True)
class Canonical:
    """CJ(top) as pieces; when `messages` is a non-empty array, its final element is
    pieces[first:stop] and pieces[cut:stop] is that element with the comma before it
    (CJ of top without the final message is the pieces without [cut:stop])."""

    pieces: list[bytes]
    cut: int | None = None
    first: int | None = None
    stop: int | None = None

    def keys(self, api: str) -> tuple[bytes, bytes]:
        """(prefix_key, exact_key): SHA-256 of prefix_prefix API "\n" CJ(top without the final
        message), then SHA-256 of exact_prefix, the prefix key and CJ(final message)."""
        head = [PREFIX_PREFIX, api.encode(), b"\n"]
        p = self.pieces
        if self.cut is None:
            prefix = sha256_of(head, p)
            return prefix, sha256_of([EXACT_PREFIX, prefix])
        prefix = sha256_of(head, p[:self.cut], p[self.stop:])
        return prefix, sha256_of([EXACT_PREFIX, prefix], p[self.first:self.stop])


def exact_key(api: str, doc: dict) -> bytes:
    """The exact key of an (already masked) decoded request."""
    return canonical_form(api, doc).keys(api)[1]


def canonical_form(api: str, doc: dict) -> Canonical:
    """CJ of the request's top-level object (§6), with the place of its final message."""
    top: dict[Any, Any] = {}
    for k, v in doc.items():
        if v is None or k in EXCLUDED_KEYS:
            continue
        top[k] = v
    if api == "openai" and "max_completion_tokens" in top:
        top["max_tokens"] = top.pop("max_completion_tokens")
    out: list[bytes] = []
    place: list[int] = []        # cut, first, stop

    def top_member(k: bytes, x: Any, out: list[bytes]) -> None:
        if k != b"messages" or not isinstance(x, list) or not x:
            return _cj(x, out)
        out.append(b"[")
        for m in x[:-1]:
            _cj(m, out)
            out.append(b",")
        first = len(out)
        place.extend((first - 1 if len(x) > 1 else first, first))
        _cj(x[-1], out)
        place.append(len(out))
        out.append(b"]")

    _put_object(top, out, top_member)
    cut, first, stop = place if place else (None, None, None)
    return Canonical(out, cut, first, stop)
