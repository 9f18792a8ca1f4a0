#!/usr/bin/env python3
"""Writes shm_abi/vectors/fingerprint_vectors.json: golden vectors for docs/fingerprint.md.

    .venv/bin/python -m tests.vectors.make_fingerprint_vectors [--check]   # from the checkout's root
    (PYTHONPATH=engine first when the venv's zccp is another checkout's)

The values come from engine/zccp/cache/fingerprint.py; tests/unit/test_fingerprint_vectors.py checks
them against Python and tests/integration/test_fingerprint_identity.py against Lua
through nginx. The mask set used is the one in the file ("masks"), a copy of the
defaults at generation time, so operator edits of mask_patterns.lua do not break them.
Regenerate only when the specification changes on purpose (bump fp_tables.version).
"""

from __future__ import annotations

import base64
import json
import sys

from tests.support.checkout import REPO, require_this_checkout
from zccp.cache.fingerprint import compute
from zccp.cache.fp import csf as F
from zccp.cache.fp.canonical import canonical_number
from zccp.cache.fp.tables import DECODE_LIMIT, VERSION
from zccp.cache.mask_apply import MaskSet
from zccp.cache.mask_store import load_masks

OUT = REPO / "shm_abi" / "vectors" / "fingerprint_vectors.json"


def j(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode()


def sig_hex(values) -> str:
    """128 u32 values as one string of 8-hex-digit groups (big-endian digits, value order)."""
    return "".join("%08x" % v for v in values)


def body_fields(body: bytes) -> dict:
    """Small bodies as body_b64; large ones as runs [[b64, count], ...] (keeps the file small)."""
    if len(body) <= 16384:
        return {"body_b64": base64.b64encode(body).decode()}
    runs: list[list] = []
    i = 0
    while i < len(body):
        for unit in (27, 26, 25, 1):  # "lorem ipsum dolor sit amet " repeats
            chunk = body[i:i + unit]
            n = 1
            while body[i + n * unit:i + (n + 1) * unit] == chunk and len(chunk) == unit:
                n += 1
            if n > 4 or unit == 1:
                break
        if runs and n == 1 and runs[-1][1] == 1:
            runs[-1][0] += chunk
        else:
            runs.append([chunk, n])
        i += len(chunk) * n
    return {"body_runs": [[base64.b64encode(c).decode(), n] for c, n in runs]}


def requests() -> list[tuple[str, str, bytes]]:
    conv = [{"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And of Japan?"}]
    long_text = " ".join(f"word{i % 700} token{i % 13}" for i in range(800))  # 1600 tokens
    huge_text = "lorem ipsum dolor sit amet " * 3000                          # > 64 KiB body
    cases: list[tuple[str, str, bytes]] = [
        ("anthropic_simple", "anthropic", j({"model": "claude", "max_tokens": 64, "messages": conv})),
        ("anthropic_system_string", "anthropic",
         j({"model": "claude", "max_tokens": 64, "system": "You are terse.", "messages": conv})),
        ("anthropic_system_blocks", "anthropic",
         j({"model": "claude", "max_tokens": 64, "system": [{"type": "text", "text": "You are terse."}],
            "messages": conv})),
        ("anthropic_params", "anthropic",
         j({"model": "claude", "max_tokens": 64, "temperature": 0.7, "top_p": 0.9, "top_k": 40,
            "stop_sequences": ["\n\nHuman:"], "messages": conv})),
        ("anthropic_params_respelled", "anthropic",
         b'{"messages":' + j(conv) + b',"top_k":4e1,"top_p":0.90,"temperature":7E-1,'
         b'"stop_sequences":["\\n\\nHuman:"],"max_tokens":64.0,"model":"claude","stream":true,'
         b'"metadata":{"user_id":"abc"}}'),
        ("anthropic_blocks", "anthropic", j({"model": "claude", "max_tokens": 8, "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "Describe this image."},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                {"type": "text", "text": "Briefly."}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                          "content": [{"type": "text", "text": "result 2024-05-01T10:00:00Z"}]}]},
        ]})),
        ("anthropic_tools", "anthropic", j({"model": "claude", "max_tokens": 8, "messages": conv, "tools": [
            {"name": "get_weather", "description": "Weather", "input_schema": {
                "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}],
            "tool_choice": {"type": "auto"}})),
        ("openai_simple", "openai", j({"model": "gpt", "messages": conv})),
        ("openai_system_first", "openai", j({"model": "gpt", "messages": [
            {"role": "user", "content": "hello there"},
            {"role": "system", "content": "be brief"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "developer", "content": [{"type": "text", "text": "no emoji"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"}]})),
        ("openai_parts", "openai", j({"model": "gpt", "max_completion_tokens": 20, "stop": "END", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "what is this"},
                                         {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}]}]})),
        ("openai_max_tokens_spelling", "openai",
         j({"model": "gpt", "max_tokens": 20, "stop": "END", "messages": [
             {"role": "user", "content": [{"type": "text", "text": "what is this"},
                                          {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}]}]})),
        ("cjk", "anthropic", j({"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": "東京の天気はどうですか？今日は晴れ。서울 날씨는 어때요? 北京天气怎么样"}]})),
        ("mixed_scripts_emoji", "openai", j({"model": "m", "messages": [
            {"role": "user", "content": "Привет, naïve café! Ω≈ç √ 😀👍🏽 👨‍👩‍👧 🇯🇵 "
                                        "ｆｕｌｌ　ｗｉｄｔｈ “quotes” — dash…"}]})),
        ("escaped_unicode", "openai", json.dumps({"model": "m", "messages": [
            {"role": "user", "content": "Привет 😀 東京 \"quoted\" back\\slash\ttab\u0001ctl"}]}).encode()),
        ("raw_unicode_same", "openai", json.dumps({"model": "m", "messages": [
            {"role": "user", "content": "Привет 😀 東京 \"quoted\" back\\slash\ttab\u0001ctl"}]},
            ensure_ascii=False).encode()),
        ("invalid_utf8", "anthropic",
         b'{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"caf\xe9 na\xc3\xafve \xff\xfe '
         b'\xe4\xb8 \xed\xa0\x80x \xf0\x9f\x98 end\xc3"}]}'),
        ("raw_control_chars", "anthropic",
         b'{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"a\x01b\tc\x1fd"}]}'),
        ("masked_values", "anthropic", j({"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": "patient_id: P123456789 seen 2024-05-01T12:30:00Z by dr.who@example.org, "
                                        "visit 123e4567-e89b-12d3-a456-426614174000 at 1714566600 / 1714566600123"}]})),
        ("masked_values_other", "anthropic", j({"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": "patient_id: P987654321 seen 2025-01-09T08:00:00+02:00 by x@y.io, "
                                        "visit 00000000-0000-0000-0000-00000000abcd at 1700000000 / 1700000000999"}]})),
        ("single_token", "openai", b'{"messages":[{"role":"","content":"solo"}]}'),
        ("no_messages", "openai", b'{"model":"m","x":1}'),
        ("one_word", "anthropic", b'{"messages":[{"role":"user","content":""}],"system":"hi"}'),
        ("empty_prompt", "anthropic", b'{"model":"m","max_tokens":1,"messages":[]}'),
        ("empty_object", "openai", b"{}"),
        ("empty_containers", "anthropic",
         b'{"model":"m","messages":[{"role":"user","content":[]},{"role":"user","content":{}},{},[],'
         b'{"role":"user","content":null}],"tools":{},"stop_sequences":[]}'),
        ("odd_shapes", "openai",
         b'{"model":"m","messages":[{"role":7,"content":"x"},"str",{"role":"user","content":[1,"s",{"type":9},'
         b'{"type":"text"},{"type":"text","text":5},null]},{"role":"user","content":{"type":"text","text":"o"}}],'
         b'"temperature":null,"user":"u1"}'),
        ("numbers", "openai",
         b'{"model":"m","messages":[],"temperature":1,"top_p":1.0,"seed":12345678901234567890,'
         b'"n":-0,"x":[1e400,-1e400,5e-324,0.1,1e21,123456789.125,2.5E-8]}'),
        ("seed_beyond_2_53", "openai", b'{"model":"m","messages":[{"role":"user","content":"hi"}],'
         b'"temperature":1,"seed":9007199254740993}'),
        ("seed_beyond_2_53_next", "openai", b'{"model":"m","messages":[{"role":"user","content":"hi"}],'
         b'"temperature":1,"seed":9007199254740992}'),
        ("duplicate_keys", "openai", b'{"model":"a","model":"b","messages":[]}'),
        ("key_order_bytes", "openai", j({"model": "m", "messages": [], "b": 1, "a": 2, "B": 3, "é": 4, "z\u0000": 5,
                                         "ä": 6, "aa": 7})),
        ("long_prompt", "anthropic", j({"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": long_text}]})),
        ("huge_body", "openai", j({"model": "m", "messages": [{"role": "user", "content": huge_text}]})),
        ("not_json", "anthropic", b"this is not json"),
        ("not_object", "openai", b'[{"role":"user","content":"hi"}]'),
        ("truncated", "anthropic", b'{"model":"m","messages":[{"role":"user","content":"hi'),
        ("lone_surrogate_escape", "anthropic", b'{"messages":[{"role":"user","content":"\\ud800"}]}'),
        ("nan", "openai", b'{"messages":[],"temperature":NaN}'),
        ("too_deep", "openai", b'{"x":' + b"[" * 200 + b"]" * 200 + b"}"),
        ("deep_ok", "openai", b'{"x":' + b"[" * 127 + b"]" * 127 + b"}"),
        # version 2: every block counts (exact/prefix keys), near hits only on a text-only final user turn
        ("image_data_a", "anthropic", j({"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is in this picture?"}, image("AAAAAAAA")]}]})),
        ("image_data_b", "anthropic", j({"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is in this picture?"}, image("BBBBBBBB")]}]})),
        ("document_block", "anthropic", j({"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": [{"type": "document", "source": {
                "type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQK"}},
                {"type": "text", "text": "Summarise it."}]}]})),
        ("agent_step_1", "anthropic", j(agent(1))),
        ("agent_step_2", "anthropic", j(agent(2))),
        ("agent_step_2_then_text", "anthropic", j(agent(2, then="Thanks, now explain the result."))),
        ("tool_result_blocks", "anthropic", j({"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": "Look it up"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_9", "name": "lookup",
                                               "input": {"q": "x"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "is_error": False,
                                          "content": [{"type": "text", "text": "found 42"}]}]}]})),
        ("final_turn_cache_control", "anthropic", j({"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "first part"},
                                         {"type": "text", "text": "second part",
                                          "cache_control": {"type": "ephemeral"}}]}]})),
        ("final_turn_assistant", "anthropic", j({"model": "m", "max_tokens": 8, "messages": conv[:2]})),
        ("multi_turn_reworded", "anthropic", j({"model": "m", "max_tokens": 8, "system": "Be brief.",
                                                "messages": conv[:2] + [{"role": "user",
                                                                        "content": "And what about Japan?"}]})),
        ("openai_tool_round", "openai", j({"model": "gpt", "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}], "messages": [
            {"role": "user", "content": "call f"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "1"}]})),
        ("openai_tool_round_other_args", "openai", j({"model": "gpt", "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}], "messages": [
            {"role": "user", "content": "call f"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 2}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "1"}]})),
        ("openai_user_name", "openai", j({"model": "gpt", "messages": [
            {"role": "user", "content": "hello", "name": "alice"}]})),
        ("openai_image_data_url", "openai", j({"model": "gpt", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]})),
        ("end_user", "openai", j({"model": "gpt", "user": "tenant-7", "messages": conv})),
    ]
    return cases


