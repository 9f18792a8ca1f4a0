"""zccp.cache.fingerprint and zccp.cache.fp (Python only): tokenizer, MinHash, keys, the
final-turn rule, properties. The golden vectors: test_fingerprint_vectors.py."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from zccp.cache.fingerprint import Fingerprint, compute, estimate_jaccard
from zccp.cache.fp import canonical, prompt, tables
from zccp.cache.fp import csf as F
from zccp.cache.mask_apply import MaskSet
from zccp.cache.mask_store import load_masks

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO / "shm_abi" / "vectors" / "fingerprint_vectors.json"


@pytest.fixture(scope="module")
def masks() -> MaskSet:
    return load_masks(REPO / "lua" / "zccp" / "mask_patterns.lua", REPO / "build" / "no-such-last-good.lua")


def body(api: str = "anthropic", text: str = "hello world", **kw) -> bytes:
    req = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": text}], **kw}
    return json.dumps(req).encode()


# --------------------------------------------------------------------------- tokenizer

@pytest.mark.parametrize("text,tokens", [
    (b"Hello, WORLD!", [b"hello", b"world"]),
    (b"don't stop-me now_1", [b"don", b"t", b"stop", b"me", b"now", b"1"]),
    ("東京タワー".encode(), ["東".encode(), "京".encode(), "タ".encode(), "ワ".encode(), "ー".encode()]),
    ("abc東京def".encode(), [b"abc", "東".encode(), "京".encode(), b"def"]),
    ("Straße café".encode(), ["straße".encode(), "café".encode()]),            # non-ASCII: not lowercased
    ("ÀB".encode(), ["Àb".encode()]),
    ("a😀b c\u3000d\u00a0e".encode(), [b"a", b"b", b"c", b"d", b"e"]),          # emoji and spaces separate
    (b"a\xffb \xe4\xb8\x80", [b"a\xffb", "一".encode()]),                      # invalid bytes join words
    (b"\xe4\xb8 x", [b"\xe4\xb8", b"x"]),                                       # a truncated CJK char: word bytes
    (b"\xed\xa0\x80", [b"\xed\xa0\x80"]),                                       # an encoded surrogate: invalid
    (b"", []),
    (b"  \t\n,,", []),
])
def test_tokenize(text, tokens):
    assert F.tokenize(text) == (tokens, True)


def test_token_limit():
    toks, complete = F.tokenize(b" ".join(b"w%d" % i for i in range(1024)))
    assert len(toks) == 1024 and complete
    toks, complete = F.tokenize(b" ".join(b"w%d" % i for i in range(1025)))
    assert len(toks) == 1024 and not complete and toks[-1] == b"w1023"
    toks, complete = F.tokenize(b" ".join(b"w%d" % i for i in range(1024)) + b" ,;  ")
    assert complete


def test_shingles():
    assert F.shingle_hashes([]) == []
    assert F.shingle_hashes([b"solo"]) == [F.fnv1a32(b"solo")]
    assert F.shingle_hashes([b"a", b"b", b"c"]) == [F.fnv1a32(b"a b"), F.fnv1a32(b"b c")]


# --------------------------------------------------------------------------- MinHash

def test_minhash_numpy_equals_pure_python():
    r = random.Random(1)
    for _ in range(30):
        xs = [r.getrandbits(32) for _ in range(r.randint(1, 1100))] + [0, 0xFFFFFFFF]
        if F._np is not None:
            assert F._bins_np(xs) == F._bins_py(xs)


def test_minhash_empty_and_single():
    assert F.minhash([]) == (0xFFFFFFFF,) * 128
    x = 123456789
    z = F.mix64(x ^ F.SEED)
    assert F.minhash([x]) == (z & 0xFFFFFFFF,) * 128       # one filled bin, copied into every other
    assert F.minhash([x, x, x]) == F.minhash([x])


def test_minhash_bins_and_densification():
    """Filled bins hold their minimum; an empty bin copies the first filled bin of its probe row."""
    r = random.Random(8)
    xs = [r.getrandbits(32) for _ in range(40)]
    sig = F.minhash(xs)
    bins: dict[int, int] = {}
    for x in xs:
        z = F.mix64(x ^ F.SEED)
        bins[z >> 57] = min(bins.get(z >> 57, 1 << 32), z & 0xFFFFFFFF)
    assert 10 < len(bins) < 128
    for i in range(128):
        src = i if i in bins else next(j for j in F.PROBE[i] if j in bins)
        assert sig[i] == bins[src]


def test_minhash_estimates_jaccard():
    """One permutation with densification estimates Jaccard without bias, small sets included."""
    r = random.Random(12)
    for n, j in ((8, 0.6), (40, 0.85), (400, 0.85), (1000, 0.3)):
        ests = []
        for _ in range(300):
            common = [r.getrandbits(32) for _ in range(round(n * 2 * j / (1 + j)))]
            rest = n - len(common)
            a = common + [r.getrandbits(32) for _ in range(rest)]
            b = common + [r.getrandbits(32) for _ in range(rest)]
            true_j = len(common) / (len(common) + 2 * rest)
            ests.append(estimate_jaccard(F.minhash(a), F.minhash(b)) - true_j)
        assert abs(sum(ests) / len(ests)) < 0.02, (n, j, sum(ests) / len(ests))


def test_band_and_csf_keys():
    sig = tuple(range(128))
    bands = F.band_keys(sig)
    assert len(bands) == 16 and len(set(bands)) == 16
    assert bands[3] == F.fnv1a64(bytes([3]) + b"".join(v.to_bytes(4, "little") for v in range(24, 32)))
    assert F.csf_key_of(sig) == F.fnv1a64(b"".join(v.to_bytes(4, "little") for v in sig))


# --------------------------------------------------------------------------- compute

def test_compute_shape(masks):
    fp = compute("anthropic", body(), masks)
    assert isinstance(fp, Fingerprint)
    assert len(fp.bands) == 16 and len(fp.signature) == 128 and len(fp.exact_key) == len(fp.prefix_key) == 32
    assert 0 <= fp.csf_key < 1 << 64 and all(0 <= b < 1 << 64 for b in fp.bands)
    assert fp.tokens == 2 and fp.near and not fp.masked           # the final turn: "hello", "world"
    with pytest.raises(dataclasses.FrozenInstanceError):
        fp.tokens = 1  # type: ignore[misc]
    assert compute("anthropic", memoryview(body()), masks) == fp
    assert compute("anthropic", bytearray(body()), masks) == fp
    assert canonical.exact_key("anthropic", json.loads(body())) == fp.exact_key   # bench B-cache's key


def test_compute_rejects_bad_api():
    with pytest.raises(ValueError):
        compute("gemini", body())


@pytest.mark.parametrize("raw", [b"", b"nope", b"[]", b'"x"', b"{", b'{"temperature": NaN}',
                                 b'{"m": "\\ud800"}', b'{"x":' + b"[" * 200 + b"]" * 200 + b"}"])
def test_not_fingerprintable(raw):
    assert compute("openai", raw) is None


def _turn(content, **extra):
    return prompt.final_turn({"messages": [{"role": "assistant", "content": "x"},
                                           {"role": "user", "content": content, **extra}]})


def test_final_turn_rule():
    assert _turn("plain") == ["plain"]
    assert _turn([{"type": "text", "text": "a"},
                  {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}}]) \
        == ["a", b"\n", "b"]
    for content in ([{"type": "text", "text": "a"}, {"type": "image", "source": {"type": "base64", "data": "AA"}}],
                    [{"type": "tool_result", "tool_use_id": "t", "content": "42"}],
                    [{"type": "document", "source": {"type": "text", "data": "d"}}],
                    [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}],
                    [{"type": "text", "text": "a", "citations": []}], [{"type": "text", "text": 5}],
                    [], {}, None, 7, [["nested"]]):
        assert _turn(content) is None, content
    assert _turn("hi", name="alice") is None                      # another member: exact-only
    assert prompt.final_turn({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}) \
        is None
    assert prompt.final_turn({"messages": [{"role": "tool", "tool_call_id": "c", "content": "1"}]}) is None
    assert prompt.final_turn({"messages": []}) is None and prompt.final_turn({"messages": {}}) is None
    assert prompt.final_turn({"messages": "x"}) is None and prompt.final_turn({}) is None


def _conv(*turns, **top):
    msgs = [{"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(turns)]
    return json.dumps({"model": "m", "max_tokens": 16, "messages": msgs, **top}).encode()


def test_prefix_key_covers_everything_but_the_final_turn(masks):
    a = compute("anthropic", _conv("Capital of France?", "Paris.", "And of Japan?"), masks)
    reworded = compute("anthropic", _conv("Capital of France?", "Paris.", "What about Japan?"), masks)
    assert a.prefix_key == reworded.prefix_key and a.exact_key != reworded.exact_key
    assert a.near and reworded.near
    for other in (_conv("Capital of Spain?", "Paris.", "And of Japan?"), _conv("Capital of France?", "Lyon.",
                                                                                "And of Japan?"),
                  _conv("Capital of France?", "Paris.", "And of Japan?", system="Be terse."),
                  _conv("Capital of France?", "Paris.", "And of Japan?", tools=[{"name": "t"}]),
                  _conv("Capital of France?", "Paris.", "And of Japan?", tool_choice={"type": "any"}),
                  _conv("Capital of France?", "Paris.", "And of Japan?", temperature=0.2),
                  _conv("Capital of France?", "Paris.", "And of Japan?", model="n"),
                  _conv("Paris.", "And of Japan?")):
        assert compute("anthropic", other, masks).prefix_key != a.prefix_key, other
    # what the exact key leaves out, the prefix key does too
    same = json.loads(_conv("Capital of France?", "Paris.", "And of Japan?"))
    same.update(stream=True, metadata={"user_id": "u"})
    assert compute("anthropic", json.dumps(same).encode(), masks).prefix_key == a.prefix_key
    # one message: the prefix is the request with no messages
    one = compute("anthropic", _conv("hi"), masks)
    assert one.prefix_key == compute("anthropic", json.dumps({"model": "m", "max_tokens": 16, "messages": []}).encode(),
                                     masks).prefix_key


def test_every_block_counts(masks):
    def img(data):
        return json.dumps({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}]}]}).encode()
    a, b = compute("anthropic", img("AAAA"), masks), compute("anthropic", img("BBBB"), masks)
    assert a.exact_key != b.exact_key and not a.near and not b.near
    with pytest.raises(ValueError):
        a.jaccard(b)                                    # exact-only requests have no similarity

    def step(n):
        msgs = [{"role": "user", "content": "fix the bug"}]
        for i in range(n):
            msgs += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": "read",
                                                        "input": {"path": f"a{i}.py"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": f"r{i}"}]}]
        return json.dumps({"model": "m", "max_tokens": 8, "messages": msgs}).encode()
    keys = [compute("anthropic", step(n), masks) for n in (1, 2, 3)]
    assert len({k.exact_key for k in keys}) == 3 and len({k.prefix_key for k in keys}) == 3
    assert not any(k.near for k in keys)

    def calls(args, result):
        return json.dumps({"model": "m", "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": args}}]},
            {"role": "tool", "tool_call_id": "c", "content": result}]}).encode()
    o = [compute("openai", calls(a_, r_), masks) for a_, r_ in (("{}", "1"), ('{"x":1}', "1"), ("{}", "2"))]
    assert len({k.exact_key for k in o}) == 3 and not any(k.near for k in o)


def test_exact_key_parameters(masks):
    base = compute("anthropic", body(temperature=0.7), masks)
    same = [body(temperature=0.70, stream=True), body(temperature=7e-1, metadata={"user_id": "x"}),
            json.dumps({"messages": [{"content": "hello world", "role": "user"}], "temperature": 0.7,
                        "max_tokens": 16.0, "model": "m"}).encode()]
    for b in same:
        assert compute("anthropic", b, masks).exact_key == base.exact_key, b
    differ = [body(temperature=0.8), body(temperature=0.7, model="n"), body(temperature=0.7, top_k=5),
              body(temperature=0.7, stop_sequences=["x"]), body(temperature=0.7, tools=[{"name": "t"}]),
              body(temperature=0.7, system="s"), body(text="hello world!", temperature=0.7) + b" "]
    keys = {compute("anthropic", b, masks).exact_key for b in differ}
    assert len(keys) == len(differ) and base.exact_key not in keys
    assert compute("openai", body(temperature=0.7), masks).exact_key != base.exact_key
    o1 = compute("openai", body("openai", max_tokens=5), masks)
    o2 = compute("openai", json.dumps({"model": "m", "max_completion_tokens": 5,
                                       "messages": [{"role": "user", "content": "hello world"}]}).encode(), masks)
    assert o1.exact_key == o2.exact_key


def test_masks_unify_keys(masks):
    a = compute("anthropic", body(text="patient_id: P123456789 at 2024-05-01T10:00:00Z mail a@b.com"), masks)
    b = compute("anthropic", body(text="patient_id: P987654321 at 2025-12-31T23:59:59Z mail x@y.org"), masks)
    assert a.masked and b.masked
    assert a.exact_key == b.exact_key and a.csf_key == b.csf_key and a.bands == b.bands
    c = compute("anthropic", body(text="patient_id: P123456789 at 2024-05-01T10:00:00Z mail a@b.com"), MaskSet())
    assert not c.masked and c.exact_key != a.exact_key


def test_near_duplicates_share_bands(masks):
    r = random.Random(2)
    words = [f"w{r.randint(0, 5000)}" for _ in range(400)]
    a = compute("anthropic", body(text=" ".join(words)), masks)
    words[200] = "changed"
    b = compute("anthropic", body(text=" ".join(words)), masks)
    other = compute("anthropic", body(text=" ".join(f"v{r.randint(0, 5000)}" for _ in range(400))), masks)
    assert a.exact_key != b.exact_key
    assert estimate_jaccard(a.signature, b.signature) > 0.9 and a.jaccard(b) > 0.9
    assert len(set(a.bands) & set(b.bands)) >= 8
    assert estimate_jaccard(a.signature, other.signature) < 0.1 and not set(a.bands) & set(other.bands)


def test_long_turns_are_exact_only(masks):
    fp = compute("anthropic", body(text=" ".join(f"t{i}" for i in range(2000))), masks)
    assert not fp.near and fp.tokens == 0 and fp.signature == ()
    fp = compute("anthropic", body(text=" ".join(f"t{i}" for i in range(1024))), masks)
    assert fp.near and fp.tokens == 1024
    big = body(text="lorem ipsum " * 10000)
    assert len(big) > tables.DECODE_LIMIT
    fp = compute("anthropic", big, masks)                   # Python has no decode limit
    assert fp is not None and not fp.near
    # a long history with a short final question still allows near hits
    hist = _conv(" ".join(f"h{i}" for i in range(3000)), "ok", "and now a short question")
    fp = compute("anthropic", hist, masks)
    assert fp.near and fp.tokens == 5


def test_empty_and_odd_shapes():
    assert compute("anthropic", b"{}").tokens == 0
    e = compute("anthropic", b'{"messages":[]}')
    assert not e.near and e.signature == ()
    assert not compute("anthropic", b'{"messages":[{"role":"user","content":" ,;"}]}').near   # no token
    # {} and [] are one thing (lua-cjson cannot tell them apart)
    a = compute("openai", b'{"messages":[{"role":"user","content":[]}],"tools":{}}')
    b = compute("openai", b'{"messages":[{"role":"user","content":{}}],"tools":[]}')
    assert a == b


def test_invalid_utf8_and_control_chars():
    fp = compute("anthropic", b'{"messages":[{"role":"user","content":"caf\xe9 \xff x\x01y"}]}')
    assert fp is not None and fp.tokens == 4                # caf\xe9, \xff, x, y


def test_mask_literals(masks):
    lit: list[bytes] = []
    b = json.dumps({"model": "m", "system": "today is 2024-05-01T10:00:00Z", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "mail ann@north.com about invoice 123456789"}]},
        {"role": "user", "content": "ann@north.com again", "metadata": "bob@south.org"}]}).encode()
    fp = compute("anthropic", b, masks, literals=lit)
    assert fp.masked and lit == [b"2024-05-01T10:00:00Z", b"ann@north.com", b"123456789", b"ann@north.com"]


def test_canonical_numbers():
    # (value, spelling) pairs, not a dict: 1 and 1.0, 0 and -0.0 are equal keys and would drop a case
    cases = [(0.7, "0.7"), (1, "1"), (1.0, "1"), (100, "100"), (-0.0, "0"), (0, "0"), (1e21, "1e+21"),
             (0.1 + 0.2, "0.30000000000000004"), (2**53 + 1, "9007199254740993"), (10**400, "inf"),
             (float("inf"), "inf"), (5e-324, "4.94065645841247e-324"), (123456789.125, "123456789.125"),
             # integers beyond 2^53 keep their digits while they fit 64 bits (fingerprint.md §6)
             (2**53, "9007199254740992"), (-(2**53) - 1, "-9007199254740993"), (2**64 - 1, "18446744073709551615"),
             (2**64, "1.8446744073709552e+19"), (float(2**53 + 2), "9007199254740994")]
    for v, want in cases:
        assert canonical.canonical_number(v) == want.encode(), repr(v)


def test_estimate_jaccard():
    assert estimate_jaccard([1, 2, 3, 4], [1, 2, 0, 0]) == 0.5
    with pytest.raises(ValueError):
        estimate_jaccard([1], [1, 2])


# --------------------------------------------------------------------------- the fast paths

def _tokenize_reference(text: bytes, limit: int = F.MAX_TOKENS) -> tuple[list[bytes], bool]:
    """The spec's tokenizer in one pass over the whole text (no prefixes, no ASCII path)."""
    import itertools
    s = text.lower().decode("utf-8", "surrogateescape")
    toks = [m.group().encode("utf-8", "surrogateescape")
            for m in itertools.islice(F._TOKEN_RE.finditer(s), limit + 1)]
    return toks[:limit], len(toks) <= limit


