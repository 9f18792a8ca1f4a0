"""nginx comes back after it was killed. nginx unlinks its unix listen sockets only on a clean
stop, so a SIGKILLed nginx (the OOM killer, `docker kill`) left the admin socket behind and
every later start failed with "bind() ... Address already in use": a compose nginx restarting
for ever. The master now removes, at init, an admin socket nobody listens on
(zccp.lib.stale_socket), and leaves a live one alone."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.support.harness import Stack
from zccp.ops.stack import StackError, nginx_service

NULL = {"model": {"backend": "null"}}


def admin_socket(stack: Stack) -> Path:
    listen = stack.cfg.server.admin_listen or ""
    assert listen.startswith("unix:"), listen
    return Path(listen[5:])


def kill_nginx(stack: Stack) -> None:
    """SIGKILL to nginx's master and workers at once (its process group), as a container's kill."""
    assert stack.nginx is not None and stack.nginx.proc is not None
    os.killpg(stack.nginx.proc.pid, signal.SIGKILL)
    stack.nginx.proc.wait(10)
    end = time.monotonic() + 10
    while time.monotonic() < end:   # the workers, reparented, die too
        try:
            os.killpg(stack.nginx.proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError("nginx's workers outlived SIGKILL")


def test_nginx_starts_again_after_sigkill_left_its_admin_socket(tmp_path: Path) -> None:
    s = Stack(tmp_path / "stack", NULL).start()
    try:
        sock = admin_socket(s)
        assert s.health()["status"] == "ok"
        kill_nginx(s)
        assert sock.is_socket(), "the precondition: a killed nginx leaves its socket file"
        s.nginx, _ = nginx_service(s.cfg, s.run_dir)
        s.wait_healthy()
        assert s.health()["status"] == "ok"     # the admin listener answers on the same path
        assert "Address already in use" not in s.error_log()
    finally:
        s.stop()


def test_a_socket_someone_listens_on_is_left_alone(tmp_path: Path) -> None:
    s = Stack(tmp_path / "stack", NULL).start()
    try:
        sock = admin_socket(s)
        assert s.nginx is not None
        s.nginx.stop()                      # a clean stop: nginx removes its socket itself
        assert not sock.exists()
        other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        other.bind(str(sock))
        other.listen(1)
        try:
            with pytest.raises(StackError, match="Address already in use"):
                nginx_service(s.cfg, s.run_dir)
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.connect(str(sock))        # still the other program's socket, still answering
            probe.close()
        finally:
            other.close()
    finally:
        s.stop()
