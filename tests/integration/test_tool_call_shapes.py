"""Parallel tool calls keep their shape when streamed, and their arguments keep every digit.

The null backend replies with two hermes calls and whitespace between and after them (as
Qwen-style models write them), with integers past 2^53 and past 2^64 in the arguments.
Streamed and whole answers must give the same blocks on Anthropic, OpenAI chat and
Responses; whitespace-only text after a call is no block of its own in either (the real
APIs refuse a whitespace-only text block as input: a client sends the answer back)."""

from __future__ import annotations

import json

import httpx
import pytest

BIG = 29570888888833368368888          # past 2^64: orjson reads it as a float
PAST_53 = 9007199254740993              # 2^53 + 1: a float has no such value
PAST_64 = 18446744073709551617          # 2^64 + 1
REPLY = ('Checking both. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
         f'"big": {BIG}, "id": {PAST_53}, "u": {PAST_64}}}}}\n</tool_call>\n'
         f'<tool_call>\n{{"name": "get_time", "arguments": {{"n": {PAST_64}}}}}\n</tool_call>\n')
CALL_1 = {"city": "Paris", "big": BIG, "id": PAST_53, "u": PAST_64}
CALL_2 = {"n": PAST_64}
TOOLS = [{"name": n, "description": n, "input_schema": {"type": "object"}} for n in ("get_weather", "get_time")]
OAI_TOOLS = [{"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}} for t in TOOLS]
RESP_TOOLS = [{"type": "function", "name": t["name"], "parameters": t["input_schema"]} for t in TOOLS]
USER = [{"role": "user", "content": "Weather and time in Paris?"}]
MODEL = "zccp-tiny"


def _cut_inside(text: str) -> int:
    """max_tokens (the null model's tokens are bytes) that ends the reply inside `text`."""
    raw = REPLY.encode()
    return raw.index(text.encode()) + len(text) // 2


@pytest.fixture(scope="module")
def shapes_stack(tmp_path_factory):
    from tests.support.harness import Stack

    s = Stack(tmp_path_factory.mktemp("shapes"), {"model": {"backend": "null", "name": MODEL, "null_reply": REPLY}})
    try:
        yield s.start()
    finally:
        s.stop()


@pytest.fixture(scope="module")
def sdk_stack(shapes_stack):
    return shapes_stack


def _loads(text: str):
    return json.loads(text)    # Python's json: integers exact


def _sse_data(text: str) -> list[dict]:
    return [_loads(ln[6:]) for ln in text.splitlines() if ln.startswith("data: {")]


def _post(s, path: str, body: dict) -> httpx.Response:
    with s.client(timeout=30) as c:
        r = c.post(path, json=body, headers={"anthropic-version": "2023-06-01"} if path == "/v1/messages" else {})
    assert r.status_code == 200, r.text
    return r


def _anthropic_blocks(s, max_tokens: int, stream: bool) -> list[dict]:
    body = {"model": MODEL, "max_tokens": max_tokens, "messages": USER, "tools": TOOLS, "stream": stream}
    r = _post(s, "/v1/messages", body)
    if not stream:
        return [{k: v for k, v in b.items() if k != "id"} for b in _loads(r.text)["content"]]
    blocks: list[dict] = []
    args: dict[int, str] = {}
    for ev in _sse_data(r.text):
        if ev["type"] == "content_block_start":
            blocks.append({k: v for k, v in ev["content_block"].items() if k != "id"})
        elif ev["type"] == "content_block_delta" and ev["delta"]["type"] == "text_delta":
            blocks[ev["index"]]["text"] += ev["delta"]["text"]
        elif ev["type"] == "content_block_delta":
            args[ev["index"]] = args.get(ev["index"], "") + ev["delta"]["partial_json"]
    for i, a in args.items():
        blocks[i]["input"] = _loads(a)
    return blocks


def test_anthropic_streamed_and_whole_give_the_same_blocks(shapes_stack):
    whole = _anthropic_blocks(shapes_stack, 400, False)
    assert whole == [{"type": "text", "text": "Checking both. "},
                     {"type": "tool_use", "name": "get_weather", "input": CALL_1},
                     {"type": "tool_use", "name": "get_time", "input": CALL_2}]
    assert _anthropic_blocks(shapes_stack, 400, True) == whole


def test_openai_chat_streamed_and_whole_give_the_same_message(shapes_stack):
    body = {"model": MODEL, "max_tokens": 400, "messages": USER, "tools": OAI_TOOLS}
    msg = _loads(_post(shapes_stack, "/v1/chat/completions", body).text)["choices"][0]["message"]
    calls = [(c["function"]["name"], _loads(c["function"]["arguments"])) for c in msg["tool_calls"]]
    assert msg["content"] == "Checking both. " and calls == [("get_weather", CALL_1), ("get_time", CALL_2)]
    text, streamed = "", {}
    for ch in _sse_data(_post(shapes_stack, "/v1/chat/completions", {**body, "stream": True}).text):
        delta = ch["choices"][0]["delta"] if ch.get("choices") else {}
        text += delta.get("content") or ""
        for tc in delta.get("tool_calls") or ():
            c = streamed.setdefault(tc["index"], ["", ""])
            c[0] += tc.get("function", {}).get("name") or ""
            c[1] += tc.get("function", {}).get("arguments") or ""
    assert text == msg["content"] and [(n, _loads(a)) for n, a in streamed.values()] == calls


def _resp_items(output: list[dict]) -> list[tuple]:
    out = []
    for o in output:
        if o["type"] == "message":
            out.append(("message", "".join(p["text"] for p in o["content"])))
        else:
            out.append((o["type"], o["name"], _loads(o["arguments"])))
    return out


def test_responses_streamed_and_whole_give_the_same_items(shapes_stack):
    body = {"model": MODEL, "max_output_tokens": 400, "input": USER, "tools": RESP_TOOLS}
    whole = _resp_items(_loads(_post(shapes_stack, "/v1/responses", body).text)["output"])
    assert whole == [("message", "Checking both. "), ("function_call", "get_weather", CALL_1),
                     ("function_call", "get_time", CALL_2)]
    events = _sse_data(_post(shapes_stack, "/v1/responses", {**body, "stream": True}).text)
    added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    assert added == ["message", "function_call", "function_call"]
    assert _resp_items(events[-1]["response"]["output"]) == whole


def test_big_integers_keep_their_digits_in_a_cut_call(shapes_stack):
    # cut inside the second call: the first is whole, the second's number cut (a prefix of it)
    k = _cut_inside(f'"n": {PAST_64}')
    anth = _loads(_post(shapes_stack, "/v1/messages", {"model": MODEL, "max_tokens": k, "messages": USER,
                                                        "tools": TOOLS}).text)
    assert [b["type"] for b in anth["content"]] == ["text", "tool_use", "tool_use"]
    assert anth["content"][1]["input"] == CALL_1 and anth["stop_reason"] == "max_tokens"
    assert anth["content"][2]["input"] == {} or str(PAST_64).startswith(str(anth["content"][2]["input"]["n"]))
    # cut inside the first call, after the big numbers: the non-streamed input closes what was generated
    k = _cut_inside('"u": ')
    anth = _loads(_post(shapes_stack, "/v1/messages", {"model": MODEL, "max_tokens": k, "messages": USER,
                                                        "tools": TOOLS}).text)
    assert anth["content"][1]["input"] == {"city": "Paris", "big": BIG, "id": PAST_53}
    chat = _loads(_post(shapes_stack, "/v1/chat/completions", {"model": MODEL, "max_tokens": k, "messages": USER,
                                                                "tools": OAI_TOOLS}).text)
    args = chat["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert f'"big": {BIG}, "id": {PAST_53}' in args
    resp = _loads(_post(shapes_stack, "/v1/responses", {"model": MODEL, "max_output_tokens": k, "input": USER,
                                                        "tools": RESP_TOOLS}).text)
    call = [o for o in resp["output"] if o["type"] == "function_call"][0]
    assert f'"big": {BIG}, "id": {PAST_53}' in call["arguments"] and call["status"] == "incomplete"


@pytest.mark.parametrize("text", ["\n", "  ", "\t\n "])
def test_a_whitespace_only_text_block_is_refused(claude, text):
    import anthropic

    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=MODEL, max_tokens=5, messages=[
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": text}]}])
    assert "messages.0.content.1.text: text content blocks must contain non-whitespace text" in str(e.value)
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=MODEL, max_tokens=5, messages=USER, system=[{"type": "text", "text": text}])
    assert "system.0.text" in str(e.value)
    # the answer's blocks sent back are accepted: no whitespace-only block among them
    first = claude.messages.create(model=MODEL, max_tokens=400, messages=USER, tools=TOOLS)
    back = [b.model_dump(exclude_none=True, exclude={"citations"}) for b in first.content]
    results = [{"type": "tool_result", "tool_use_id": b["id"], "content": "ok"}
               for b in back if b["type"] == "tool_use"]
    again = claude.messages.create(model=MODEL, max_tokens=5, tools=TOOLS, messages=[
        *USER, {"role": "assistant", "content": back}, {"role": "user", "content": results}])
    assert again.stop_reason == "max_tokens"