def test_tokenize_prefixes_equal_whole_text():
    """compute() tokenizes growing prefixes of the prompt; the cut may split a word or a
    UTF-8 sequence. Texts around the prefix sizes, ASCII and not, agree with one pass."""
    r = random.Random(9)
    pieces = ["word", "Wörd", "东京", "😀", " ", "  ", ".", "\n", "x" * 300, "\udcff", "é" * 7]
    for i in range(24):
        parts, n = [], 0
        size = r.choice([F._FIRST_PREFIX - 50, F._FIRST_PREFIX, 4 * F._FIRST_PREFIX + 3, 70000])
        odd = pieces if i % 2 else [" ", ".", "\n", "x" * 300, "AbC"]   # half of them ASCII only
        while n < size:
            parts.append(r.choice(odd) if r.random() < 0.3 else r.choice(["a", "bb", "ccc", " ", "Zz"]))
            n += len(parts[-1])
        text = "".join(parts).encode("utf-8", "surrogateescape")
        for cut in (len(text), F._FIRST_PREFIX - 1, F._FIRST_PREFIX + 1, 6000):
            t = text[:cut]
            assert F.tokenize(t) == _tokenize_reference(t)
            assert F.tokenize_prefixes(prompt.prefix_of([t[:100], t[100:].decode("utf-8", "surrogateescape")])) \
                == _tokenize_reference(t)


