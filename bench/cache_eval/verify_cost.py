"""What the exact check of a near candidate costs the engine (zccp.cache.near), in-process.

Per edit base (ShareGPT first turns, stratified by length), each step timed REPEAT times
in a row and the median kept, then the median over the bases of a length stratum:

* `own set`: the request's own shingle set (mask a copy of the final turn, tokenize,
  hash, sort): once per lookup that has a candidate to check, and once per store;
* `decode`: one candidate's near record read back (validated);
* `exact J`: one candidate's exact Jaccard against the request's set;
* `estimate`: the MinHash estimate, what a candidate cost before (for comparison);
* `encode`: the record written by a store;
* `record bytes`: the record's size in Redis (before: 545 bytes for every request).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import orjson

from zccp.cache.fingerprint import compute
from zccp.cache.fp.csf import estimate_jaccard
from zccp.cache.near import NearRecord, exact_jaccard, turn_shingles

from bench.cache_eval.jaccard import masks
from bench.cache_eval.pairs import anth
from bench.cache_eval.prompts import STRATA, Base

REPEAT = 25


def _median_us(fn: Callable[[], object]) -> float:
    ts = []
    for _ in range(REPEAT):
        t0 = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t0)
    return statistics.median(ts) / 1000


def _one(text: str) -> dict | None:
    raw = orjson.dumps(anth(text, 16))
    edited = orjson.dumps(anth(text + " Thanks.", 16))
    fp = compute("anthropic", raw, masks())
    if fp is None or not fp.near:
        return None
    doc, doc2 = orjson.loads(raw), orjson.loads(edited)
    mine = turn_shingles(doc2, masks())
    theirs = turn_shingles(doc, masks())
    if mine is None or theirs is None:
        return None
    rec = NearRecord(fp.prefix_key, False, fp.signature, theirs)
    enc = rec.encode()
    sig2 = compute("anthropic", edited, masks()).signature
    return {
        "tokens": fp.tokens,
        "own_set_us": _median_us(lambda: turn_shingles(doc2, masks())),
        "decode_us": _median_us(lambda: NearRecord.decode(enc)),
        "exact_us": _median_us(lambda: exact_jaccard(mine, rec.shingles)),
        "estimate_us": _median_us(lambda: estimate_jaccard(fp.signature, sig2)),
        "encode_us": _median_us(lambda: rec.encode()),
        "record_bytes": len(enc),
    }


def measure(bases: list[Base]) -> list[dict]:
    """One row per length stratum: medians over its bases."""
    rows = []
    for lo, hi in STRATA:
        got = [r for r in (_one(b.text) for b in bases if lo <= b.ntok <= hi) if r is not None]
        if not got:
            continue
        row: dict = {"stratum": f"{lo}-{hi}", "bases": len(got)}
        for k in ("tokens", "own_set_us", "decode_us", "exact_us", "estimate_us", "encode_us", "record_bytes"):
            row[k] = round(statistics.median(r[k] for r in got), 2)
        rows.append(row)
    return rows
