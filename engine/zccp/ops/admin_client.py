"""A request to this stack's admin listener (server.admin_listen: a unix socket or an
address, with the admin token when server.admin_token_file names one): what `zccp-cache
purge` uses to empty nginx's L1, and what tests and tools use for purge, warm-up, keys
and /metrics. Also the admin surface's guards on this host (docs/isolation.md, "The admin
surface"): the token file only its owner can read, the socket's directory only its owner
can enter (nginx makes every unix listen socket 0666, so the directory is the lock).
"""

from __future__ import annotations

import http.client
import os
import socket
import stat
from pathlib import Path

from zccp.config import Config
from zccp.config.own_dirs import NotOurDirectory, own_dir

MIN_TOKEN_CHARS = 16
ADMIN_DIR_MODE = 0o700


def read_admin_token(path: str) -> str:
    """The admin token of server.admin_token_file; ValueError naming the key when the file
    is missing, readable (or writable) by anyone but its owner, or too short."""
    try:
        st = os.stat(path)
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValueError(f"server.admin_token_file: cannot read {path}: {exc.strerror}") from None
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise ValueError(f"server.admin_token_file: {path} is mode {mode:04o}: only its owner may read the "
                         f"admin token (chmod 600 {path})")
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"server.admin_token_file: {path} holds fewer than {MIN_TOKEN_CHARS} characters")
    return token


def admin_socket_dir(cfg: Config) -> Path | None:
    """Make sure the admin socket's directory (server.admin_listen "unix:...") can be entered
    by its owner only; None when the admin listener is an address. A directory ZCCP makes
    (the default, <socket dir>/admin) is made 0700 (and again by nginx's master at init:
    zccp.admin.gate.make_socket_dir); one the operator named must not be enterable by every user
    (ValueError naming the key)."""
    listen = cfg.server.admin_listen or ""
    if not listen.startswith("unix:"):
        return None
    sock = Path(listen[5:])
    if len(str(sock).encode()) > 107:
        raise ValueError(f"server.admin_listen: {sock} is longer than 107 bytes (a unix socket's limit)")
    d = sock.parent
    ours = cfg.server.socket_path is not None and d == Path(cfg.server.socket_path).parent / "admin"
    if ours and d.is_dir() and not d.is_symlink() and d.stat().st_uid == os.geteuid() \
            and stat.S_IMODE(d.stat().st_mode) != ADMIN_DIR_MODE:
        d.chmod(ADMIN_DIR_MODE)          # ours, from an older layout or umask: tightened
    try:
        # made 0700, or one already there: this user's or root's, and no one else may enter
        # it (nginx makes the socket 0666); a directory someone else made is never used
        return own_dir(d, "server.admin_listen's directory", private=True, group=cfg.shared_memory.group)
    except NotOurDirectory as exc:
        raise ValueError(f"{exc} (the default: unix:<socket dir>/admin/admin.sock)") from None


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
    return {"Authorization": "Bearer " + read_admin_token(path)}


def admin_request(cfg: Config, method: str, path: str, body: bytes | None = None,
                  timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body). OSError when nothing listens there. cfg: resolved (zccp.config.runtime)."""
    return request_to(cfg.server.admin_listen or "", admin_headers(cfg), method, path, body, timeout)


def request_to(listen: str, headers: dict[str, str], method: str, path: str, body: bytes | None = None,
               timeout: float = 5.0) -> tuple[int, bytes]:
    """One request to an admin listener ("unix:/path" or host:port): (status, body)."""
    conn: http.client.HTTPConnection
    if listen.startswith("unix:"):
        conn = _UnixConnection(listen[5:], timeout)
    else:
        host, _, port = listen.rpartition(":")
        conn = http.client.HTTPConnection(host.strip("[]") or "127.0.0.1", int(port), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json", **headers})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()
