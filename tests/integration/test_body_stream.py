"""Bodies above nginx's decode limit go from the client socket straight into the slot
(zccp.core.body): the slot holds exactly the bytes sent, a slow or vanishing upload frees its
slot, and chunked bodies still take the whole-body path. Over HTTP/2 (no request socket in
nginx's Lua module) the same bodies take nginx's own in-memory body buffer into the slot:
the same bytes, the same answers."""

from __future__ import annotations

import hashlib
import socket
import time

from tests.support.harness import anthropic_body, dumps
from tests.support.protocols import both_protocols
from zccp.transport.abi import State
from zccp.cache.fingerprint import DECODE_LIMIT

JSON = {"content-type": "application/json"}

null_stack = both_protocols("null_stack")


def _big_body(size: int) -> bytes:
    """A valid request of about `size` bytes whose prompt stays small (the byte-level
    tokenizer makes a token of every prompt byte): JSON whitespace makes up the rest."""
    head = dumps(anthropic_body("streamed body", max_tokens=4))
    return head[:-1] + b" " * max(size - len(head), 0) + head[-1:]


def test_a_large_body_arrives_whole_in_the_slot(null_stack):
    body = _big_body(3 * DECODE_LIMIT) + b"  "
    assert len(body) > DECODE_LIMIT
    r = null_stack.client().post("/v1/messages", content=body, headers=JSON)
    assert r.status_code == 200, r.text
    assert r.http_version == null_stack.protocol
    digest = hashlib.sha256(body).digest()
    assert r.headers["x-zccp-context-id"] == digest[:8].hex()
    reader = null_stack.arena()
    try:
        [slot] = [s for s in reader.slots() if s.context_id == digest[:8].hex()]
        assert slot.payload_len == len(body)
        assert reader.payload(slot.index) == body
        assert slot.sha256 == digest
        assert slot.state == State.FREE
    finally:
        reader.close()
    null_stack.assert_no_leaks()


def test_expect_100_continue_is_honoured(null_stack):
    body = _big_body(2 * DECODE_LIMIT)
    r = null_stack.client().post("/v1/messages", content=body, headers={**JSON, "expect": "100-continue"})
    assert r.status_code == 200, r.text
    assert r.json()["type"] == "message"
    null_stack.assert_no_leaks()


def test_a_chunked_large_body_takes_the_whole_body_path(null_stack):
    body = _big_body(2 * DECODE_LIMIT)

    def chunks():
        for i in range(0, len(body), 10_000):
            yield body[i : i + 10_000]

    r = null_stack.client().post("/v1/messages", content=chunks(), headers=JSON)
    assert r.status_code == 200, r.text
    assert r.headers["x-zccp-context-id"] == hashlib.sha256(body).digest()[:8].hex()
    null_stack.assert_no_leaks()


def _raw_post(stack, path: str, body: bytes, send: int) -> socket.socket:
    """A POST that declares len(body) bytes and sends only the first `send` of them."""
    host, port = stack.cfg.server.listen.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=30)
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    s.sendall(head + body[:send])
    return s


def _claimed(stack) -> int:
    return int(stack.health()["slots_claimed"])


def test_an_upload_that_stops_gets_408_and_frees_its_slot(make_stack):
    s = make_stack({"model": {"backend": "null"}, "limits": {"request_timeout_ms": 1500}})
    body = _big_body(2 * DECODE_LIMIT)
    conn = _raw_post(s, "/v1/messages", body, DECODE_LIMIT)
    try:
        conn.settimeout(20)
        reply = b""
        while True:      # Connection: close: the answer ends with the connection
            chunk = conn.recv(65536)
            if not chunk:
                break
            reply += chunk
    finally:
        conn.close()
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b'"invalid_request_error"' in reply and b"not received in time" in reply
    s.assert_no_leaks()
    # and the stack still answers large bodies
    r = s.client().post("/v1/messages", content=body, headers=JSON)
    assert r.status_code == 200, r.text


def test_a_client_that_leaves_mid_upload_frees_its_slot(null_stack_http1):
    null_stack = null_stack_http1   # a raw HTTP/1.1 socket; HTTP/2: test_an_h2_stream_reset_mid_upload
    body = _big_body(4 * DECODE_LIMIT)
    conn = _raw_post(null_stack, "/v1/messages", body, DECODE_LIMIT)
    deadline = time.monotonic() + 10
    while _claimed(null_stack) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)      # the handler has claimed a slot and is reading into it
    assert _claimed(null_stack) >= 1
    conn.close()
    null_stack.assert_no_leaks()
    r = null_stack.client().post("/v1/messages", content=body, headers=JSON)
    assert r.status_code == 200, r.text


# -- HTTP/2: no request socket, so uploads go through nginx's body buffer (zccp.core.body) ---------


def test_an_h2_upload_that_stops_gets_408(make_stack):
    from tests.support.h2conn import H2Conn

    s = make_stack({"model": {"backend": "null"}, "limits": {"request_timeout_ms": 1500}}, tls=True)
    body = _big_body(2 * DECODE_LIMIT)
    conn = H2Conn(s)
    try:
        sid = conn.request("/v1/messages", body[:DECODE_LIMIT // 2], length=len(body), end=False)
        other = conn.request("/v1/messages", body)        # the same connection's next stream
        stalled, done = conn.response(sid), conn.response(other)
    finally:
        conn.close()
    assert stalled["status"] == 408, stalled
    assert b'"invalid_request_error"' in stalled["body"] and b"not received in time" in stalled["body"]
    assert done["status"] == 200 and b'"type": "message"' in done["body"].replace(b'":"', b'": "'), done
    s.assert_no_leaks()


def test_an_h2_stream_reset_mid_upload_leaves_nothing(make_stack):
    from tests.support.h2conn import H2Conn

    s = make_stack({"model": {"backend": "null"}}, tls=True)
    body = _big_body(4 * DECODE_LIMIT)
    conn = H2Conn(s)
    try:
        sid = conn.request("/v1/messages", body[:DECODE_LIMIT // 2], length=len(body), end=False)
        conn.reset(sid)
        other = conn.request("/v1/messages", body)
        assert conn.response(other)["status"] == 200
    finally:
        conn.close()
    s.assert_no_leaks()
    r = s.client().post("/v1/messages", content=body, headers=JSON)
    assert r.status_code == 200 and r.http_version == "HTTP/2", r.text
