"""The batch scheduler's bounds, live: a full model queue is a 429 with Retry-After in
each API's shape, and one client that stops reading never holds up the others."""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import httpx

SLOW = {"backend": "null", "null_token_delay_ms": 10, "null_reply": "slow " * 100,
        "max_batch": 1, "max_queue": 1}


def _gauge(stack, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", stack.admin_client().get("/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def _wait_for(cond, what: str, timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.05)


def _stream_in_background(stack, body: dict, first: threading.Event, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        with httpx.Client(base_url=stack.base_url, timeout=30) as c, c.stream("POST", "/v1/messages", json=body) as r:
            for _ in r.iter_bytes():
                first.set()
                if stop.is_set():
                    return
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_full_model_queue_is_429_with_retry_after(make_stack):
    s = make_stack({"model": SLOW})
    body = {"model": "zccp-tiny", "max_tokens": 500, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    running, waiting, stop = threading.Event(), threading.Event(), threading.Event()
    threads = [_stream_in_background(s, body, running, stop)]
    assert running.wait(20)
    threads.append(_stream_in_background(s, body, waiting, stop))
    _wait_for(lambda: _gauge(s, "zccp_engine_queue_waiting") == 1, "the second request never waited")
    plain = {**body, "stream": False}
    a = s.client().post("/v1/messages", json=plain)
    assert a.status_code == 429 and a.headers["retry-after"] == "1"
    assert a.json()["error"]["type"] == "rate_limit_error" and "queue" in a.json()["error"]["message"]
    o = s.client().post("/v1/chat/completions", json={"model": "zccp-tiny", "max_tokens": 5,
                                                      "messages": [{"role": "user", "content": "x"}]})
    assert o.status_code == 429 and o.headers["retry-after"] == "1"
    assert o.json()["error"]["code"] == "rate_limit_exceeded"
    stop.set()
    for t in threads:
        t.join(30)
    s.assert_no_leaks(10)


def _unread_stream(stack, body: bytes) -> socket.socket:
    """A streaming request from a client that never reads: a tiny receive buffer (set
    before connecting, so the kernel does not grow it) fills at once."""
    host, port = stack.cfg.server.listen.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return sock


def test_a_client_that_stops_reading_holds_up_nobody(make_stack):
    reply = "".join(f"{i:06d} " for i in range(100000))         # ~11 MB of SSE: more than nginx's socket buffer
    s = make_stack({"model": {"backend": "null", "null_reply": reply, "max_context": 800000},
                    "limits": {"max_tokens_cap": 800000, "request_timeout_ms": 60000}})
    sock = _unread_stream(s, json.dumps({"model": "zccp-tiny", "max_tokens": 700000, "stream": True,
                                         "messages": [{"role": "user", "content": "x"}]}).encode())
    try:
        _wait_for(lambda: _gauge(s, "zccp_engine_parked") == 1, "the unread stream never filled its ring", 60)
        for _ in range(3):                                        # streams go through the model thread
            ok = s.client().post("/v1/messages", json={"model": "zccp-tiny", "max_tokens": 8, "stream": True,
                                                       "messages": [{"role": "user", "content": "y"}]})
            assert ok.status_code == 200 and "message_stop" in ok.text
        # (the unread stream cannot have finished: its 11 MB do not fit the buffers)
    finally:
        sock.close()
    s.assert_no_leaks(10)
    _wait_for(lambda: _gauge(s, "zccp_engine_parked") == 0, "the abandoned stream stayed parked")
