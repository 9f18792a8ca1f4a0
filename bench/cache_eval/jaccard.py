"""True Jaccard of two prompts: word 2-shingle SETS of the masked prompt text, with the
fingerprint's own masks, prompt-text rules and tokenizer (docs/fingerprint.md §2-§4),
over the WHOLE prompt (no 1024-token window)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from zccp.fingerprint import MAX_TOKENS, minhash, prompt_text, shingle_hashes, tokenize
from zccp.masks import MaskSet, load_masks

_UNLIMITED = 1 << 30


@lru_cache(maxsize=1)
def masks() -> MaskSet:
    return load_masks()


def _mask_value(v: Any, m: MaskSet) -> Any:
    """Masks every string that is the value of a `content`/`text` member (as fingerprint.py does)."""
    if isinstance(v, dict):
        return {k: (m.apply(x.encode("utf-8", "surrogateescape")) if isinstance(x, str) and k in ("content", "text")
                    else _mask_value(x, m)) for k, x in v.items()}
    if isinstance(v, list):
        return [_mask_value(x, m) for x in v]
    return v


def masked_prompt(api: str, body: dict) -> bytes:
    """The masked prompt text the CSF reads (`role: text\\n` per entry), for a decoded body."""
    m = masks()
    doc = {"messages": _mask_value(body.get("messages"), m)}
    system = body.get("system")
    if isinstance(system, str):
        doc["system"] = m.apply(system.encode("utf-8", "surrogateescape"))
    elif system is not None:
        doc["system"] = _mask_value(system, m)
    return prompt_text(api, doc)


def tokens_of(prompt: bytes) -> list[bytes]:
    return tokenize(prompt, _UNLIMITED)[0]


def shingles(tokens: list[bytes]) -> frozenset:
    """Word 2-shingles as token pairs; one token: its 1-shingle; none: empty."""
    if len(tokens) == 1:
        return frozenset([(tokens[0],)])
    return frozenset(zip(tokens, tokens[1:]))


def jaccard(a: frozenset, b: frozenset) -> float:
    if not a and not b:
        return 1.0
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)


def signature(tokens: list[bytes]) -> tuple[int, ...]:
    """The fingerprint's MinHash over the first 1024 tokens (used only to find duplicates in the pool)."""
    return minhash(shingle_hashes(tokens[:MAX_TOKENS]))


def pair_jaccard(api_a: str, body_a: dict, api_b: str, body_b: dict) -> tuple[float, int, int]:
    """(true Jaccard, tokens of a, tokens of b)."""
    ta, tb = tokens_of(masked_prompt(api_a, body_a)), tokens_of(masked_prompt(api_b, body_b))
    return jaccard(shingles(ta), shingles(tb)), len(ta), len(tb)
