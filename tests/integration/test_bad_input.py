"""Bad input through nginx: a clear API-shaped error, never a 5xx, never a leaked slot."""

from __future__ import annotations

import json
import socket

import pytest

from tests.support.h2conn import H2Conn
from tests.support.harness import anthropic_body, dumps
from tests.support.protocols import both_protocols

JSON = {"content-type": "application/json"}

# Every body error over HTTP/1.1 and over HTTP/2 + TLS; the framing tests below speak raw
# HTTP/1.x (null_stack_http1), with their HTTP/2 counterparts beside them.
null_stack = both_protocols("null_stack")
stack = both_protocols("stack")


def _assert_anthropic_error(r, status: int, kind: str, mentions: str | None = None) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == kind
    if mentions:
        assert mentions in body["error"]["message"], body["error"]["message"]


BAD_BODIES = [
    pytest.param(b"", 400, "invalid_request_error", "empty", id="empty"),
    pytest.param(b"{not json", 400, "invalid_request_error", None, id="not-json"),
    pytest.param(b"[1, 2]", 400, "invalid_request_error", None, id="array-top-level"),
    pytest.param(b'"text"', 400, "invalid_request_error", None, id="string-top-level"),
    pytest.param(dumps({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}), 400,
                 "invalid_request_error", "model", id="missing-model"),
    pytest.param(dumps({"model": 7, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}), 400,
                 "invalid_request_error", "model", id="model-not-string"),
    pytest.param(dumps({"model": "zccp-tiny", "messages": [{"role": "user", "content": "x"}]}), 400,
                 "invalid_request_error", "max_tokens", id="missing-max-tokens"),
    pytest.param(dumps({"model": "zccp-tiny", "max_tokens": "5", "messages": [{"role": "user", "content": "x"}]}),
                 400, "invalid_request_error", "max_tokens", id="max-tokens-string"),
    pytest.param(dumps({"model": "zccp-tiny", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}),
                 400, "invalid_request_error", "max_tokens", id="max-tokens-zero"),
    pytest.param(dumps({"model": "zccp-tiny", "max_tokens": 10**9, "messages": [{"role": "user", "content": "x"}]}),
                 400, "invalid_request_error", "max_tokens", id="max-tokens-over-cap"),
    pytest.param(dumps({"model": "zccp-tiny", "max_tokens": 5}), 400, "invalid_request_error", "messages",
                 id="missing-messages"),
    pytest.param(dumps({"model": "zccp-tiny", "max_tokens": 5, "messages": {"role": "user"}}), 400,
                 "invalid_request_error", "messages", id="messages-not-list"),
    pytest.param(dumps({"model": "zccp-tiny", "max_tokens": 5, "messages": []}), 400,
                 "invalid_request_error", "messages", id="messages-empty"),
    pytest.param(dumps({"model": "zccp-tiny", "max_tokens": 5, "messages": [{"role": "wizard", "content": "x"}]}),
                 400, "invalid_request_error", "role", id="unknown-role"),
    pytest.param(dumps({"model": "zccp-tiny", "max_tokens": 5, "messages": [{"role": "user", "content": 3}]}),
                 400, "invalid_request_error", "content", id="content-not-text"),
    pytest.param(dumps({"model": "no-such-model", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}),
                 404, "not_found_error", "no-such-model", id="unknown-model"),
]


@pytest.mark.parametrize("body,status,kind,mentions", BAD_BODIES)
def test_bad_body_gets_a_clear_error(null_stack, body, status, kind, mentions):
    r = null_stack.client().post("/v1/messages", content=body, headers=JSON)
    _assert_anthropic_error(r, status, kind, mentions)
    null_stack.assert_no_leaks()


