"""Near-duplicate candidates are checked exactly (zccp.cache.near): the near record in
Redis keeps the candidate's shingle set, and a candidate is served only when the exact
Jaccard of the two final user turns reaches the threshold, whatever the MinHash estimate
said. Records read back from Redis are input: malformed ones are misses, never crashes.
(The live path is in tests/integration/test_cache.py.)"""

from __future__ import annotations

import random
import struct
import zlib
from itertools import pairwise

import numpy as np
import orjson
import pytest

from zccp.abi import MINHASH_COUNT
from zccp.cache.fingerprint import compute
from zccp.cache.fp.csf import mix64, tokenize
from zccp.cache.mask_apply import MaskSet
from zccp.cache.near import (MAX_SHINGLES, RECORD_VERSION, VERIFY_MARGIN, NearRecord, TurnShingles, choose,
                             exact_jaccard, shingle_set, turn_shingles)

THRESHOLD = 0.85
# One of the three false hits of bench/cache_eval (unrelated ShareGPT first turns): six
# CJK tokens against seven. The one extra shingle fell into a MinHash bin whose minimum it
# did not beat, so all 128 values agree (estimate 1.0); the true Jaccard is 5/6.
FALSE_HIT_STORED = "continue\n \n \n \n 지금 번역하기"
FALSE_HIT_QUERY = "&지금 번역하기"
LONG = ("The quarterly report covers revenue growth in the northern region, staffing changes in "
        "the support organisation, the migration of billing to the new platform, and a review "
        "of supplier contracts that expire before the end of the fiscal year. ") * 3


def body(text, **extra) -> bytes:
    return orjson.dumps({"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": text}], **extra})


def near_fp(text, masks=None):
    fp = compute("anthropic", body(text), masks) if masks else compute("anthropic", body(text))
    assert fp is not None and fp.near
    return fp


def record_for(text, shared=False, signature=None) -> NearRecord:
    fp = near_fp(text)
    sh = turn_shingles(orjson.loads(body(text)), None)
    assert sh is not None
    return NearRecord(fp.prefix_key, shared, signature or fp.signature, sh)


def shingles_of(text: bytes) -> set[tuple[bytes, ...]]:
    """The word 2-shingles of fingerprint.md §4 (one token: its 1-shingle), spelled out."""
    toks = tokenize(text)[0]
    return {(toks[0],)} if len(toks) == 1 else set(pairwise(toks))


def hashes_of(text: bytes) -> list[int]:
    """What the engine's set should hold, in plain Python: per shingle, the CRC-32 of its
    tokens joined into 64 bits (one token: its CRC-32 with the top bit set), splitmix64's
    finalizer, the high 32 bits; sorted, unique."""
    def h(s):
        z = (zlib.crc32(s[0]) | 1 << 63) if len(s) == 1 else (zlib.crc32(s[0]) << 32 | zlib.crc32(s[1]))
        return mix64(z) >> 32
    return sorted({h(s) for s in shingles_of(text)})


def own(text) -> TurnShingles:
    return TurnShingles(orjson.loads(body(text)), None)


# ------------------------------------------------------------------------------ the check

def test_a_candidate_the_estimate_accepts_but_the_exact_jaccard_refuses():
    stored, query = near_fp(FALSE_HIT_STORED), near_fp(FALSE_HIT_QUERY)
    assert stored.prefix_key == query.prefix_key
    assert set(stored.bands) & set(query.bands)                 # a candidate: the bands match
    assert query.jaccard(stored) >= THRESHOLD                   # the estimate alone would serve it (1.0)
    rec = record_for(FALSE_HIT_STORED)
    mine = own(FALSE_HIT_QUERY).get()
    assert exact_jaccard(mine, rec.shingles) == pytest.approx(5 / 6)
    v = choose([b"k1", rec.encode()], query.prefix_key, query.signature, THRESHOLD, own(FALSE_HIT_QUERY))
    assert v.key is None and v.reason == "not_similar"


def test_a_near_duplicate_is_served_with_its_exact_similarity():
    edited = LONG.replace("northern", "southern", 1)
    q = near_fp(edited)
    rec = record_for(LONG)
    v = choose([b"k1", rec.encode()], q.prefix_key, q.signature, THRESHOLD, own(edited))
    assert v.key == b"k1" and v.reason == "near" and v.record is not None
    a, b = shingles_of(LONG.encode()), shingles_of(edited.encode())
    assert v.similarity == pytest.approx(len(a & b) / len(a | b)) and THRESHOLD <= v.similarity < 1.0


