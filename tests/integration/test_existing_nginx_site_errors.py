"""Every status nginx itself produces on ZCCP's paths in an operator's server, in the
request's API shape (docs/existing-nginx.md, "What ZCCP's locations take from your
server"): the site's limit_req and limit_conn with status 503 (retry-after), a chunked body
nginx cannot read (400), and what nginx refuses before it picks a location (400 for
Content-Length with Transfer-Encoding, 494 for a header line too long, 501 for an unknown
Transfer-Encoding), API-shaped only where the server routes them to @zccp_request_error; the
site's own paths keep their own pages. No location of ZCCP's proxies, so nginx has no 502
or 504 of its own there: the engine down is ZCCP's own 503."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.existing_nginx import Existing
from tests.support.existing_nginx_site import APP_HEALTH, ERROR_PAGE, include_zccp, operator_site
from tests.support.harness import Stack, anthropic_body

# X-Limit-Me: one request a minute per value; X-Conn-Key: one request in progress per value
# (a request without the header is never limited: the key is empty). Both refuse with 503.
LIMITS = ("limit_req_zone $http_x_limit_me zone=site:1m rate=1r/m;\n"
          "limit_conn_zone $http_x_conn_key zone=conns:1m;\n")
SITE = """\
server {{
    listen {listen} default_server;
    limit_req zone=site;
    limit_req_status 503;
    limit_conn conns 1;
    error_page 502 503 504 /50x.html;
    location / {{
        proxy_pass http://127.0.0.1:{upstream};
    }}
    location = /50x.html {{
        root {p}/www;
    }}
}}
"""
ROUTE_REQUEST_ERRORS = ("    error_page 400 414 501 /zccp/request-error;\n"
                        "    error_page 494 = /zccp/request-error?status=494;\n")
CHAT = {"model": "zccp-tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
BIG_HEADER = "X-Big: " + "b" * 64 * 1024 + "\r\n"
CL_AND_TE = "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n"
# (method, path, extra headers, the API whose shape it answers in): every path ZCCP serves
PATHS = [
    ("POST", "/v1/messages", {}, "anthropic"),
    ("POST", "/v1/chat/completions", {}, "openai"),
    ("POST", "/v1/completions", {}, "openai"),
    ("POST", "/v1/responses", {}, "openai"),
    ("GET", "/v1/models", {"anthropic-version": "2023-06-01"}, "anthropic"),
    ("GET", "/v1/models", {}, "openai"),
    ("GET", "/v1/models/zccp-tiny", {"anthropic-version": "2023-06-01"}, "anthropic"),
]


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[Existing, Stack]]:
    with operator_site(tmp_path, SITE, LIMITS) as es:
        yield es


def _shape(r: httpx.Response | tuple[int, dict[str, str], bytes], api: str, status: int, kind: str) -> dict:
    """The API error `r` must be (status, JSON, the API's shape); its body."""
    code, headers, body = (r.status_code, r.headers, r.content) if isinstance(r, httpx.Response) else r
    assert code == status and headers["content-type"] == "application/json", (code, headers, body[:300])
    err = json.loads(body)
    if api == "anthropic":
        assert err["type"] == "error" and err["error"]["type"] == kind, err
    else:
        assert set(err["error"]) == {"message", "type", "param", "code"} and err["error"]["type"] == kind, err
    assert headers["x-request-id"]
    return err


def _raw(e: Existing, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """One request on its own connection (sent with Connection: close): status, headers, body."""
    host, port = e.listen.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(data)
        raw = b""
        while chunk := conn.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        size, _, rest = body.partition(b"\r\n")
        body = rest[:int(size, 16)]
    return int(lines[0].split()[1]), headers, body


def _head(method: str, path: str, extra: str = "") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
            "Connection: close\r\n\r\n").encode()


def test_limit_req_503_is_api_shaped_on_every_zccp_path_and_the_site_keeps_its_page(site):
    e, s = site
    include_zccp(e, s)
    key = {"x-limit-me": "k"}
    with httpx.Client(base_url=f"http://{e.listen}", timeout=30) as c:
        assert c.get("/zccp/health", headers=key).status_code == 200   # the key's one request a minute
        for method, path, extra, api in PATHS:
            body = anthropic_body("hi", max_tokens=4) if path == "/v1/messages" else CHAT
            r = c.request(method, path, json=body if method == "POST" else None, headers={**key, **extra})
            err = _shape(r, api, 503, "overloaded_error" if api == "anthropic" else "server_error")
            assert r.headers["retry-after"] == "1", (path, r.headers)
            assert api == "anthropic" or err["error"]["code"] == "server_overloaded", err
        # the site's own paths: its error_page, as before ZCCP
        own = c.get("/health", headers=key)
        assert own.status_code == 503 and own.text == ERROR_PAGE
        assert c.get("/health").text == APP_HEALTH
    # Without the server-level line, what nginx refuses before it picks a location stays its
    # own page even on ZCCP's paths: a location's error_page never sees it.
    for extra, status in ((CL_AND_TE, 400), (BIG_HEADER, 400), ("Transfer-Encoding: gzip\r\n", 501)):
        code, headers, body = _raw(e, _head("POST", "/v1/messages", extra))
        assert code == status and headers["content-type"] == "text/html", (code, headers, body[:200])


def test_limit_conn_503_while_a_request_is_in_progress(site):
    e, s = site
    include_zccp(e, s)
    held = json.dumps(anthropic_body("held", max_tokens=4)).encode()
    host, port = e.listen.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as first, \
            httpx.Client(base_url=f"http://{e.listen}", timeout=30) as c:
        # nginx says 100 Continue once ZCCP's handler reads the body: past limit_conn, counted
        first.sendall(_head("POST", "/v1/messages", f"X-Conn-Key: a\r\nExpect: 100-continue\r\n"
                                                    f"Content-Length: {len(held)}\r\n"))
        got = b""
        while b"\r\n\r\n" not in got:
            got += first.recv(4096)
        assert got.startswith(b"HTTP/1.1 100 Continue"), got
        for path, body, api in (("/v1/messages", anthropic_body("hi", max_tokens=4), "anthropic"),
                                ("/v1/chat/completions", CHAT, "openai")):
            r = c.post(path, json=body, headers={"x-conn-key": "a"})
            _shape(r, api, 503, "overloaded_error" if api == "anthropic" else "server_error")
            assert r.headers["retry-after"] == "1"
        # only the key in progress is refused; the held request is then served
        assert c.post("/v1/chat/completions", json=CHAT, headers={"x-conn-key": "b"}).status_code == 200
        first.sendall(held)
        answer = b""
        while chunk := first.recv(65536):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]


