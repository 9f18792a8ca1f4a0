"""The local model of the gateway's cache decision that bench.cache_eval checks the live answers
against: the threshold, what counts as a hit, which pairs must hit, what the design predicts."""

from __future__ import annotations

import math

# fingerprint version 2's engine checked candidates this far below the threshold (this
# module models that rule; the meaning rule is bench/cache_eval/meaning.py's)
VERIFY_MARGIN = 0.10

THRESHOLD = 0.85
NUM_PERM = 128


def is_hit(cache: str) -> bool:
    return cache in ("HIT", "NEAR")


def wanted(p: dict) -> bool | None:
    """True: a hit is wanted; False: a hit is wrong; None: no target (near category, J < 0.85)."""
    if p["expect"] == "never":
        return False
    if p["jaccard"] >= THRESHOLD:
        return True
    return None


def predicted(p: dict) -> str:
    """What the engine should answer by the design (docs/fingerprint.md, docs/cache.md, scope
    `tenant`), from the fingerprints computed here in Python: exact key equal, and the same
    tenant unless nothing was masked -> HIT; else the same prefix key and tenant, both final
    turns near-able, >= 1 shared LSH band, a MinHash estimate >= threshold - VERIFY_MARGIN
    and an exact Jaccard of the shingle-hash sets >= threshold -> NEAR (results from before
    the exact check, without `verified_j`: estimate >= threshold)."""
    tenant_ok = p.get("same_tenant", True)
    if p["same_exact_key"] and (tenant_ok or not p.get("masked")):
        return "HIT"
    if not (p["same_scope"] and tenant_ok and p["complete"] and p["shared_band"]):
        return "MISS"
    if "verified_j" not in p:
        return "NEAR" if p["est"] >= THRESHOLD - 1e-9 else "MISS"
    ok = p["est"] >= THRESHOLD - VERIFY_MARGIN - 1e-9 and p["verified_j"] >= THRESHOLD - 1e-9
    return "NEAR" if ok else "MISS"


def p_near(j: float) -> float:
    """P(MinHash estimate >= threshold) for true Jaccard j, 128 independent slots."""
    need = math.ceil(THRESHOLD * NUM_PERM - 1e-9)
    return sum(math.comb(NUM_PERM, k) * j ** k * (1 - j) ** (NUM_PERM - k) for k in range(need, NUM_PERM + 1))
