"""SSE through the slot: exact framing, event order, incremental delivery, large responses."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.harness import anthropic_body
from tests.support.protocols import both_protocols

# SSE over HTTP/1.1 (chunked) and over HTTP/2 + TLS (DATA frames): the same events.
null_stack = both_protocols("null_stack")

SLOW = {"backend": "null", "null_token_delay_ms": 15, "null_reply": "tick " * 40}


def _events(raw: str) -> list[tuple[str | None, str]]:
    """Split an SSE body into (event, data) pairs, insisting on exact framing."""
    assert raw.endswith("\n\n")
    out = []
    for block in raw[:-2].split("\n\n"):
        lines = block.split("\n")
        event = None
        if lines[0].startswith("event: "):
            event = lines.pop(0)[len("event: "):]
        assert len(lines) == 1 and lines[0].startswith("data: "), block
        out.append((event, lines[0][len("data: "):]))
    return out


def test_anthropic_event_sequence(null_stack):
    r = null_stack.client().post("/v1/messages", json=anthropic_body("hi", max_tokens=50, stream=True))
    assert r.status_code == 200 and r.http_version == null_stack.protocol
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["x-accel-buffering"] == "no"
    events = _events(r.text)
    names = [e for e, _ in events]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    for name, data in events:
        assert json.loads(data)["type"] == name
    text = "".join(json.loads(d)["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == "Hello from the ZCCP null backend."
    delta = json.loads(events[-2][1])
    assert delta["delta"]["stop_reason"] == "end_turn"
    assert delta["usage"]["output_tokens"] == len(text)


def test_openai_chunk_sequence(null_stack):
    body = {"model": "zccp-tiny", "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}]}
    r = null_stack.client().post("/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _events(r.text)
    assert all(e is None for e, _ in events)
    assert events[-1][1] == "[DONE]"
    chunks = [json.loads(d) for _, d in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "Hello fr"


def test_first_events_arrive_before_generation_ends(make_stack, protocol):
    s = make_stack({"model": SLOW, "shared_memory": {"segment_count": 1}}, tls=protocol == "h2tls")
    with s.client() as c, \
            c.stream("POST", "/v1/messages", json=anthropic_body("x", max_tokens=200, stream=True)) as r:
        it = r.iter_text()
        first = next(it)
        assert "message_start" in first
        # The engine is still generating: the slot is not DONE yet.
        reader = s.arena()
        try:
            assert reader.slot(0).state in (3, 4)  # RUNNING or STREAMING
        finally:
            reader.close()
        rest = "".join(it)
    assert "message_stop" in rest
    s.assert_no_leaks()


def test_gzip_does_not_buffer_sse(null_stack):
    r = null_stack.client().post("/v1/messages", json=anthropic_body("z", stream=True),
                                 headers={"accept-encoding": "gzip"})
    assert r.status_code == 200
    assert "content-encoding" not in r.headers
    assert r.text.startswith("event: message_start")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_response_larger_than_the_ring_is_complete(make_stack, stream, protocol):
    reply = "".join(f"{i:05d} " for i in range(20000))  # 120 KB of text, > the 64 KiB ring
    s = make_stack({"model": {"backend": "null", "null_reply": reply, "max_context": 200000},
                    "limits": {"max_tokens_cap": 200000}}, tls=protocol == "h2tls")
    r = s.client().post("/v1/messages", json=anthropic_body("big", max_tokens=len(reply), stream=stream))
    assert r.status_code == 200
    if stream:
        events = _events(r.text)
        text = "".join(json.loads(d)["delta"]["text"] for n, d in events if n == "content_block_delta")
        assert len(r.content) > 4 * 64 * 1024
    else:
        text = r.json()["content"][0]["text"]
        assert int(r.headers["content-length"]) > 64 * 1024
    assert text == reply
    s.assert_no_leaks()


def test_a_long_generation_does_not_hold_up_a_short_one(make_stack):
    """The model thread interleaves generations token by token."""
    import threading

    s = make_stack({"model": SLOW, "shared_memory": {"segment_count": 4}})
    long_started, long_done = threading.Event(), threading.Event()

    def long_request():
        with httpx.Client(base_url=s.base_url, timeout=60) as c, \
                c.stream("POST", "/v1/messages", json=anthropic_body("long", max_tokens=150, stream=True)) as r:
            for _ in r.iter_bytes():
                long_started.set()
        long_done.set()

    t = threading.Thread(target=long_request)
    t.start()
    try:
        assert long_started.wait(30)
        short = s.client().post("/v1/messages", json=anthropic_body("short", max_tokens=3))
        assert short.status_code == 200
        assert not long_done.is_set()   # the short answer came back while the long one still streams
    finally:
        t.join(60)
    assert long_done.is_set()
    s.assert_no_leaks()
