"""Fingerprints and cache keys (docs/fingerprint.md): the Python side of
lua/zccp/fingerprint.lua, byte for byte.

§1 decoding is here; §2 masks in zccp.cache.masks; §3 the prompt text in
zccp.cache.fp.prompt; §4–§5 the CSF in zccp.cache.fp.csf; §6 the exact key in
zccp.cache.fp.canonical. Golden vectors: shm_abi/vectors/fingerprint_vectors.json;
tests/integration/test_fingerprint_identity.py compares both languages through a
real nginx. nginx fingerprints bodies of at most DECODE_LIMIT bytes; the engine
calls compute() for the larger ones and gets exactly what nginx would have
computed had it decoded them.

    compute(api, body, masks) -> Fingerprint | None
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

import orjson

from zccp.cache.fp.canonical import as_bytes, canonical_pieces, sha256_of
from zccp.cache.fp.csf import band_keys, csf_key_of, csf_of_prefixes, estimate_jaccard
from zccp.cache.fp.prompt import prompt_pieces, prompt_prefix
from zccp.cache.fp.tables import DECODE_LIMIT, MAX_DEPTH, MAX_TOKENS
from zccp.cache.masks import EMPTY_MASKS, MaskError, MaskSet, mask_doc

__all__ = ["Fingerprint", "compute", "estimate_jaccard", "DECODE_LIMIT", "MAX_TOKENS"]


# --------------------------------------------------------------------------- §1 decoding

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
        masked = mask_doc(doc, masks)
    except MaskError:  # a PCRE runtime failure (match limit ...): nginx returns nil, err too
        return None
    canon = canonical_pieces(api, doc)
    sig, ntok, complete = csf_of_prefixes(prompt_prefix(api, doc))
    if debug is not None:
        debug["canonical"] = b"".join(canon)
        debug["prompt"] = b"".join(as_bytes(p) for p in prompt_pieces(api, doc))
    return Fingerprint(
        csf_key=csf_key_of(sig),
        bands=band_keys(sig),
        exact_key=sha256_of(canon),
        tokens=ntok,
        complete=complete,
        masked=masked,
        signature=sig,
    )