def test_the_best_exact_candidate_wins_and_an_estimate_just_short_is_still_checked():
    edited = LONG.replace("northern", "southern", 1)
    q = near_fp(edited)
    good = record_for(LONG)
    # the same candidate had its estimate come out at 0.80 (some agreeing values changed):
    # the exact check, not the estimate, decides
    sig = list(good.signature)
    agree = [i for i in range(MINHASH_COUNT) if sig[i] == q.signature[i]]
    changed = agree[:len(agree) - int(0.80 * MINHASH_COUNT)]
    for i in changed:
        sig[i] ^= 0x5A5A5A5A
    short = NearRecord(good.prefix, False, tuple(sig), good.shingles)
    est = sum(a == b for a, b in zip(short.signature, q.signature, strict=True)) / MINHASH_COUNT
    assert THRESHOLD - VERIFY_MARGIN <= est < THRESHOLD
    v = choose([b"short", short.encode()], q.prefix_key, q.signature, THRESHOLD, own(edited))
    assert v.key == b"short" and v.similarity >= THRESHOLD
    # the false-hit candidate (estimate 1.0 against itself) never beats a verified one
    other = record_for(edited + " and one more sentence about nothing at all")
    v = choose([b"other", other.encode(), b"good", good.encode()], q.prefix_key, q.signature, THRESHOLD, own(edited))
    assert v.key in (b"good", b"other") and v.similarity == max(
        exact_jaccard(own(edited).get(), r.shingles) for r in (good, other))


def test_candidates_of_another_prefix_or_far_estimate_never_compute_the_requests_set():
    q = near_fp(LONG)
    other_prefix = NearRecord(b"\x01" * 32, False, q.signature, own(LONG).get())
    t = own(LONG)
    v = choose([b"k", other_prefix.encode()], q.prefix_key, q.signature, THRESHOLD, t)
    assert v.reason == "not_found" and not t._done
    far = record_for("Completely different words about gardening tomatoes in spring " * 4)
    t = own(LONG)
    v = choose([b"k", far.encode()], q.prefix_key, q.signature, THRESHOLD, t)
    assert v.reason == "not_similar" and not t._done       # the estimate ruled it out before any set was made
    # keys without a turn (nothing to check against): never served
    assert choose([b"k", record_for(LONG).encode()], q.prefix_key, q.signature, THRESHOLD, None).key is None


# ------------------------------------------------------------------------------ the sets

def test_the_set_is_what_the_minhash_read_after_masking():
    masks = MaskSet.from_patterns([{"name": "email", "pattern": r"[a-z]+@[a-z]+\.[a-z]+", "replacement": "<email>"}])
    text = "Write to ann@north.com about the invoice that is overdue since last week"
    doc = orjson.loads(body(text))
    sh = turn_shingles(doc, masks)
    assert doc["messages"][0]["content"] == text             # the request itself is not changed
    masked = text.replace("ann@north.com", "<email>").encode()
    assert sh.tolist() == hashes_of(masked)
    assert len(sh) == len(shingles_of(masked))          # no two shingles share a hash here
    fp = compute("anthropic", body(text), masks)
    assert fp.masked and fp.jaccard(compute("anthropic", body(masked.decode()))) == 1.0
    # a doc the engine already masked (compute() masks in place) is read as it is
    doc2 = orjson.loads(body(text))
    compute("anthropic", None, masks, doc=doc2)
    assert turn_shingles(doc2, None).tolist() == sh.tolist()


@pytest.mark.parametrize("content", [
    [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}],
    "x" * 0, "word " * 1100,            # no tokens; more than the 1024 the fingerprint reads
])
def test_turns_without_near_hits_have_no_set(content):
    assert turn_shingles({"messages": [{"role": "user", "content": content}]}, None) is None
    assert turn_shingles({"messages": []}, None) is None
    assert turn_shingles({"messages": [{"role": "assistant", "content": "hi there"}]}, None) is None