def image(data: str) -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


def agent(steps: int, then: str | None = None) -> dict:
    """An agent loop after `steps` tool rounds (the last user turn a tool result), or followed by text."""
    msgs: list = [{"role": "user", "content": "Fix the failing test in tests/test_app.py"}]
    for i in range(steps):
        msgs.append({"role": "assistant", "content": [
            {"type": "text", "text": "Reading the file."},
            {"type": "tool_use", "id": f"toolu_{i}", "name": "read_file", "input": {"path": f"src/m{i}.py"}}]})
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}",
                                                  "content": f"def f{i}():\n    return {i}"}]})
    if then is not None:
        msgs.append({"role": "assistant", "content": "Done."})
        msgs.append({"role": "user", "content": then})
    return {"model": "m", "max_tokens": 64, "system": "You are a coding agent.",
            "tools": [{"name": "read_file", "input_schema": {"type": "object"}}], "messages": msgs}


def text_spec(name: str):
    return {"limit_exact": ["t%d ", 1024], "limit_plus_one": ["t%d ", 1025], "limit_cjk": ["字", 1100]}[name]


def text_of_spec(spec) -> bytes:
    fmt, n = spec
    if "%d" in fmt:
        return " ".join(fmt.strip() % i for i in range(n)).encode()
    return fmt.encode() * n


