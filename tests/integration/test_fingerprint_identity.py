"""Lua (through a real nginx) vs Python: fingerprints, exact keys, masks, numbers.

Starts its own small nginx (Debian nginx + libnginx-mod-http-lua; tests/support/fp_nginx.py) with
the test-only locations of tests/support/nginx/fp_test.conf, sends a generated corpus of > 1,000
requests (tests/support/fp_corpus.py; batched, keepalive) through lua/zccp/fp/fingerprint.lua
and compares every key, band
and signature with engine/zccp/cache/fingerprint.py. Also checks the golden vectors in Lua,
and the mask reload behaviour (a broken edit keeps the previous good pattern).
"""

from __future__ import annotations

import json
import random
import shutil

from tests.support.fp_corpus import MARK, agent_corpus, corpus, encode, rand_maskable, rand_request, rand_text
from tests.support.fingerprint_vectors import sig_values, vec_body, vec_text
from tests.support.fp_nginx import (
    BIG_NUMBER_NIL,
    EXACT,
    MASKED,
    NEAR,
    REPO,
    TOKENS,
    FpNginx,
    compare,
    lua_compute,
    py_line,
    records,
    write_patterns,
)
from zccp.cache import fingerprint as F
from zccp.cache.fp import csf
from zccp.cache.fp.canonical import canonical_number
from zccp.cache.mask_apply import MaskSet
from zccp.cache.mask_store import load_masks


def test_golden_vectors_in_lua(ngx, vectors):
    """Every request vector through nginx gives exactly the recorded fingerprint."""
    items = [(v["api"], vec_body(v)) for v in vectors["requests"]]
    lua = lua_compute(ngx, items, limit=1 << 24)
    for v, line in zip(vectors["requests"], lua, strict=True):
        e = v["fingerprint"]
        if v.get("nginx_nil"):
            assert line == "NIL " + v["nginx_nil"], (v["name"], line)   # the engine's to fingerprint
            continue
        if e is None:
            assert line.startswith("NIL "), (v["name"], line)
            continue
        near = e["near"]
        want = " ".join(["OK", e["exact_key"], e["prefix_key"], "1" if e["masked"] else "0", "1" if near else "0",
                         str(e["tokens"]), e["csf_key"] if near else "-", ",".join(e["bands"]) if near else "-",
                         ",".join(str(x) for x in sig_values(e["signature_hex"])) if near else "-"])
        assert line == want, v["name"]
    # the CSF of bare texts
    texts = [vec_text(t) for t in vectors["tokenize"]]
    got = ngx.post("/_fp/csf", records(texts, lambda t: ("t", t))).decode().split("\n")[:-1]
    for t, line in zip(vectors["tokenize"], got, strict=True):
        assert line == f'{t["csf_key"]} {t["tokens"]} {1 if t["complete"] else 0}', t["name"]
    # one-permutation MinHash of given shingle hash sets
    ms = vectors["minhash"]
    got = ngx.post("/_fp/minhash", records(ms, lambda m: ("x", ",".join(map(str, m["xs"])).encode())))
    for m, line in zip(ms, got.decode().split("\n")[:-1], strict=True):
        assert [int(v) for v in line.split(",")] == sig_values(m["signature_hex"]), m["xs"][:4]
    # numbers
    nums = vectors["numbers"]
    got = ngx.post("/_fp/number", "\n".join(n["literal"] for n in nums).encode()).decode().split("\n")[:-1]
    assert got == [n["double"] for n in nums]
    # masks
    mc = vectors["mask_cases"]
    got = ngx.post("/_fp/mask", records(mc, lambda c: ("m", bytes.fromhex(c["text_hex"])))).decode().split("\n")[:-1]
    for c, line in zip(mc, got, strict=True):
        assert line == f'{1 if c["changed"] else 0} {c["masked_hex"]}', c["text_hex"]


