"""A request to this stack's admin listener (server.admin_listen: a unix socket or an
address, with the admin token when server.admin_token_file names one): what `zccp-cache
purge` uses to empty nginx's L1, and what tests and tools use for purge, warm-up, keys
and /metrics."""

from __future__ import annotations

import http.client
import socket
from pathlib import Path

from zccp.config import Config


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("zccp-admin", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self._path)
        self.sock = s


def admin_headers(cfg: Config) -> dict[str, str]:
    path = cfg.server.admin_token_file
    if path is None:
        return {}
    return {"Authorization": "Bearer " + Path(path).read_text(encoding="utf-8").strip()}


def admin_request(cfg: Config, method: str, path: str, body: bytes | None = None,
                  timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body). OSError when nothing listens there. cfg: resolved (zccp.runtime)."""
    listen = cfg.server.admin_listen or ""
    conn: http.client.HTTPConnection
    if listen.startswith("unix:"):
        conn = _UnixConnection(listen[5:], timeout)
    else:
        host, _, port = listen.rpartition(":")
        conn = http.client.HTTPConnection(host.strip("[]") or "127.0.0.1", int(port), timeout=timeout)
    try:
        headers = {"Content-Type": "application/json", **admin_headers(cfg)}
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()
