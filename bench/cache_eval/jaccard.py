"""True Jaccard of two prompts: word 2-shingle SETS of the masked prompt text, with the
fingerprint's own masks, prompt-text rules and tokenizer (docs/fingerprint.md §2-§4),
over the WHOLE prompt (no 1024-token window)."""

from __future__ import annotations

import copy
from functools import lru_cache

from zccp.cache.fp.csf import MAX_TOKENS, minhash, shingle_hashes, tokenize
from zccp.cache.fp.prompt import prompt_text
from zccp.cache.masks import MaskSet, load_masks, mask_doc

_UNLIMITED = 1 << 30


@lru_cache(maxsize=1)
def masks() -> MaskSet:
    return load_masks()


def masked_prompt(api: str, body: dict) -> bytes:
    """The masked prompt text the CSF reads (`role: text\\n` per entry), for a decoded body."""
    doc = {k: copy.deepcopy(body[k]) for k in ("system", "messages") if body.get(k) is not None}
    mask_doc(doc, masks())
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
