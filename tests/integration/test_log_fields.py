"""The zccp_json log's context id on answers no engine gave (issue 31, item 11): a 503 once
the engine is gone still names the request's context (the first 8 bytes of the body's
SHA-256, what the engine would have given it), in X-ZCCP-Context-ID and so in the log's
context_id. Real nginx, a real engine (null backend), stopped mid-test. nginx's own 413 (a body it never
read) and 431 (header lines too large) carry the request id in the content hash's place."""

from __future__ import annotations

import hashlib
import json
import socket
import time
from collections.abc import Iterator

import pytest

from tests.support.harness import Stack
from zccp.config.sections import LoggingConfig


@pytest.fixture
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("logfields"), {"model": {"backend": "null", "name": "zccp-null"}})
    try:
        yield s.start()
    finally:
        s.stop()


def test_a_503_without_an_engine_carries_the_context_id(stack: Stack) -> None:
    body = json.dumps({"model": "zccp-null", "max_tokens": 8,
                       "messages": [{"role": "user", "content": "hello"}]}).encode()
    with stack.client() as c:
        ok = c.post("/v1/messages", content=body, headers={"content-type": "application/json"})
        assert ok.status_code == 200
        stack.stop_engine(crash=True)
        r = c.post("/v1/messages", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 503, r.text
    want = hashlib.sha256(body).hexdigest()[:16]
    assert ok.headers["x-zccp-context-id"] == want          # the engine's own rule
    assert r.headers.get("x-zccp-context-id") == want, r.headers


def _log_lines(stack: Stack) -> list[dict]:
    return [json.loads(ln) for ln in stack.log("nginx-access.log").splitlines() if ln.strip()]


def _raw(stack: Stack, data: bytes) -> bytes:
    """One HTTP/1.1 exchange on its own connection, read until nginx closes it."""
    host, port = stack.cfg.server.listen.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _head(raw: bytes) -> tuple[int, dict[str, str]]:
    lines = raw.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    return int(lines[0].split()[1]), {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}


def test_nginx_own_413_431_and_400_carry_the_request_id_as_context_id(stack: Stack) -> None:
    """A body nginx refused from its Content-Length (never read: no content hash) and a header
    line over large_client_header_buffers: the answer's X-ZCCP-Context-ID and the log line's
    context_id are the request id; so is the log's for nginx's own 400, which runs no Lua; an
    answered request keeps the engine's hash."""
    over = stack.cfg.limits.max_body_kb * 1024 + 1
    with stack.client() as c:
        ok = c.post("/v1/messages", json={"model": "zccp-null", "max_tokens": 8,
                                          "messages": [{"role": "user", "content": "hi"}]})
        # only the head goes out: nginx answers from the Content-Length and closes
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"X-Request-ID: big-body-1\r\nContent-Length: {over}\r\n\r\n").encode()
    status, headers = _head(_raw(stack, head + b"{"))
    assert status == 413 and headers["x-request-id"] == "big-body-1", headers
    assert headers["x-zccp-context-id"] == "big-body-1", headers
    big_header = (b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 2\r\nX-Big: " + b"b" * 64 * 1024 + b"\r\n\r\n{}")
    status431, headers431 = _head(_raw(stack, big_header))
    assert status431 == 431, headers431
    # nginx's own 400 with no Lua at all (an HTTP/1.1 request without Host): no header names
    # a context, the log line's context_id is the request id all the same (zccp_http.conf's map)
    status400, headers400 = _head(_raw(stack, b"POST /v1/messages HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"))
    assert status400 == 400 and "x-zccp-context-id" not in headers400, headers400
    # nginx logs a request it closes only after its lingering close: the client may have the
    # answer first, so wait for the line (a bound on the wait, not a timing being tested)
    end = time.monotonic() + 20
    while True:
        lines = _log_lines(stack)
        by_status = {(x["uri"], x["status"]): x for x in lines}
        if {("/v1/messages", 431), ("/v1/messages", 400)} <= by_status.keys() or time.monotonic() > end:
            break
        time.sleep(0.1)
    l413 = by_status[("/v1/chat/completions", 413)]
    assert (l413["request_id"], l413["context_id"]) == ("big-body-1", "big-body-1"), l413
    l431 = by_status.get(("/v1/messages", 431))
    assert l431, lines
    assert l431["context_id"] and l431["context_id"] == l431["request_id"], l431
    l400 = by_status.get(("/v1/messages", 400))
    assert l400 and l400["context_id"] and l400["context_id"] == l400["request_id"], lines
    l200 = next(x for x in lines if x["request_id"] == ok.headers["x-request-id"])
    assert l200["context_id"] == ok.headers["x-zccp-context-id"] and len(l200["context_id"]) == 16, l200


def _ask(stack: Stack, ids: list[str]) -> None:
    with stack.client() as c:
        for rid in ids:
            r = c.post("/v1/messages", json={"model": "zccp-null", "max_tokens": 4,
                                             "messages": [{"role": "user", "content": rid}]},
                       headers={"x-request-id": rid})
            assert r.status_code == 200, r.text


def test_a_buffered_access_log_loses_no_line_at_reload_or_stop(tmp_path_factory: pytest.TempPathFactory) -> None:
    # config.yaml ships logging.access_flush_ms > 0 (the harness turns the buffer off); here
    # the longest flush time, so that only the reload and the stop can write the lines
    assert LoggingConfig().access_flush_ms > 0
    s = Stack(tmp_path_factory.mktemp("logbuffer"),
              {"model": {"backend": "null", "name": "zccp-null"}, "logging": {"access_flush_ms": 60_000}})
    s.start()
    try:
        _ask(s, [f"before-reload-{i}" for i in range(3)])
        assert "before-reload-" not in s.log("nginx-access.log")   # held in the workers' buffers
        s.hup_nginx(30)   # the old workers write what they hold as they exit
        assert all(f"before-reload-{i}" in s.log("nginx-access.log") for i in range(3))
        _ask(s, [f"before-stop-{i}" for i in range(3)])
        assert "before-stop-" not in s.log("nginx-access.log")
    finally:
        s.stop()
    assert all(f"before-stop-{i}" in s.log("nginx-access.log") for i in range(3))   # the stop writes them too