TOKENIZE = [
    ("ascii", b"Hello, World! It's 2024; e-mail: A.B@C.D"),
    ("cjk", "東京タワー 서울 北京 ｶﾀｶﾅ ㄅㄆ 𠀀𪜀".encode()),
    ("mixed", "naïve café Straße ΑΒΓ приве́т x²y ① 1½".encode()),
    ("separators", "a\u00a0b\u2003c\u3000d、e。f「g」h—i…j“k”l\ufeffm\ufffdn😀o\u200dp\u2060q".encode()),
    ("fullwidth", "ＡＢＣ１２３！ｘｙｚ".encode()),
    ("emoji_flags", "go🇯🇵now 👨‍👩‍👧family".encode()),
    ("invalid", b"ab\xffcd \xe4\xb8 \xe4\xb8\x80x \xed\xa0\x80y \xc0\xafz \xf4\x90\x80\x80w \xf0\x9f\x98"),
    ("empty", b""),
    ("only_separators", b" ,.;!? \t\n"),
    ("single", b"solo"),
    ("limit_exact", text_of_spec(text_spec("limit_exact"))),
    ("limit_plus_one", text_of_spec(text_spec("limit_plus_one"))),
    ("limit_cjk", text_of_spec(text_spec("limit_cjk"))),
]

