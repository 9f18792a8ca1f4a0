"""Lua (through a real nginx) vs Python: fingerprints, exact keys, masks, numbers.

Starts its own small nginx (Debian nginx + libnginx-mod-http-lua; tests/support/fp_nginx.py) with
the test-only locations of tests/support/nginx/fp_test.conf, sends a generated corpus of > 1,000 requests
(batched, keepalive) through lua/zccp/fp/fingerprint.lua and compares every key, band
and signature with engine/zccp/cache/fingerprint.py. Also checks the golden vectors in Lua,
and the mask reload behaviour (a broken edit keeps the previous good pattern).
"""

from __future__ import annotations

import base64
import json
import random
import shutil

from tests.support.fingerprint_vectors import sig_values, vec_body, vec_text
from tests.support.fp_nginx import (
    BIG_NUMBER_NIL,
    EXACT,
    MASKED,
    NEAR,
    REPO,
    TOKENS,
    WORDS,
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

# --------------------------------------------------------------------------- corpus

CJK_RANGES = ((0x4E00, 0x9FFF), (0x3040, 0x309F), (0x30A0, 0x30FF), (0xAC00, 0xD7A3), (0x3400, 0x4DBF),
              (0x20000, 0x2A6DF), (0xFF66, 0xFF9F), (0x1100, 0x11FF))
OTHER_SCRIPTS = ("привет мир", "Καλημέρα κόσμε", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก",
                 "naïve café façade Ærø straße", "ĀĒĪŌŪ ǅ ǈ", "Ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ！", "ℌ𝔢𝔩𝔩𝔬 ①②③ ½ x²")
PUNCT = list(" ,.;:!?-_()[]{}'\"/\\|@#$%^&*+=<>~`\t\n\r") + ["“", "”", "—", "…", "、", "。", "「", "」", "・",
                                                             "\u00a0", "\u2028", "\u3000", "\ufeff", "\u200b",
                                                             "¿", "¡", "«", "»", "€", "→", "✓", "\x00", "\x7f"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧", "🇯🇵", "❤️", "🧪", "☕", "🤖", "🏳️‍🌈", "1️⃣"]
INVALID = [b"\xff", b"\xfe", b"\xc0\xaf", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf5",
           b"\x80", b"\xbf", b"\xe4\xb8", b"\xf0\x9f\x98", b"\xc3", b"\xe3\x81", b"\xe3\x81\x81\x81"]
MARK = "\ue000"  # placeholder replaced by raw invalid UTF-8 after encoding


def rand_cjk(r: random.Random) -> str:
    lo, hi = r.choice(CJK_RANGES)
    return "".join(chr(r.randint(lo, hi)) for _ in range(r.randint(1, 12)))


def rand_maskable(r: random.Random) -> str:
    k = r.randrange(7)
    if k == 0:
        return "%08x-%04x-%04x-%04x-%012x" % tuple(r.getrandbits(b) for b in (32, 16, 16, 16, 48))
    if k == 1:
        return "%04d-%02d-%02dT%02d:%02d:%02d%s" % (r.randint(1990, 2030), r.randint(1, 12), r.randint(1, 28),
                                                  r.randint(0, 23), r.randint(0, 59), r.randint(0, 59),
                                                  r.choice(["Z", "+02:00", ".123Z", "", "-0500"]))
    if k == 2:
        return (r.choice(["john.doe", "a", "x_y+z", "Mary.Major"]) + "@"
                + r.choice(["example.com", "mail.co.uk", "b.io"]))
    if k == 3:
        return str(r.randint(1_000_000_000, 1_999_999_999))
    if k == 4:
        return str(r.randint(1_000_000_000_000, 1_999_999_999_999))
    if k == 5:
        return f"patient_id: P{r.randint(10**8, 10**9 - 1)}"
    return f"order #{r.randint(10**7, 10**12)}"


def rand_text(r: random.Random, n_words: int, invalid: bool = False) -> str:
    parts = []
    for _ in range(n_words):
        k = r.random()
        if k < 0.55:
            w = r.choice(WORDS)
            parts.append(w.upper() if r.random() < 0.1 else w.capitalize() if r.random() < 0.1 else w)
        elif k < 0.68:
            parts.append(rand_cjk(r))
        elif k < 0.74:
            parts.append(r.choice(OTHER_SCRIPTS))
        elif k < 0.80:
            parts.append(r.choice(EMOJI))
        elif k < 0.86:
            parts.append(rand_maskable(r))
        elif k < 0.92:
            parts.append(str(r.randint(0, 10**r.randint(1, 14))))
        elif invalid and k < 0.96:
            parts.append(MARK + r.choice(WORDS) if r.random() < 0.5 else r.choice(WORDS) + MARK)
        else:
            parts.append(r.choice(WORDS) + r.choice(PUNCT) + r.choice(WORDS))
        parts.append(r.choice(PUNCT) if r.random() < 0.15 else " ")
    return "".join(parts)


def rand_number(r: random.Random):
    """A JSON number literal (string), spelled in one of several equivalent ways."""
    v = r.choice([0.7, 0.5, 1, 0, 0.1, 0.25, 1.3, 2, 0.999, 1e-7, 123456789.125, 0.30000000000000004,
                  r.random(), r.uniform(0, 2), r.randint(0, 10**6), 2**53 + 1, 1e21, 5e-324])
    k = r.randrange(6)
    if isinstance(v, int):
        return [str(v), f"{v}.0", f"{v}e0", f"{v}.000", str(v), f"{v}E+0"][k]
    return [repr(v), "%.17g" % v, "%.12e" % v, repr(v) + ("0" if "e" not in repr(v) else ""), "%.20f" % v,
            repr(v).upper()][k]


def rand_blocks(r: random.Random, api: str, invalid: bool) -> list:
    out = []
    for _ in range(r.randint(0, 4)):
        k = r.random()
        if k < 0.6:
            out.append({"type": "text", "text": rand_text(r, r.randint(0, 40), invalid)})
        elif api == "anthropic":
            out.append(r.choice([
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": base64.b64encode(r.randbytes(60)).decode()}},
                {"type": "tool_use", "id": "toolu_%d" % r.randint(0, 10**9), "name": "lookup",
                 "input": {"q": rand_text(r, 3), "n": r.randint(1, 9)}},
                {"type": "tool_result", "tool_use_id": "toolu_1",
                 "content": [{"type": "text", "text": rand_text(r, 8)}]},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": rand_text(r, 5)},
                {"type": "document", "source": {"type": "text", "data": rand_text(r, 5)}},
                {"no_type": True}, "bare string", 42, [], {},
            ]))
        else:
            out.append(r.choice([
                {"type": "image_url", "image_url": {"url": "https://x.test/%d.png" % r.randint(0, 99)}},
                {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
                {"type": "text"}, {"type": 7}, None, [],
            ]))
    return out


def rand_content(r: random.Random, api: str, n_words: int, invalid: bool):
    k = r.random()
    if k < 0.55:
        return rand_text(r, n_words, invalid)
    if k < 0.85:
        return rand_blocks(r, api, invalid)
    return r.choice(["", None, [], {}, 17, True])


def rand_request(r: random.Random, api: str, size: str = "normal", invalid: bool = False) -> dict:
    n_words = {"normal": r.randint(0, 80), "long": r.randint(900, 1600), "huge": r.randint(12000, 16000),
               "tiny": r.randint(0, 2)}[size]
    n_msgs = r.randint(1, 6)
    per = max(1, n_words // n_msgs)
    msgs = []
    roles = ["user", "assistant"] if api == "anthropic" else ["user", "assistant", "system", "developer", "tool"]
    for i in range(n_msgs):
        role = r.choice(roles) if r.random() < 0.5 else ("user" if i % 2 == 0 else "assistant")
        content = rand_text(r, per, invalid) if size == "huge" else rand_content(r, api, per, invalid)
        m = {"role": role, "content": content}
        if r.random() < 0.03:
            m = r.choice([{"content": "no role"}, {"role": 5, "content": "x"}, "not an object", {}])
        if api == "openai" and role == "assistant" and isinstance(m, dict) and r.random() < 0.2:
            m["tool_calls"] = [{"id": "call_1", "type": "function",
                                "function": {"name": "f", "arguments": '{"a": %d}' % r.randint(0, 9)}}]
        msgs.append(m)
    req: dict = {"model": r.choice(["claude-x", "gpt-y", "tiny"])}
    if api == "anthropic" and r.random() < 0.5:
        req["system"] = (rand_text(r, r.randint(0, 30), invalid) if r.random() < 0.7
                         else [{"type": "text", "text": rand_text(r, 10)}, {"type": "text", "text": "rules"}])
    req["messages"] = msgs
    num = {}
    for key in ("temperature", "top_p", "top_k", "max_tokens", "max_completion_tokens", "seed"):
        if r.random() < 0.4:
            num[key] = rand_number(r)
    if r.random() < 0.3:
        req["stop_sequences" if api == "anthropic" else "stop"] = (
            [rand_text(r, 1) for _ in range(r.randint(0, 3))] if r.random() < 0.8 else "STOP")
    if r.random() < 0.2:
        req["tools"] = [{"name": "get_weather", "description": rand_text(r, 6),
                         "input_schema": {"type": "object", "properties": {"city": {"type": "string"},
                                                                          "days": {"type": "integer",
                                                                                   "minimum": 1}},
                                          "required": ["city"]}}]
    for key, extra in (("stream", r.choice([True, False])), ("metadata", {"user_id": str(r.random())}),
                       ("user", "u%d" % r.randint(0, 9)), ("stream_options", {"include_usage": True}),
                       ("tool_choice", {"type": "auto"}), ("temperature", None), ("ünïcode_kéy", 1),
                       ("a\u0000b", "nul"), ("Z", []), ("aa", {})):
        if r.random() < 0.15:
            req[key] = extra
    req["__nums__"] = num
    return req


def encode(r: random.Random, req: dict) -> bytes:
    """JSON bytes in varied spellings: escapes or raw UTF-8, spacing, number literals, invalid bytes."""
    nums = req.pop("__nums__", {})
    placeholders = {}
    for i, (k, lit) in enumerate(nums.items()):
        ph = f"@@NUM{i}@@"
        req[k] = ph
        placeholders[json.dumps(ph).encode()] = lit.encode()
    sep = r.choice([(",", ":"), (", ", ": "), (",", ": ")])
    body = json.dumps(req, ensure_ascii=r.random() < 0.3, separators=sep,
                      indent=2 if r.random() < 0.1 else None).encode("utf-8", "surrogatepass")
    for ph, lit in placeholders.items():
        body = body.replace(ph, lit)
    mark = json.dumps(MARK, ensure_ascii=False)[1:-1].encode()
    mark_esc = json.dumps(MARK)[1:-1].encode()
    while mark in body:
        body = body.replace(mark, r.choice(INVALID), 1)
    while mark_esc in body:  # ensure_ascii spelled it \ue000: put raw invalid bytes instead
        body = body.replace(mark_esc, r.choice(INVALID), 1)
    if r.random() < 0.03:  # a raw control character inside a string (cjson takes it)
        body = body.replace(b'"model":', b'"model\x01":', 1)
    return body


def corpus(seed: int = 20240501) -> list[tuple[str, bytes]]:
    r = random.Random(seed)
    items: list[tuple[str, bytes]] = []
    for i in range(1100):
        api = "anthropic" if i % 2 == 0 else "openai"
        size = "huge" if i % 251 == 0 else "long" if i % 17 == 0 else "tiny" if i % 13 == 0 else "normal"
        items.append((api, encode(r, rand_request(r, api, size, invalid=(i % 5 == 0)))))
    # duplicates in other spellings: must give the same keys
    for _ in range(60):
        api = r.choice(["anthropic", "openai"])
        req = rand_request(r, api)
        req["__nums__"] = {}
        items.append((api, encode(r, json.loads(json.dumps(req)))))
        items.append((api, encode(r, req)))
    # not fingerprintable / edge bodies
    for body in (b"", b"   ", b"[]", b"[1,2]", b'"str"', b"42", b"null", b"{", b'{"a":}', b"{}", b" {} ",
                 b'{"messages": []}', b'{"messages": {}}', b'{"messages": "x"}', b'{"system": null}',
                 b'{"messages":[{"role":"user","content":"\\ud800"}]}',
                 b'{"messages":[{"role":"user","content":"\\udc80 x"}]}',
                 b'{"messages":[{"role":"user","content":"\\ud83d\\ude00 ok"}]}',
                 b'{"temperature": NaN}', b'{"temperature": Infinity}', b'{"t": 0x10}', b'{"t": 1e400}',
                 b'{"t": -0}', b'{"t": -0.0}', b'{"t": 01}', b'{"a":1,"a":2}', b'{"a":1} x',
                 b'{"messages":[{"role":"user","content":"a\x80\x81 b\xc3"}]}',
                 b'{"messages":[{"role":"user","content":"tab\there\x1f"}]}',
                 b"{" + b'"a":' * 0 + b'"d":' + b"[" * 127 + b"]" * 127 + b"}",
                 b"{" + b'"d":' + b"[" * 128 + b"]" * 128 + b"}",
                 b"{" + b'"d":' + b"[" * 2000 + b"]" * 2000 + b"}"):
        for api in ("anthropic", "openai"):
            items.append((api, body))
    return items


def rand_agent_request(r: random.Random, api: str) -> dict:
    """A tool-using conversation (every v2 block type), ending on a user turn that is text
    only, carries blocks, or is a tool round (so both sides of the near rule are hit)."""
    msgs: list = []
    tools = [{"name": "read_file", "description": rand_text(r, 4),
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
    for step in range(r.randint(1, 5)):
        q = rand_text(r, r.randint(1, 30))
        arg = {"path": "/src/%s.py" % r.choice(WORDS), "n": r.randint(1, 99)}
        result = rand_text(r, r.randint(0, 40))
        if api == "anthropic":
            msgs.append({"role": "user", "content": q if step == 0 else [
                {"type": "tool_result", "tool_use_id": "toolu_%d" % step,
                 "content": r.choice([result, [{"type": "text", "text": result}],
                                      [{"type": "image", "source": {
                                          "type": "base64", "media_type": "image/png",
                                          "data": base64.b64encode(r.randbytes(40)).decode()}}]]),
                 **({"is_error": True} if r.random() < 0.1 else {})}]})
            msgs.append({"role": "assistant", "content": [
                {"type": "text", "text": rand_text(r, 5)},
                {"type": "tool_use", "id": "toolu_%d" % (step + 1), "name": "read_file", "input": arg}]})
        else:
            if step == 0:
                msgs.append({"role": "user", "content": q})
            else:
                msgs.append({"role": "tool", "tool_call_id": "call_%d" % step, "content": result})
            msgs.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_%d" % (step + 1), "type": "function",
                 "function": {"name": "read_file", "arguments": json.dumps(arg)}}]})
    end = r.random()
    if end < 0.4:       # a text-only final user turn (near-able)
        msgs.append({"role": "user", "content": r.choice([rand_text(r, r.randint(1, 30)),
                                                          [{"type": "text", "text": rand_text(r, 9)},
                                                           {"type": "text", "text": rand_text(r, 3),
                                                            **({"cache_control": {"type": "ephemeral"}}
                                                               if api == "anthropic" else {})}]])})
    elif end < 0.7:     # a final turn with an image or a document
        if api == "anthropic":
            blk = r.choice([{"type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                                                         "data": base64.b64encode(r.randbytes(90)).decode()}},
                            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                                            "data": base64.b64encode(r.randbytes(90)).decode()}},
                            {"type": "image", "source": {"type": "url",
                                                         "url": "https://x.test/%d.png" % r.randint(0, 9)}}])
        else:
            blk = r.choice([{"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                                + base64.b64encode(r.randbytes(60)).decode()}},
                            {"type": "file", "file": {"file_data": base64.b64encode(r.randbytes(60)).decode(),
                                                      "filename": "a.pdf"}}])
        msgs.append({"role": "user", "content": [{"type": "text", "text": rand_text(r, 6)}, blk]})
    elif end < 0.85 and api == "openai":
        msgs.append({"role": "user", "content": rand_text(r, 6), "name": "alice"})   # other members: exact-only
    req: dict = {"model": "m", "max_tokens": 64, "messages": msgs}
    if api == "anthropic":
        req["tools"] = tools
        req["system"] = rand_text(r, 8)
    else:
        req["tools"] = [{"type": "function", "function": {"name": "read_file", "parameters": tools[0]["input_schema"]}}]
    if r.random() < 0.3:
        req["tool_choice"] = {"type": "auto"} if api == "anthropic" else "auto"
    return req


def agent_corpus(seed: int = 99) -> list[tuple[str, bytes]]:
    r = random.Random(seed)
    out = []
    for i in range(400):
        api = ("anthropic", "openai")[i % 2]
        req = rand_agent_request(r, api)
        out.append((api, encode(r, req)))
    return out


# --------------------------------------------------------------------------- tests

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
