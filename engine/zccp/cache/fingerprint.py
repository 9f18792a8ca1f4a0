"""Fingerprints and cache keys (docs/fingerprint.md, version 3): the Python side of
lua/zccp/fp/fingerprint.lua, byte for byte.

§1 decoding is here; §2 masks in zccp.cache.mask_apply; §3 the final user turn in
zccp.cache.fp.prompt; §4–§5 the CSF in zccp.cache.fp.csf; §6 the prefix and exact keys
in zccp.cache.fp.canonical. Golden vectors: shm_abi/vectors/fingerprint_vectors.json;
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

from zccp.cache.fp.canonical import as_bytes, canonical_form
from zccp.cache.fp.csf import band_keys, csf_key_of, csf_of_prefixes, estimate_jaccard
from zccp.cache.fp.prompt import final_turn, prefix_of
from zccp.cache.fp.tables import DECODE_LIMIT, MAX_DEPTH, MAX_TOKENS
from zccp.cache.mask_apply import EMPTY_MASKS, MaskError, MaskSet, mask_doc

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

# nginx fingerprints the two chat APIs; the engine alone the other OpenAI endpoints, whose
# keys are exact-only (no final user turn) and hash their own API name (docs/fingerprint.md,
# "Other endpoints"): no key of one endpoint is ever another's.
CHAT_APIS = ("anthropic", "openai")
APIS = CHAT_APIS + ("completions", "responses")

@dataclass(frozen=True)
class Fingerprint:
    exact_key: bytes                # 32 bytes: SHA-256 of the prefix key and the final message
    prefix_key: bytes               # 32 bytes: SHA-256 of the canonical request without its final message
    masked: bool                    # a mask pattern changed some text
    near: bool = False              # near-duplicate hits allowed: a text-only final user turn, 1..1024 tokens
    tokens: int = 0                 # tokens of the final user turn the CSF saw (0 unless near)
    signature: tuple[int, ...] = () # the 128 MinHash values of the final user turn (() unless near)
    bands: tuple[int, ...] = ()     # 16 uint64 LSH band keys (() unless near)
    csf_key: int = 0                # uint64: FNV-1a 64 over the signature (0 unless near)
    end_user: str | None = None     # metadata.user_id / user: a tenant source, not part of the fingerprint

    def jaccard(self, other: "Fingerprint | Sequence[int]") -> float:
        """Estimated similarity of the final user turns; ValueError unless both allow near hits."""
        sig = other.signature if isinstance(other, Fingerprint) else other
        return estimate_jaccard(self.signature, sig)


def _end_user(api: str, doc: dict) -> str | None:
    if api == "anthropic":
        meta = doc.get("metadata")
        u = meta.get("user_id") if isinstance(meta, dict) else None
    else:
        u = doc.get("user")
    return u if isinstance(u, str) else None


def decode_request(api: str, body: bytes | bytearray | memoryview | str) -> dict | None:
    """The request as nginx's decoder reads it (§1), or None where that would fail (not a
    JSON object, nested deeper than MAX_DEPTH, ...): what compute() decodes, for its `doc`."""
    if api not in APIS:
        raise ValueError(f"api must be one of {APIS}, not {api!r}")
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogateescape")
    elif not isinstance(body, bytes):
        body = bytes(body)
    doc = _decode(body)
    if not isinstance(doc, dict) or _too_deep(doc):
        return None
    return doc


def compute(api: str, body: bytes | bytearray | memoryview | str | None, masks: MaskSet = EMPTY_MASKS,
            *, debug: dict | None = None, doc: dict | None = None,
            literals: list[bytes] | None = None) -> Fingerprint | None:
    """The fingerprint nginx computes for `body` (at any size), or None where nginx's
    decoder would fail (not a JSON object, nested deeper than MAX_DEPTH, ...).

    doc: the body already decoded by `orjson.loads(body)` or by decode_request(api, body)
    (not by another decoder). It is used instead of decoding again, and it is changed in
    place (masked strings). body may then be None.

    literals: a list that receives every value a mask replaced (the `$0` of each match)."""
    if doc is None:
        assert body is not None, "fingerprint: give the body or its parsed doc"   # programmer error
        doc = decode_request(api, body)
        if doc is None:
            return None
    else:
        if api not in APIS:
            raise ValueError(f"api must be one of {APIS}, not {api!r}")
        if not isinstance(doc, dict) or _too_deep(doc):
            return None
    try:
        masked = mask_doc(doc, masks, literals)
    except MaskError:  # a PCRE runtime failure (match limit ...): nginx returns nil, err too
        return None
    canon = canonical_form(api, doc)
    prefix, exact = canon.keys(api)
    fp = Fingerprint(exact, prefix, masked, end_user=_end_user(api, doc))
    turn = final_turn(doc) if api in CHAT_APIS else None
    if debug is not None:
        debug["canonical"] = b"".join(canon.pieces)
        debug["prompt"] = None if turn is None else b"".join(as_bytes(p) for p in turn)
    if turn is None:
        return fp
    sig, ntok, complete = csf_of_prefixes(prefix_of(turn))
    if not complete or ntok == 0:
        return fp
    return Fingerprint(exact, prefix, masked, True, ntok, sig, band_keys(sig), csf_key_of(sig), fp.end_user)