def test_corpus_identity(ngx, masks):
    items = corpus()
    assert len(items) >= 1000
    lua = []
    for i in range(0, len(items), 200):
        lua += compare(ngx, masks, items[i:i + 200])
    ok = [line.split(" ") for line in lua if line.startswith("OK ")]
    near = sum(1 for f in ok if f[NEAR] == "1")
    masked = sum(1 for f in ok if f[MASKED] == "1")
    # both outcomes of every rule are exercised: near and exact-only, masked, long turns cut
    big = sum(1 for line in lua if line == "NIL " + BIG_NUMBER_NIL)     # the engine's to fingerprint
    # ... and bodies holding a number beyond 2^53
    assert big >= 10 and len(ok) + big >= 1000, (len(ok), big)
    assert near >= 150 and len(ok) - near >= 500 and masked >= 100, (len(ok), near, masked)
    agent = [line.split(" ") for line in compare(ngx, masks, agent_corpus()) if line.startswith("OK ")]
    assert len(agent) >= 300 and sum(1 for f in agent if f[NEAR] == "1") >= 50


def test_equivalent_spellings_share_keys(ngx, masks):
    base = {"model": "m", "max_tokens": 100, "temperature": 0.7,
            "messages": [{"role": "user", "content": "héllo wörld 你好 😀"}]}
    a = json.dumps(base).encode()
    variants = [
        a,
        json.dumps(base, ensure_ascii=False, indent=1).encode(),
        a.replace(b"0.7", b"0.70"), a.replace(b"0.7", b"7e-1"), a.replace(b"0.7", b"7.0E-1"),
        a.replace(b"100", b"100.0"), a.replace(b"100", b"1e2"),
        json.dumps({**base, "stream": True, "metadata": {"user_id": "u"}}).encode(),
        json.dumps(dict(reversed(list(base.items())))).encode(),
    ]
    lines = lua_compute(ngx, [("anthropic", v) for v in variants])
    assert len({line.split(" ")[EXACT] for line in lines}) == 1, lines
    assert len({py_line(F.compute("anthropic", v, masks)) for v in variants}) == 1
    # OpenAI: max_tokens and max_completion_tokens are one parameter
    o = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    ov = [json.dumps({**o, "max_tokens": 9}).encode(), json.dumps({**o, "max_completion_tokens": 9}).encode()]
    lines = lua_compute(ngx, [("openai", v) for v in ov])
    assert lines[0] == lines[1] == py_line(F.compute("openai", ov[0], masks))
    # ... while a different temperature / model / api is a different exact key
    others = [a.replace(b"0.7", b"0.8"), a.replace(b'"m"', b'"n"')]
    lines2 = lua_compute(ngx, [("anthropic", v) for v in others] + [("openai", a)])
    assert len({line.split(" ")[EXACT] for line in lines2} | {lines[0].split(" ")[EXACT]}) == 4


def test_large_bodies_match_when_decoded(ngx, masks):
    """Above the decode limit nginx answers nil; the engine's Python fingerprint equals what
    nginx computes when told to decode anyway."""
    r = random.Random(7)
    items = []
    for i in range(12):
        api = ("anthropic", "openai")[i % 2]
        items.append((api, encode(r, rand_request(r, api, "huge", invalid=(i % 3 == 0)))))
    assert all(len(b) > F.DECODE_LIMIT for _, b in items)
    lines = lua_compute(ngx, items)
    assert all(line == "NIL body too large to fingerprint" for line in lines)
    lines = compare(ngx, masks, items, limit=1 << 24)
    assert all(line.startswith("OK ") or line == "NIL " + BIG_NUMBER_NIL for line in lines)
    assert sum(line.startswith("OK ") for line in lines) >= 6
    assert any(line.split(" ")[NEAR] == "0" and line.split(" ")[TOKENS] == "0" for line in lines)


