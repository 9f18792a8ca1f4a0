"""Random requests for the Lua vs Python fingerprint comparison
(tests/integration/test_fingerprint_identity.py): both APIs, every block type, CJK and
other scripts, emoji, maskable values, invalid UTF-8, numbers and JSON spelled in
several equivalent ways; seeded, so a failure replays."""

from __future__ import annotations

import base64
import json
import random

from tests.support.fp_nginx import WORDS

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
