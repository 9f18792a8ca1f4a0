"""True Jaccard of two requests: word 2-shingle SETS after masking, with the fingerprint's
own masks, final-turn rule and tokenizer (docs/fingerprint.md §2-§4), over the WHOLE text
(no 1024-token window).

What is compared (fingerprint version 2): the final user turns, when both requests end on a
text-only user turn; otherwise the whole conversations as version 1 read them (`role: text`
per message, non-text blocks as `[type]`), which shows how alike such requests look to a
fingerprint that ignores block content."""

from __future__ import annotations

import copy
from functools import lru_cache
from itertools import pairwise

from zccp.cache.fp.canonical import as_bytes
from zccp.cache.fp.csf import MAX_TOKENS, minhash, shingle_hashes, tokenize
from zccp.cache.fp.prompt import final_turn
from zccp.cache.mask_apply import MaskSet, mask_doc
from zccp.cache.mask_store import load_masks

_UNLIMITED = 1 << 30


@lru_cache(maxsize=1)
def masks() -> MaskSet:
    return load_masks()


def _masked(body: dict) -> dict:
    doc = {k: copy.deepcopy(body[k]) for k in ("system", "messages") if body.get(k) is not None}
    mask_doc(doc, masks())
    return doc


def masked_turn(body: dict) -> bytes | None:
    """The masked text of the final user turn (what the CSF reads), or None (exact-only)."""
    turn = final_turn(_masked(body))
    return None if turn is None else b"".join(as_bytes(p) for p in turn)


def _v1_text(content) -> bytes:
    if isinstance(content, (str, bytes)):
        return as_bytes(content)
    if isinstance(content, list):
        return b"\n".join(as_bytes(b["text"]) if isinstance(b, dict) and b.get("type") == "text"
                          and isinstance(b.get("text"), (str, bytes))
                          else b"[" + as_bytes(str(b.get("type", "?")) if isinstance(b, dict) else "?") + b"]"
                          for b in content)
    return b"" if content is None else b"[?]"


def conversation_text(api: str, body: dict) -> bytes:
    """The whole masked conversation as fingerprint version 1 read it (for comparison only)."""
    doc = _masked(body)
    out = []
    if api == "anthropic" and doc.get("system") is not None:
        out.append(b"system: " + _v1_text(doc["system"]) + b"\n")
    for m in doc.get("messages") or []:
        out.append(as_bytes(m.get("role", "?")) + b": " + _v1_text(m.get("content")) + b"\n")
    return b"".join(out)


def tokens_of(text: bytes) -> list[bytes]:
    return tokenize(text, _UNLIMITED)[0]


def shingles(tokens: list[bytes]) -> frozenset:
    """Word 2-shingles as token pairs; one token: its 1-shingle; none: empty."""
    if len(tokens) == 1:
        return frozenset([(tokens[0],)])
    return frozenset(pairwise(tokens))


def jaccard(a: frozenset, b: frozenset) -> float:
    if not a and not b:
        return 1.0
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)


def signature(tokens: list[bytes]) -> tuple[int, ...]:
    """The fingerprint's MinHash over the first 1024 tokens (used only to find duplicates in the pool)."""
    return minhash(shingle_hashes(tokens[:MAX_TOKENS]))


def text_tokens(text: str) -> list[bytes]:
    """Tokens of one user message's masked text."""
    return tokens_of(masked_turn({"messages": [{"role": "user", "content": text}]}) or b"")


def pair_jaccard(api_a: str, body_a: dict, api_b: str, body_b: dict) -> tuple[float, int, int, str]:
    """(true Jaccard, tokens of a, tokens of b, what was compared: "turn" or "conversation")."""
    ta, tb = masked_turn(body_a), masked_turn(body_b)
    what = "turn"
    if ta is None or tb is None:
        ta, tb, what = conversation_text(api_a, body_a), conversation_text(api_b, body_b), "conversation"
    xa, xb = tokens_of(ta), tokens_of(tb)
    return jaccard(shingles(xa), shingles(xb)), len(xa), len(xb), what