def test_body_over_the_limit_is_413(null_stack_http1):
    null_stack = null_stack_http1   # HTTP/2: test_body_over_the_limit_over_h2_is_413_before_the_body
    big = anthropic_body("x" * (null_stack.cfg.limits.max_body_kb * 1024))
    r = null_stack.client().post("/v1/messages", content=dumps(big), headers=JSON)
    _assert_anthropic_error(r, 413, "request_too_large")
    null_stack.assert_no_leaks()


def test_chunked_body_over_the_limit_is_413(null_stack):
    payload = dumps(anthropic_body("y" * (null_stack.cfg.limits.max_body_kb * 1024)))

    def chunks():
        for i in range(0, len(payload), 65536):
            yield payload[i : i + 65536]

    r = null_stack.client().post("/v1/messages", content=chunks(), headers=JSON)
    assert r.status_code == 413
    null_stack.assert_no_leaks()


def test_prompt_longer_than_the_model_context_is_400(stack):
    n = stack.cfg.model.max_context
    r = stack.client().post("/v1/messages", json=anthropic_body("z" * n, max_tokens=16))
    _assert_anthropic_error(r, 400, "invalid_request_error", "too long")
    stack.assert_no_leaks()


def test_prompt_larger_than_the_slot_token_array_is_413(null_stack):
    tokens_cap = null_stack.cfg.shared_memory.tokens_kb * 1024 // 4
    r = null_stack.client().post("/v1/messages", json=anthropic_body("t" * (tokens_cap + 10)))
    _assert_anthropic_error(r, 413, "request_too_large", "tokens")
    null_stack.assert_no_leaks()


def test_wrong_method_and_content_type(null_stack):
    c = null_stack.client()
    r = c.get("/v1/messages")
    _assert_anthropic_error(r, 405, "invalid_request_error", "POST")
    assert r.headers["allow"] == "POST"
    r = c.post("/v1/messages", content=b"a=b", headers={"content-type": "application/x-www-form-urlencoded"})
    _assert_anthropic_error(r, 415, "invalid_request_error", "content-type")
    null_stack.assert_no_leaks()


def test_openai_route_answers_in_openai_shape(null_stack):
    r = null_stack.client().post("/v1/chat/completions", content=b"{oops", headers=JSON)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    null_stack.assert_no_leaks()


# --- input the real APIs refuse (issue 13, point 5) ---------------------------------------

_TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
REFUSED_ANTHROPIC = [
    pytest.param([{"role": "user", "content": [{"type": "nonsense"}]}], "Input tag 'nonsense'",
                 id="unknown-block-type"),
    pytest.param([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "4"}]}],
                 "unexpected `tool_use_id`", id="tool-result-without-tool-use"),
    pytest.param([{"role": "user", "content": "x"}, {"role": "assistant", "content": [_TOOL_USE]},
                  {"role": "user", "content": "y"}], "without `tool_result`", id="tool-use-unanswered"),
    pytest.param([{"role": "user", "content": [{"type": "text", "text": {"t": 1}}]}], "valid string",
                 id="text-not-string"),
    pytest.param([{"role": "system", "content": "x"}], "'user' or 'assistant'", id="role-system"),
]


@pytest.mark.parametrize("messages,mentions", REFUSED_ANTHROPIC)
def test_anthropic_refuses_what_the_real_api_refuses(null_stack, messages, mentions):
    body = dumps({"model": "zccp-tiny", "max_tokens": 5, "messages": messages})
    r = null_stack.client().post("/v1/messages", content=body, headers=JSON)
    _assert_anthropic_error(r, 400, "invalid_request_error", mentions)
    null_stack.assert_no_leaks()


def test_anthropic_merges_consecutive_turns_and_accepts_a_first_assistant_turn(null_stack):
    """The real API merges consecutive same-role turns and no longer requires a user turn first."""
    body = dumps({"model": "zccp-tiny", "max_tokens": 5, "messages": [
        {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}, {"role": "user", "content": "c"}]})
    r = null_stack.client().post("/v1/messages", content=body, headers=JSON)
    assert r.status_code == 200, r.text
    assert r.json()["type"] == "message"


_CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
REFUSED_OPENAI = [
    pytest.param([{"role": "user", "content": [{"type": "nonsense"}]}], "Invalid value: 'nonsense'", id="unknown-part"),
    pytest.param([{"role": "wizard", "content": "x"}], "Invalid value: 'wizard'", id="unknown-role"),
    pytest.param([{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "call_1", "content": "4"}],
                 "must be a response to a preceeding message", id="tool-without-tool-calls"),
    pytest.param([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [_CALL]},
                  {"role": "user", "content": "y"}], "did not have response messages", id="tool-call-unanswered"),
    pytest.param([{"role": "user", "content": [{"type": "text", "text": 5}]}], "expected a string",
                 id="text-not-string"),
]


@pytest.mark.parametrize("messages,mentions", REFUSED_OPENAI)
def test_openai_refuses_what_the_real_api_refuses(null_stack, messages, mentions):
    body = dumps({"model": "zccp-tiny", "max_tokens": 5, "messages": messages})
    r = null_stack.client().post("/v1/chat/completions", content=body, headers=JSON)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and mentions in err["message"], err
    null_stack.assert_no_leaks()


# --- HTTP framing: header limits, HTTP/1.0, pipelining -----------------------------------

def _raw(stack, data: bytes, timeout: float = 20) -> bytes:
    """Send `data` on one connection and read until the server closes it."""
    host, port = stack.cfg.server.listen.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _request(path: str, body: bytes, version: str = "1.1", close: bool = False, extra: str = "") -> bytes:
    head = (f"POST {path} HTTP/{version}\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}" + ("Connection: close\r\n" if close else "") + "\r\n")
    return head.encode() + body