def test_exact_jaccard_matches_python_sets():
    rnd = random.Random(7)
    for _ in range(200):
        a = {rnd.randrange(1 << 32) for _ in range(rnd.randrange(1, 300))}
        b = set(rnd.sample(sorted(a),
                           rnd.randrange(0,
                                         len(a) + 1))) | {rnd.randrange(1 << 32) for _ in range(rnd.randrange(0, 50))}
        want = len(a & b) / len(a | b) if b else 0.0
        sa = np.array(sorted(a), dtype=np.uint32)
        sb = np.array(sorted(b), dtype=np.uint32)
        assert exact_jaccard(sa, sb) == pytest.approx(want)
    assert exact_jaccard(np.array([1, 2], dtype=np.uint32), np.array([1, 2], dtype=np.uint32)) == 1.0
    assert exact_jaccard(np.array([0xFFFFFFFF], dtype=np.uint32), np.array([0], dtype=np.uint32)) == 0.0


def test_the_shingle_set_of_a_text():
    assert turn_shingles({"messages": [{"role": "user", "content": "Hello!"}]}, None).tolist() == hashes_of(b"hello")
    got = turn_shingles({"messages": [{"role": "user", "content": "a b, A B c"}]}, None)   # "a b" twice: one member
    assert got.tolist() == hashes_of(b"a b a b c") and len(got) == 3
    assert got.dtype == np.uint32 and shingle_set([]).size == 0
    assert shingle_set([b"a"]).tolist() != shingle_set([b"a", b"a"]).tolist()   # "a" is not "a a"


@pytest.mark.parametrize("text", [
    FALSE_HIT_STORED, FALSE_HIT_QUERY, LONG, "Ünïcödé wörds, ÉTÉ été — 東京タワー and ASCII", "x",
    "Straße İstanbul ΣΊΣΥΦΟΣ café", "bad \udcff\udcfe bytes in words\udc80x",
    "a" * 5000 + " " + "word " * 1020,
])
def test_the_set_is_the_fingerprints_own_tokenization(text):
    # the shingles of tokenize() (the MinHash's input) spelled out, against the engine's fast path
    raw = text.encode("utf-8", "surrogateescape")
    toks, complete = tokenize(raw)
    sh = turn_shingles({"messages": [{"role": "user", "content": text}]}, None)
    if not complete:
        assert sh is None
        return
    assert sh.tolist() == hashes_of(raw)


# ------------------------------------------------------------------------------ records

def test_record_round_trip():
    rec = record_for(LONG, shared=True)
    got = NearRecord.decode(rec.encode())
    assert got is not None and got.prefix == rec.prefix and got.shared_entry and got.signature == rec.signature
    assert got.shingles.tolist() == rec.shingles.tolist() and got.shingles.dtype == np.uint32
    assert NearRecord.decode(bytearray(rec.encode())) is not None


def _raw(version=RECORD_VERSION, where=0, hashes=(1, 2, 3), n=None, tail=b""):
    hashes = list(hashes)
    head = struct.pack(f"<B32sB{MINHASH_COUNT}IH", version, b"p" * 32, where, *range(MINHASH_COUNT),
                       len(hashes) if n is None else n)
    return head + struct.pack(f"<{len(hashes)}I", *hashes) + tail


@pytest.mark.parametrize("raw", [
    None, 5, "text", b"", b"x" * 10,
    b"p" * 32 + b"\x00" + b"\x01" * (4 * MINHASH_COUNT),     # a record of the version before (no shingles)
    _raw(version=1), _raw(version=3), _raw(where=2),
    _raw(hashes=()), _raw(n=4), _raw(n=2), _raw(tail=b"\x00"),
    _raw(hashes=(3, 2, 1)), _raw(hashes=(1, 1, 2)),           # not strictly increasing
    _raw(hashes=range(MAX_SHINGLES + 1)),                      # more than the fingerprint reads
])
def test_malformed_records_are_misses(raw):
    assert NearRecord.decode(raw) is None
    q = near_fp(LONG)
    assert choose([b"k", raw], q.prefix_key, q.signature, THRESHOLD, own(LONG)).key is None


def test_valid_edges_decode():
    assert NearRecord.decode(_raw(hashes=(7,))) is not None
    assert NearRecord.decode(_raw(hashes=range(MAX_SHINGLES))) is not None


def test_a_failure_making_the_set_costs_the_near_hit_not_the_request():
    class Broken(dict):
        def get(self, *a):
            raise RuntimeError("boom")
    t = TurnShingles(Broken(), None)
    assert t.get() is None and t.get() is None             # computed once, None thereafter
    assert TurnShingles(None, None).get() is None           # no decoded body: nothing to check