def test_shingles_numpy_equals_pure_python():
    r = random.Random(4)
    for n in (17, 40, 1024):
        toks = [bytes(r.randrange(0x21, 0x100) for _ in range(r.choice([1, 3, 8, 30, 60, 200]))) for _ in range(n)]
        states = [F.fnv1a32(t) for t in toks]
        want = [F.fnv1a32(toks[j + 1], F.fnv1a32(b" ", states[j])) for j in range(n - 1)]
        assert F.shingle_hashes(toks) == want


def test_long_string_escapes():
    """Long strings are escaped with replace(); short ones with the regex: the same bytes."""
    r = random.Random(6)
    alpha = ["a", "é", "\\", '"', "\n", "\t", "\x00", "\x1f", "\x7f", "😀", "\udcff", "u", "\\u000a", "\r\b\f"]
    for _ in range(400):
        s = "".join(r.choice(alpha) for _ in range(r.choice([r.randint(0, 200), r.randint(8000, 9000)])))
        b = s.encode("utf-8", "surrogateescape")
        want = b'"' + canonical._STR_ESC.sub(canonical._esc, b) + b'"'
        for v in (s, b):
            out: list[bytes] = []
            canonical._put_str(v, out)
            assert b"".join(out) == want


def test_compute_with_parsed_doc(masks):
    import orjson
    bodies = [body(text="see 123e4567-e89b-12d3-a456-426614174000 at 2024-05-01T12:30:00Z " * 40),
              body("openai", "hi", max_completion_tokens=5, temperature=0.5),
              json.dumps({"system": [{"type": "text", "text": "x\ny"}], "messages": []}).encode()]
    for api in ("anthropic", "openai"):
        for b in bodies:
            assert compute(api, None, masks, doc=orjson.loads(b)) == compute(api, b, masks)
    assert compute("anthropic", None, masks, doc=[1]) is None


def test_exact_key_of_pieces():
    r = random.Random(2)
    pieces = [r.randbytes(r.choice([0, 5, 5000, 70000])) for _ in range(30)]
    import hashlib
    assert canonical.sha256_of(pieces) == hashlib.sha256(b"".join(pieces)).digest()
