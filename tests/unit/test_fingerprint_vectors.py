"""zccp.cache.fingerprint and zccp.cache.fp (Python only) against the golden vectors
(shm_abi/vectors/fingerprint_vectors.json), which are current. Lua is checked against the
same vectors through nginx in tests/integration/test_fingerprint_identity.py."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from tests.support.fingerprint_vectors import sig_values, vec_body, vec_text

from zccp.cache.fingerprint import compute
from zccp.cache.fp import canonical, tables
from zccp.cache.fp import csf as F
from zccp.cache.mask_apply import MaskSet

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO / "shm_abi" / "vectors" / "fingerprint_vectors.json"


@pytest.fixture(scope="module")
def vectors() -> dict:
    return json.loads(VECTORS.read_text())


@pytest.fixture(scope="module")
def vmasks(vectors) -> MaskSet:
    return MaskSet.from_patterns([(m["name"], m["pattern"], m["replacement"]) for m in vectors["masks"]])


def test_vector_params(vectors):
    p = vectors["params"]
    assert (p["max_tokens"], p["num_perm"], p["bands"], p["rows"], p["decode_limit"]) == (1024, 128, 16, 8, 65536)
    assert vectors["version"] == tables.VERSION == 3
    assert p["seed"] == "%016x" % F.SEED == "5a43435046503032"
    assert [bytes.fromhex(r) for r in p["probe_hex"]] == [bytes(r) for r in F.PROBE]
    assert all(sorted(r) == list(range(128)) for r in F.PROBE)      # each row a permutation of the bins
    for m in p["mix64"]:
        assert "%016x" % F.mix64(int(m["x"], 16)) == m["mix"]


def test_vector_fnv(vectors):
    for v in vectors["fnv"]:
        d = bytes.fromhex(v["data_hex"])
        assert "%08x" % F.fnv1a32(d) == v["fnv1a32"] and "%016x" % F.fnv1a64(d) == v["fnv1a64"]
    # the published FNV-1a test values
    assert F.fnv1a32(b"") == 0x811C9DC5 and F.fnv1a32(b"a") == 0xE40C292C and F.fnv1a32(b"foobar") == 0xBF9CF968
    assert F.fnv1a64(b"a") == 0xAF63DC4C8601EC8C and F.fnv1a64(b"foobar") == 0x85944171F73967E8


def test_vector_requests(vectors, vmasks):
    assert len(vectors["requests"]) >= 30
    for v in vectors["requests"]:
        fp = compute(v["api"], vec_body(v), vmasks)
        e = v["fingerprint"]
        if e is None:
            assert fp is None, v["name"]
            continue
        assert fp is not None, v["name"]
        near = fp.near
        got = {"exact_key": fp.exact_key.hex(), "prefix_key": fp.prefix_key.hex(), "masked": fp.masked,
               "near": near, "tokens": fp.tokens, "end_user": fp.end_user,
               "csf_key": "%016x" % fp.csf_key if near else None,
               "bands": ["%016x" % b for b in fp.bands] if near else None,
               "signature_hex": "".join("%08x" % s for s in fp.signature) if near else None}
        assert got == e, v["name"]
        if v["canonical_b64"] is not None:
            dbg: dict = {}
            compute(v["api"], vec_body(v), vmasks, debug=dbg)
            assert dbg["canonical"] == base64.b64decode(v["canonical_b64"]), v["name"]
            want = base64.b64decode(v["prompt_b64"]) if v["prompt_b64"] is not None else None
            assert dbg["prompt"] == want, v["name"]


def test_vector_tokenize(vectors):
    for t in vectors["tokenize"]:
        text = vec_text(t)
        toks, complete = F.tokenize(text)
        assert len(toks) == t["tokens"] and complete == t["complete"], t["name"]
        if t["tokens_hex"] is not None:
            assert [x.hex() for x in toks] == t["tokens_hex"], t["name"]
        assert F.shingle_hashes(toks)[:8] == t["shingles"], t["name"]
        sig, _, _ = F.csf_signature(text)
        assert "%016x" % F.csf_key_of(sig) == t["csf_key"], t["name"]


def test_vector_numbers_and_hashes(vectors):
    for n in vectors["numbers"]:
        v = float(n["literal"]) if "e400" in n["literal"] else json.loads(n["literal"])
        assert canonical.canonical_number(v).decode() == n["canonical"], n["literal"]
    for m in vectors["minhash"]:
        assert list(F.minhash(m["xs"])) == sig_values(m["signature_hex"])


def test_vector_masks(vectors, vmasks):
    for c in vectors["mask_cases"]:
        out, changed = vmasks.apply_changed(bytes.fromhex(c["text_hex"]))
        assert (out.hex(), changed) == (c["masked_hex"], c["changed"])


def test_vectors_file_is_current():
    """The checked-in vectors are what the generator writes now (regenerate on purpose)."""
    from tests.vectors.make_fingerprint_vectors import build

    assert json.dumps(build(), indent=1, ensure_ascii=True) + "\n" == VECTORS.read_text()
