"""The operator's nginx for tests/integration/test_existing_nginx.py (split from it): Debian's
nginx.conf layout under a private prefix, the site, what docs/existing-nginx.md adds to the
server, and the clients that load it through the reloads."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.harness import anthropic_body, tls_client_context
from zccp.ops.stack import Service

REPO = Path(__file__).resolve().parents[2]
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
MODULES_ENABLED = Path("/etc/nginx/modules-enabled")
AS_ROOT = os.geteuid() == 0
WORKER_USER = "www-data"     # Debian's nginx user: the workers run as it when the test runs as root
WORKERS = 2
CLIENTS = 6                  # concurrent clients during the reloads
RELOADS = 5
INDEX = "<h1>the static site</h1>\n"
UPSTREAM_TEXT = "hello from the upstream app\n"

# Debian's /etc/nginx/nginx.conf (nginx 1.22, bookworm), paths moved under the test's prefix.
NGINX_CONF = """\
{user_line}
worker_processes {workers};
pid {p}/nginx.pid;
error_log {p}/logs/error.log;
include /etc/nginx/modules-enabled/*.conf;

events {{
    worker_connections 768;
}}

http {{
    sendfile on;
    tcp_nopush on;
    types_hash_max_size 2048;
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    # Debian's nginx keeps these in /var/lib/nginx/; this one has its own.
    client_body_temp_path {p}/tmp/body;
    proxy_temp_path {p}/tmp/proxy;
    fastcgi_temp_path {p}/tmp/fastcgi;
    uwsgi_temp_path {p}/tmp/uwsgi;
    scgi_temp_path {p}/tmp/scgi;
    access_log {p}/logs/access.log;
    gzip on;
    include {p}/conf.d/*.conf;
    include {p}/sites-enabled/*;
}}
"""

SITE = """\
server {{
    listen {listen} ssl http2;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    root {p}/www;
    index index.html;
    location / {{
        try_files $uri $uri/ =404;
    }}
    location /app/ {{
        proxy_pass http://127.0.0.1:{upstream};
    }}
    # The operator's own API prefix: ZCCP's exact locations must leave the rest of it alone.
    location /v1/ {{
        proxy_pass http://127.0.0.1:{upstream};
    }}
}}
"""


# What docs/existing-nginx.md adds to the server block: the include, and (optional) ZCCP's
# JSON log beside the server's own (a server-level access_log replaces the inherited one).
ZCCP_IN_SERVER = """\
    include {out}/zccp_server.conf;
    access_log {p}/logs/access.log;
    access_log {p}/logs/zccp.log zccp_json if=$zccp_log;
}}
"""


@dataclass
class Existing:
    """The operator's nginx: a prefix laid out like /etc/nginx, its master, its address."""
    prefix: Path
    listen: str
    upstream: Service
    nginx: Service | None = None

    @property
    def conf(self) -> Path:
        return self.prefix / "nginx.conf"

    @property
    def url(self) -> str:
        return f"https://{self.listen}"

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([NGINX, "-p", str(self.prefix), "-c", str(self.conf), *args],
                              capture_output=True, text=True, timeout=60)

    def workers(self) -> set[int]:
        """The master's live worker processes (zombies not yet reaped are gone already)."""
        assert self.nginx is not None and self.nginx.proc is not None
        master, out = self.nginx.proc.pid, set()
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[1]) == master:
                out.add(int(d.name))
        return out

    def error_log(self) -> str:
        return (self.prefix / "logs" / "error.log").read_text(errors="replace")


def _wait(cond: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def _site_up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2, verify=tls_client_context()).status_code == 200
    except httpx.HTTPError:
        return False


def _check_sites(url: str) -> None:
    r = httpx.get(url + "/", timeout=10, verify=tls_client_context())
    assert r.status_code == 200 and r.text == INDEX, (r.status_code, r.text)
    r = httpx.get(url + "/app/hello.txt", timeout=10, verify=tls_client_context())
    assert r.status_code == 200 and r.text == UPSTREAM_TEXT, (r.status_code, r.text)


def _chat_body(text: str, **extra: object) -> dict:
    return {"model": "zccp-tiny", "max_tokens": 4, "messages": [{"role": "user", "content": text}], **extra}


# One request of each kind the clients send: (method, path, body or None, check of the response).
def _requests(client_no: int, n: int) -> list[tuple[str, str, dict | None, Callable[[httpx.Response], bool]]]:
    text = f"reload client {client_no} request {n // 12}"   # each kind twice per text: a miss, then a hit
    return [
        ("POST", "/v1/messages", anthropic_body(text, max_tokens=4), lambda r: r.json()["type"] == "message"),
        ("POST", "/v1/chat/completions", _chat_body(text), lambda r: r.json()["object"] == "chat.completion"),
        ("POST", "/v1/messages", anthropic_body(text + " stream", max_tokens=16, stream=True),
         lambda r: "event: message_stop" in r.text),
        ("GET", "/", None, lambda r: r.text == INDEX),
        ("GET", "/app/hello.txt", None, lambda r: r.text == UPSTREAM_TEXT),
        ("GET", "/zccp/health", None, lambda r: r.json()["status"] == "ok"),
    ]


KINDS = ("messages", "chat", "stream", "static", "proxy", "health")


@dataclass(frozen=True)
class Outcome:
    kind: str
    keepalive: bool
    start: float
    end: float
    ok: bool
    retried: bool
    cache: str        # X-ZCCP-Cache of ZCCP's answers
    detail: str


# nginx's reload closes the old workers' idle keep-alive connections at once; a request
# the client sends on one in that instant is never read: the connection closes (or is
# reset) before any byte of a response. HTTP clients send such a request again on a new
# connection (the official SDKs retry connection errors; RFC 9112 9.3.1): the keep-alive
# clients do too, once, and count it. An error after the response began is never retried.
NOT_ANSWERED = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


# Over HTTP/2 the old workers end each connection with a graceful GOAWAY (NO_ERROR) and
# finish the streams it names; httpx (httpcore 1.x) fails those in-flight streams all the
# same, before or during their response (encode/httpcore#1054, open): an error of the
# client library, sent again once like the above, and counted with them.
def _h2_goaway(exc: Exception) -> bool:
    text = str(exc)
    return "ConnectionTerminated error_code:0" in text or "in state ConnectionState.CLOSED" in text


def _send(c: httpx.Client, method: str, path: str, body: dict | None, keepalive: bool) -> tuple[httpx.Response, bool]:
    """The response, read in full, and whether it took a second try."""
    def once() -> httpx.Response:
        r = c.send(c.build_request(method, path, json=body), stream=True)   # returns with the headers
        try:
            r.read()
        except httpx.HTTPError as exc:
            if _h2_goaway(exc):
                raise
            raise _Answered(exc) from exc
        finally:
            r.close()
        return r

    try:
        return once(), False
    except _Answered as wrapped:
        raise wrapped.exc from None
    except (*NOT_ANSWERED, httpx.LocalProtocolError):
        if not keepalive:
            raise
        return once(), True


class _Answered(Exception):
    """An error after the response began (never sent again)."""

    def __init__(self, exc: Exception) -> None:
        super().__init__(str(exc))
        self.exc = exc


def _client(url: str, client_no: int, keepalive: bool, stop: threading.Event, out: list[Outcome]) -> None:
    n = 0
    limits = httpx.Limits(max_keepalive_connections=1 if keepalive else 0)
    headers = {} if keepalive else {"connection": "close"}
    # keep-alive clients speak HTTP/2 (one connection, a stream per request); the others
    # HTTP/1.1 over TLS, a connection per request.
    with httpx.Client(base_url=url, timeout=60, limits=limits, headers=headers, http2=keepalive,
                      verify=tls_client_context()) as c:
        while not stop.is_set():
            i = (client_no + n) % len(KINDS)
            method, path, body, check = _requests(client_no, n)[i]
            t0, retried, cache = time.monotonic(), False, ""
            try:
                r, retried = _send(c, method, path, body, keepalive)
                ok = 200 <= r.status_code < 300 and check(r)
                cache, detail = r.headers.get("x-zccp-cache", ""), f"{r.status_code} {r.text[:200]!r}"
            except Exception as exc:   # any other transport error is a failed request
                ok, detail = False, f"{type(exc).__name__}: {exc}"
            out.append(Outcome(KINDS[i], keepalive, t0, time.monotonic(), ok, retried, cache, detail))
            n += 1