def test_unreadable_chunked_body_is_400_and_the_engine_down_is_zccps_own_503(site):
    e, s = site
    include_zccp(e, s)
    bad_chunks = b"zz\r\n{}\r\n0\r\n\r\n"   # a chunk size that is not hex
    for path, api in (("/v1/messages", "anthropic"), ("/v1/chat/completions", "openai"), ("/v1/responses", "openai")):
        got = _raw(e, _head("POST", path, "Transfer-Encoding: chunked\r\n") + bad_chunks)
        _shape(got, api, 400, "invalid_request_error")
    assert s.engine is not None
    s.engine.stop()
    with httpx.Client(base_url=f"http://{e.listen}", timeout=30) as c:
        for path, body, api in (("/v1/messages", anthropic_body("down", max_tokens=4), "anthropic"),
                                ("/v1/chat/completions", CHAT, "openai")):
            r = c.post(path, json=body)
            err = _shape(r, api, 503, "overloaded_error" if api == "anthropic" else "server_error")
            assert "engine" in (err["error"]["message"]), err


def test_refusals_before_a_location_are_api_shaped_where_the_server_routes_them(site):
    e, s = site
    include_zccp(e, s, ROUTE_REQUEST_ERRORS)
    cases = [  # (path, extra header lines, status answered, the API's shape)
        ("/v1/messages", CL_AND_TE, 400, "anthropic"),
        ("/v1/chat/completions", CL_AND_TE, 400, "openai"),
        ("/v1/completions", "Content-Length: nope\r\n", 400, "openai"),
        ("/v1/responses", BIG_HEADER, 431, "openai"),
        ("/v1/messages", BIG_HEADER, 431, "anthropic"),
        ("/v1/messages", "Transfer-Encoding: gzip\r\n", 501, "anthropic"),
        ("/v1/models", "Anthropic-Version: 2023-06-01\r\n" + CL_AND_TE, 400, "anthropic"),
        ("/v1/models/zccp-tiny", CL_AND_TE, 400, "openai"),
    ]
    for path, extra, status, api in cases:
        _shape(_raw(e, _head("POST", path, extra)), api, status, "invalid_request_error")
    # nginx could not read the request line (no path to tell ZCCP's from the site's): its own page
    long_uri = _raw(e, _head("GET", "/v1/models/" + "m" * 64 * 1024))
    assert long_uri[0] == 414 and long_uri[1]["content-type"] == "text/html", long_uri
    bad_line = _raw(e, b"GET /v1/messages HTTP/1.1 x\r\nHost: x\r\n\r\n")
    assert bad_line[0] == 400 and bad_line[1]["content-type"] == "text/html", bad_line
    # the target itself is no path for clients
    _shape(httpx.get(f"http://{e.listen}/zccp/request-error", timeout=10), "anthropic", 404, "not_found_error")
    # the site's own paths: nginx's own pages, as without the line
    for extra, status, text in ((CL_AND_TE, 400, b"400 Bad Request"),
                                (BIG_HEADER, 400, b"Request Header Or Cookie Too Large"),
                                ("Transfer-Encoding: gzip\r\n", 501, b"501 Not Implemented")):
        code, headers, body = _raw(e, _head("POST", "/health", extra))
        assert code == status and headers["content-type"] == "text/html" and text in body, (code, body[:300])
    assert httpx.get(f"http://{e.listen}/health", timeout=10).text == APP_HEALTH