def test_minhash_random(ngx):
    """One-permutation MinHash with densification in LuaJIT (uint64 cdata) equals Python's,
    numpy and pure-Python paths alike, from one shingle to more than the bins."""
    r = random.Random(3)
    sets = [[x] for x in (0, 1, 2, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFF)]
    sets += [[r.getrandbits(32) for _ in range(r.choice([1, 2, 3, 5, 8, 20, 33, 64, 127, 128, 200, 500, 1023]))]
             for _ in range(400)]
    sets += [[7, 7, 7], [5, 9, 5, 9]]
    got = ngx.post("/_fp/minhash", records(sets, lambda s: ("x", ",".join(map(str, s)).encode()))).decode()
    for s_, line in zip(sets, got.split("\n")[:-1], strict=True):
        assert tuple(int(v) for v in line.split(",")) == csf.minhash(s_), s_[:4]
        if csf._np is not None:
            assert csf._bins_np(s_) == csf._bins_py(s_)


def test_numbers_random(ngx):
    r = random.Random(11)
    vals = [0.7, 0.1 + 0.2, 1.0, 100.0, 1e21, 1e22, 1e-7, 5e-324, 1.7976931348623157e308, 2.0**53, 2.0**53 + 2,
            123456789012345680.0, 0.5, -0.0, -1.5, 1e15, 1e16, 1e17, 9007199254740993.0]
    vals += [r.uniform(-1e6, 1e6) for _ in range(500)] + [r.random() for _ in range(500)]
    vals += [float(r.randint(-10**18, 10**18)) for _ in range(200)]
    vals += [r.uniform(0, 1) * 10.0**r.randint(-300, 300) for _ in range(500)]
    vals += [round(r.uniform(0, 2), r.randint(0, 6)) for _ in range(300)]
    lits = [repr(v) for v in vals]
    got = ngx.post("/_fp/number", "\n".join(lits).encode()).decode().split("\n")[:-1]
    want = [canonical_number(v).decode() for v in vals]
    assert got == want


# --------------------------------------------------------------------------- masks in nginx

def mask_through(ngx: FpNginx, texts: list[bytes]) -> list[tuple[bool, bytes]]:
    out = ngx.post("/_fp/mask", records(texts, lambda t: ("m", t))).decode().split("\n")[:-1]
    res = []
    for line in out:
        assert not line.startswith("ERR"), line
        changed, _, hx = line.partition(" ")
        res.append((changed == "1", bytes.fromhex(hx)))
    return res


def test_masks_identity_default_patterns(ngx, masks):
    r = random.Random(5)
    texts = [rand_text(r, r.randint(1, 60), invalid=True).replace(MARK, "\udcff").encode("utf-8", "surrogateescape")
             for _ in range(400)]
    texts += [rand_maskable(r).encode() for _ in range(200)]
    texts += [b"", b"x", b"P123456789", b"patient_id: P123456789.", b"a@b.cd", b"2024-05-01T12:30:00Z",
              b"123e4567-e89b-12d3-a456-426614174000", b"1700000000", b"1700000000123", b"12345678901234567890"]
    got = mask_through(ngx, texts)
    for t, (changed, out) in zip(texts, got, strict=True):
        pout, pchanged = masks.apply_changed(t)
        assert (pchanged, pout) == (changed, out), t


TEMPLATE_CASES = [
    ("groups", rb"(\w+)@(\w+)\.com", b"${2}:$1 [$0] $$ $9"),
    ("empty_matches", rb"x*", b"-"),
    ("alternation_empty", rb"a|", b"<$0>"),
    ("lookbehind", rb"(?<=id=)\d+", b"#"),
    ("caseless_inline", rb"(?i)secret", b"***"),
    ("multidigit_group", rb"(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)(k)(l)", b"$12|${12}|$1a"),
    ("unset_group", rb"(b)(x)?", b"[$2]"),
    ("bytes", rb"[\x80-\xff]+", b"?"),
    ("anchors", rb"^\s+|\s+$", b""),
]