NUMBERS = ["0", "-0", "0.0", "1", "1.0", "1e0", "10", "1e1", "100", "1e2", "0.7", "0.70", "7e-1", "7E-1",
           "0.1", "0.30000000000000004", "1e21", "1e22", "123456789.125", "9007199254740993",
           "12345678901234567890", "5e-324", "1.7976931348623157e308", "2.5e-8", "-1.5", "1e15", "1e16", "1e17",
           "3.14159", "100000000000000000000", "0.000001", "1e-7", "1e400", "-1e400"]

MASK_TEXTS = [b"", b"no ids here", b"patient_id: P123456789", b"patient_id: P123456789, next: AB12345678",
              b"at 2024-05-01T12:30:00Z and 2024-05-01 12:30", b"2024-05-01T12:30:00.123+02:00.",
              b"mail dr.who@example.org or a_b+c@mail.co.uk!", b"id 123E4567-E89B-12D3-A456-426614174000",
              b"epoch 1714566600 ms 1714566600123", b"short 123456 long 12345678 huge 123456789012345678901",
              b"\xff\xfe 1714566600\xc3", "東京 P1234567 ＠".encode()]


def fp_fields(fp) -> dict:
    """A fingerprint as the vectors record it (csf_key, bands, signature: None unless near)."""
    return {"exact_key": fp.exact_key.hex(), "prefix_key": fp.prefix_key.hex(), "masked": fp.masked,
            "near": fp.near, "tokens": fp.tokens, "end_user": fp.end_user,
            "csf_key": "%016x" % fp.csf_key if fp.near else None,
            "bands": ["%016x" % b for b in fp.bands] if fp.near else None,
            "signature_hex": sig_hex(fp.signature) if fp.near else None}


BIG_NUMBER_NIL = "a number beyond 2^53: the engine fingerprints this body"


def holds_big_number(v) -> bool:
    """A number of magnitude >= 2^53 (infinities too) anywhere in a decoded body."""
    if isinstance(v, dict):
        return any(holds_big_number(x) for x in v.values())
    if isinstance(v, list):
        return any(holds_big_number(x) for x in v)
    return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) >= 2**53


def nginx_nil(body: bytes, fp) -> str | None:
    """The error nginx answers for a body the engine fingerprints (a number nginx cannot keep exact)."""
    if fp is None:
        return None
    from zccp.cache.fingerprint import decode_request
    from zccp.cache.fp.tables import EXCLUDED_KEYS
    doc = decode_request("openai", body) or {}
    top = {k: v for k, v in doc.items() if k not in EXCLUDED_KEYS}     # what the canonical form writes
    return BIG_NUMBER_NIL if holds_big_number(top) else None