def _responses(raw: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Split a byte stream of HTTP/1.x responses (Content-Length, chunked or to-close)."""
    out = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        if "content-length" in headers:
            n = int(headers["content-length"])
            body, raw = rest[:n], rest[n:]
        elif headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size_line, _, rest = rest.partition(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                if size == 0:
                    rest = rest[2:]                     # the CRLF after the last chunk (no trailers)
                    break
                body, rest = body + rest[:size], rest[size + 2:]
            raw = rest
        else:
            body, raw = rest, b""
        out.append((status, headers, body))
    return out


@pytest.mark.parametrize("path,openai", [("/v1/messages", False), ("/v1/chat/completions", True)])
def test_oversized_header_line_is_431_api_shaped(null_stack_http1, path, openai):
    null_stack = null_stack_http1
    body = dumps(anthropic_body("hi"))
    raw = _raw(null_stack, _request(path, body, extra=f"X-Big: {'b' * 64 * 1024}\r\n"))
    [(status, headers, payload)] = _responses(raw)
    assert status == 431
    err = json.loads(payload)
    if openai:
        assert err["error"]["type"] == "invalid_request_error" and "header" in err["error"]["message"]
    else:
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    null_stack.assert_no_leaks()


@pytest.mark.parametrize("stream", [False, True])
def test_http_1_0_request_is_answered_and_closed(null_stack_http1, stream):
    null_stack = null_stack_http1
    body = dumps(anthropic_body("hello", stream=stream))
    [(status, headers, payload)] = _responses(_raw(null_stack, _request("/v1/messages", body, version="1.0")))
    assert status == 200
    if stream:
        assert b"event: message_stop" in payload
    else:
        assert json.loads(payload)["type"] == "message"
    null_stack.assert_no_leaks()


def test_pipelined_requests_are_answered_in_order(null_stack_http1):
    null_stack = null_stack_http1
    a = dumps(anthropic_body("first"))
    bad = b"{oops"
    c = dumps(anthropic_body("third", stream=True))
    data = (_request("/v1/messages", a) + _request("/v1/chat/completions", bad)
            + _request("/v1/messages", c, close=True))
    got = _responses(_raw(null_stack, data))
    assert [g[0] for g in got] == [200, 400, 200]
    assert json.loads(got[0][2])["type"] == "message"
    assert "error" in json.loads(got[1][2])
    assert b"event: message_stop" in got[2][2]
    null_stack.assert_no_leaks()


def test_oversized_header_field_over_h2_closes_that_connection_only(null_stack_h2):
    """nginx's HTTP/2 module has no 494 (so no API-shaped 431): a header field beyond
    large_client_header_buffers ends the connection with GOAWAY; the stack serves on."""
    conn = H2Conn(null_stack_h2)
    try:
        sid = conn.request("/v1/messages", dumps(anthropic_body("hi")), headers={"x-big": "b" * 64 * 1024})
        st = conn.response(sid)
    finally:
        conn.close()
    assert st["status"] is None and conn.goaway is not None, (st, conn.goaway)
    assert null_stack_h2.client().post("/v1/messages", json=anthropic_body("hi")).status_code == 200
    null_stack_h2.assert_no_leaks()


def test_body_over_the_limit_over_h2_is_413_before_the_body(null_stack_h2):
    """nginx answers from the content-length alone and resets the stream (NO_ERROR): the
    client may stop sending. (httpx sends a whole body before it reads, so: raw h2.)"""
    big = dumps(anthropic_body("x" * (null_stack_h2.cfg.limits.max_body_kb * 1024)))
    conn = H2Conn(null_stack_h2)
    try:
        sid = conn.request("/v1/messages", big[:1000], length=len(big), end=False)
        st = conn.response(sid)
    finally:
        conn.close()
    assert st["status"] == 413, st
    assert json.loads(st["body"])["error"]["type"] == "request_too_large"
    null_stack_h2.assert_no_leaks()


@pytest.mark.parametrize("path,extra,body,status,api", [
    ("/v1/chat/completions", "Transfer-Encoding: chunked\r\n", b"{}", 400, "openai"),     # with Content-Length
    ("/v1/completions", "", b"", 400, "openai"),                                         # Content-Length: nope
    ("/v1/messages", "Transfer-Encoding: gzip\r\n", b"{}", 501, "anthropic"),
    ("/v1/responses", "X-Big: " + "b" * 64 * 1024 + "\r\n", b"{}", 431, "openai"),
    ("/no/such/path", "Transfer-Encoding: chunked\r\n", b"{}", 400, "anthropic"),       # any path of the server
    ("/v1/messages", "Transfer-Encoding: chunked\r\n", None, 400, "anthropic"),         # a chunk size not in hex
])
def test_what_nginx_refuses_itself_is_api_shaped_on_the_standalone(null_stack_http1, path, extra, body, status, api):
    """The standalone server's error_page: nginx's refusals before a location (its header
    lines) and in one (an unreadable chunked body) in the API's shape (zccp_server.conf)."""
    if body is None:
        data = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}Connection: close\r\n"
                "\r\nzz\r\n{}\r\n0\r\n\r\n").encode()
    elif not body:
        data = _request(path, b"{}", close=True).replace(b"Content-Length: 2", b"Content-Length: nope")
    else:
        data = _request(path, body, close=True, extra=extra)
    [(got, headers, payload)] = _responses(_raw(null_stack_http1, data))
    assert got == status and headers["content-type"] == "application/json", (got, headers, payload[:200])
    err = json.loads(payload)
    assert err["error"]["type"] == "invalid_request_error" and (api == "openai") == ("param" in err["error"]), err
    assert headers["x-request-id"]
    # a request line nginx cannot read: no path, its answer stays API-shaped (never a 500)
    [(got, headers, payload)] = _responses(_raw(null_stack_http1, b"GET /v1/messages HTTP/1.1 x\r\nHost: x\r\n\r\n"))
    assert got == 400 and json.loads(payload)["error"]["type"] == "invalid_request_error", (got, payload[:200])
    null_stack_http1.assert_no_leaks()