def test_masks_identity_custom_patterns(tmp_path):
    patterns = tmp_path / "p.lua"
    write_patterns(patterns, TEMPLATE_CASES)
    srv = FpNginx(tmp_path / "ngx", patterns, tmp_path / "lg.lua")
    srv.start()
    try:
        info = srv.get_json("/_fp/masks")
        assert info["errors"] == [] and info["names"] == [n for n, _, _ in TEMPLATE_CASES]
        ms = load_masks(patterns, tmp_path / "lg.lua")
        assert info["digest"] == ms.digest and not ms.errors
        texts = [b"mail bob@example.com and eve@corp.com now", b"xaxbx", b"aaa", b"id=42 id=x id=7",
                 b"SeCrEt secret", b"abcdefghijklmn", b"abc", b"caf\xc3\xa9 \xff\xfe ok", b"  padded  ", b"",
                 b"x" * 1000, b"\x00\x01 id=1\n"]
        got = mask_through(srv, texts)
        for t, g in zip(texts, got, strict=True):
            pout, pchanged = ms.apply_changed(t)
            assert (pchanged, pout) == g, t
        # the patterns chain (each applies to the previous one's output); the first alone:
        one = MaskSet.from_patterns([TEMPLATE_CASES[0]])
        assert one.apply(texts[0]) == b"mail example:bob [bob@example.com] $  and corp:eve [eve@corp.com] $  now"
    finally:
        srv.stop()


def test_masks_reload_keeps_previous_good(tmp_path):
    """A broken edit + nginx -s reload: the error is reported by name, the previous version
    of that pattern stays in force, the other (new) patterns apply; Python agrees."""
    patterns = tmp_path / "mask_patterns.lua"
    shutil.copy(REPO / "lua" / "zccp" / "mask_patterns.lua", patterns)
    last_good = tmp_path / "mask_patterns.last_good.lua"
    srv = FpNginx(tmp_path / "ngx", patterns, last_good)
    srv.start()
    try:
        before = srv.get_json("/_fp/masks")
        assert before["errors"] == []
        assert last_good.exists()
        assert load_masks(patterns, last_good).digest == before["digest"]
        # a broken email pattern, a new working pattern, and a broken brand-new one
        src = patterns.read_bytes()
        assert rb"(?:\.[A-Za-z0-9-]+)*" in src
        src = src.replace(rb"(?:\.[A-Za-z0-9-]+)*", rb"(?:\.[A-Za-z0-9-]+*", 1)  # unbalanced (
        src = src.replace(b"return {", b'return {\n    { name = "token", pattern = [[sk-[a-z0-9]{8,}]], '
                                       b'replacement = "<token>" },\n    { name = "broken_new", '
                                       b'pattern = [[(unclosed]], replacement = "x" },', 1)
        patterns.write_bytes(src)
        srv.reload()
        after = srv.get_json("/_fp/masks")
        assert after["pid"] != before["pid"], srv.log_tail()
        assert sorted(e["name"] for e in after["errors"]) == ["broken_new", "email"]
        assert after["names"][:2] == ["token", "uuid"] and "email" in after["names"]
        assert "broken_new" not in after["names"]
        assert 'pattern "email" rejected' in (tmp_path / "ngx" / "logs" / "error.log").read_text()
        text = b"mail me at a.b@example.com with key sk-abcdef123456 id 123e4567-e89b-12d3-a456-426614174000"
        [(changed, out)] = mask_through(srv, [text])
        assert changed and out == b"mail me at <email> with key <token> id <uuid>"
        ms = load_masks(patterns, last_good)
        assert sorted(n for n, _ in ms.errors) == ["broken_new", "email"]
        assert ms.digest == after["digest"]
        assert ms.apply(text) == out
        # a second reload with the file still broken keeps the same set
        srv.reload()
        assert srv.get_json("/_fp/masks")["digest"] == after["digest"]
        # a syntactically broken file: the whole last-good set stays
        patterns.write_bytes(b"return { this is not lua")
        srv.reload()
        info = srv.get_json("/_fp/masks")
        assert info["digest"] == after["digest"] and len(info["errors"]) == 1
        assert load_masks(patterns, last_good).digest == after["digest"]
    finally:
        srv.stop()
