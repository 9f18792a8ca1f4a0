"""Issue 28 item 12: the admin surface is the stack owner's alone. nginx makes unix listen
sockets 0666, so the admin socket lives in a directory only its owner may enter; the admin
token file must be readable by its owner only (or the stack does not start); neither the
token nor its digest is in a rendered file other users may read; the public /health says
ok or not and nothing more (pids, slots, reasons naming files are on the admin listener)."""

from __future__ import annotations

import hashlib
import os
import pwd
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.harness import Stack
from zccp.ops.stack import StackError, free_port

NULL = {"model": {"backend": "null"}}
TOKEN = "admin-token-for-the-test-0123456789"


def token_file(tmp: Path, mode: int = 0o600) -> Path:
    p = tmp / "admin.token"
    p.write_text(TOKEN + "\n")
    p.chmod(mode)
    return p


@pytest.fixture
def other_user() -> Iterator[str]:
    """A second local user (made here, removed after): root only."""
    if os.geteuid() != 0:
        pytest.skip("creating a second local user needs root")
    name = f"zccpo{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False)


def as_user(user: str, code: str) -> str:
    """Run `code` in the system's python3 as `user` (its own uid and group, no others): what it prints."""
    pw = pwd.getpwnam(user)
    r = subprocess.run(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups",
                        "/usr/bin/python3", "-c", code], capture_output=True, text=True, timeout=30, cwd="/")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_another_local_user_cannot_reach_the_admin_socket_nor_read_the_token(tmp_path: Path,
                                                                            other_user: str) -> None:
    token = token_file(tmp_path)
    s = Stack(tmp_path / "stack", {**NULL, "server": {"admin_token_file": str(token)}}).start()
    try:
        sock = s.cfg.server.admin_listen[5:]    # type: ignore[index]
        assert s.admin_client().get("/metrics").status_code == 200       # its owner (root) is served
        tried = as_user(other_user, f"""
import socket
s = socket.socket(socket.AF_UNIX)
try:
    s.connect({sock!r}); s.sendall(b"GET /metrics HTTP/1.0\\r\\n\\r\\n"); print("connected", s.recv(12))
except OSError as e:
    print(type(e).__name__)
try:
    open({str(token)!r}).read(); print("read the token")
except OSError as e:
    print(type(e).__name__)
""")
        assert tried.splitlines() == ["PermissionError", "PermissionError"], tried
        d = Path(sock).parent
        assert stat.S_IMODE(d.stat().st_mode) == 0o700 and d.stat().st_uid == os.geteuid()
        # no rendered file another user can read holds the token or its digest
        digest = hashlib.sha256(TOKEN.encode()).hexdigest()
        for f in Path(s.run_dir).rglob("*"):
            if f.is_file() and f.stat().st_mode & stat.S_IROTH:
                text = f.read_text(errors="replace")
                assert digest not in text and TOKEN not in text, f
    finally:
        s.stop()


def test_a_token_file_others_can_read_stops_the_start(tmp_path: Path) -> None:
    """On an address (where the token is the only guard) and on the socket alike: a token
    file of mode 0644 is refused with the key, the file and the fix (main started)."""
    token = token_file(tmp_path, 0o644)
    s = Stack(tmp_path / "stack", {**NULL, "server": {"admin_listen": f"127.0.0.1:{free_port()}",
                                                      "admin_token_file": str(token)}})
    try:
        with pytest.raises(StackError, match=r"server.admin_token_file: .* mode 0644: only its owner may read"):
            s.start()
    finally:
        s.stop()


def test_a_tcp_admin_listener_needs_a_token_file(tmp_path: Path) -> None:
    from zccp.config import ConfigError

    with pytest.raises(ConfigError, match="server.admin_token_file: required when server.admin_listen is an address"):
        Stack(tmp_path, {**NULL, "server": {"admin_listen": f"127.0.0.1:{free_port()}"}})


def test_public_health_says_ok_or_not_and_nothing_else(tmp_path: Path) -> None:
    s = Stack(tmp_path, NULL).start()
    try:
        r = httpx.get(s.url("/health"), timeout=5)
        assert r.status_code == 200 and r.json() == {"status": "ok"}, r.text
        admin = s.admin_client().get("/health").json()             # the details are the admin's
        assert admin["status"] == "ok" and admin["engine_pid"] == s.engine.pid   # type: ignore[union-attr]
        assert "worker_pid" in admin and "masks" in admin
        s.stop_engine()
        r = httpx.get(s.url("/health"), timeout=5)
        assert r.status_code == 503 and r.json() == {"status": "unavailable"}, r.text
        assert "/" not in r.text                                        # no path, no reason
        assert s.admin_client().get("/health").json()["reason"]
        r = httpx.post(s.url("/v1/zccp/purge"), json={"all": True}, timeout=5)   # not served here
        assert r.status_code == 404, r.text
        # A probe every few seconds must not write a line each: no "uninitialized variable"
        # warning from the public listener's reads of $zccp_admin.
        assert "uninitialized" not in s.error_log(), s.error_log()[-2000:]
    finally:
        s.stop()


def test_nginx_makes_the_admin_directory_when_it_is_gone(tmp_path: Path) -> None:
    """After a reboot /run is empty and nginx may run as another user than the one who
    rendered (containers): nginx's master makes the admin socket's directory at init, 0700,
    before it binds the socket (without it, nginx would not start)."""
    import shutil
    import signal

    from zccp.ops.stack import Service, nginx_paths
    from zccp.config.runtime import log_dir

    s = Stack(tmp_path, NULL).start()
    try:
        d = Path(s.cfg.server.admin_listen[5:]).parent   # type: ignore[index]
        assert s.nginx is not None
        s.nginx.stop()
        shutil.rmtree(d)
        prefix, conf = nginx_paths(s.run_dir)
        old = os.umask(0)
        try:        # the same rendered configuration, not rendered again
            s.nginx = Service("nginx", [shutil.which("nginx") or "/usr/sbin/nginx", "-p", str(prefix), "-c",
                                        str(conf), "-g", "daemon off;"], log_dir(s.run_dir) / "nginx-error.log",
                              stop_signal=signal.SIGQUIT)
            s.nginx.start()
        finally:
            os.umask(old)
        s.wait_healthy()
        assert stat.S_IMODE(d.stat().st_mode) == 0o700 and d.stat().st_uid == os.geteuid()
        assert s.admin_client().get("/metrics").status_code == 200
    finally:
        s.stop()