def minhash_sets() -> list[list[int]]:
    """Shingle hash sets for the MinHash vectors: one value, a few (most bins densified), many."""
    import random
    r = random.Random(5)
    sets = [[0], [1], [0xFFFFFFFF], [0x20, 0x811C9DC5], [123456789, 3735928559, 7]]
    sets += [[r.getrandbits(32) for _ in range(n)] for n in (16, 100, 128, 300, 1023)]
    return sets


def build() -> dict:
    masks = load_masks(REPO / "lua" / "zccp" / "mask_patterns.lua", REPO / "build" / "no-such-last-good.lua")
    assert not masks.errors, masks.errors
    fixed = MaskSet.from_patterns([(p.name, p.pattern, p.replacement) for p in masks.patterns])
    reqs = []
    for name, api, body in requests():
        fp = compute(api, body, fixed)
        dbg: dict = {}
        compute(api, body, fixed, debug=dbg)
        small = len(body) <= 4096
        reqs.append({
            "name": name, "api": api, **body_fields(body),
            "body_bytes": len(body),
            "fingerprint": None if fp is None else fp_fields(fp),
            # nginx's answer when it differs from the fingerprint above (it has none): None
            # when nginx computes the same fingerprint, or nothing either
            "nginx_nil": nginx_nil(body, fp),
            "canonical_b64": base64.b64encode(dbg["canonical"]).decode() if fp and small else None,
            "prompt_b64": base64.b64encode(dbg["prompt"]).decode() if fp and small and dbg["prompt"] is not None
            else None,
        })
    toks = []
    for name, text in TOKENIZE:
        t, complete = F.tokenize(text)
        sig, n, c = F.csf_signature(text)
        toks.append({"name": name, "text_hex": text.hex() if len(text) < 2048 else None,
                     "text_repeat": None if len(text) < 2048 else text_spec(name), "tokens": len(t),
                     "tokens_hex": [x.hex() for x in t] if len(t) <= 64 else None, "complete": complete,
                     "shingles": F.shingle_hashes(t)[:8], "csf_key": "%016x" % F.csf_key_of(sig)})
    return {
        "spec": "docs/fingerprint.md",
        "version": VERSION,
        "params": {
            "max_tokens": F.MAX_TOKENS, "num_perm": F.NUM_PERM, "bands": F.BANDS, "rows": F.ROWS,
            "seed": "%016x" % F.SEED, "decode_limit": DECODE_LIMIT,
            "probe_hex": [bytes(row).hex() for row in F.PROBE],
            "mix64": [{"x": "%016x" % x, "mix": "%016x" % F.mix64(x)} for x in (0, 1, F.SEED, 0xFFFFFFFFFFFFFFFF)],
        },
        "fnv": [{"data_hex": d.hex(), "fnv1a32": "%08x" % F.fnv1a32(d), "fnv1a64": "%016x" % F.fnv1a64(d)}
                for d in (b"", b"a", b"foobar", b"hello world", bytes(range(256)))],
        "masks": [{"name": p.name, "pattern": p.pattern.decode(), "replacement": p.replacement.decode()}
                  for p in fixed.patterns],
        "mask_cases": [{"text_hex": t.hex(), "masked_hex": fixed.apply(t).hex(),
                        "changed": fixed.apply_changed(t)[1]} for t in MASK_TEXTS],
        # canonical: what the engine writes (an integer literal beyond 2^53 keeps its digits);
        # double: the double's form, what nginx's number() writes (a body holding a number
        # beyond 2^53 is not fingerprinted by nginx: fingerprint.md §6)
        "numbers": [{"literal": s, "canonical": canonical_number(json.loads(s) if "e400" not in s
                                                                    else float(s)).decode(),
                     "double": canonical_number(float(s)).decode()} for s in NUMBERS],
        "tokenize": toks,
        "minhash": [{"xs": xs, "signature_hex": sig_hex(F.minhash(xs))} for xs in minhash_sets()],
        "requests": reqs,
    }


def main() -> int:
    require_this_checkout()        # the vectors are this checkout's engine's values
    data = json.dumps(build(), indent=1, ensure_ascii=True) + "\n"
    if "--check" in sys.argv:
        if OUT.read_text() != data:
            print(f"{OUT} is out of date", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(data)
    print(f"wrote {OUT} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
