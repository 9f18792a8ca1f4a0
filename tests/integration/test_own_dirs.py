"""Directories ZCCP uses are its own (issue 44 item 2): a socket directory, an admin socket
directory or a plugins.dir that another user made (or anyone may write to) is refused at
start by zccp-engine, zccp-nginx and zccp-stack up, naming it, and nothing is created in
it; the normal path (a directory ZCCP makes, or one of its own) works.

The squatter is user `nobody` (os.chown: these tests run as root); each test makes its
own paths, and removes them."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.checkout import REPO
from tests.support.harness import Stack, StackProcess
from zccp.ops.stack import free_port

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="makes directories as another user: needs root")

NOBODY = pwd.getpwnam("nobody").pw_uid


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A fresh directory under /tmp, as a squatter finds it (removed after the test)."""
    d = Path(f"/tmp/zccp-squat-{uuid.uuid4().hex[:10]}")
    d.mkdir(mode=0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def squat(path: Path, mode: int = 0o755) -> Path:
    path.mkdir()
    os.chown(path, NOBODY, -1)
    path.chmod(mode)
    return path


def config(tmp_path: Path, socket_dir: Path, **extra: dict) -> Path:
    raw = {"server": {"listen": "127.0.0.1:1", "socket_path": str(socket_dir / "doorbell.sock")},
           "cache": {"enabled": False}, "model": {"backend": "null"}, **extra}
    p = tmp_path / "config.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


def cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO / "engine"))
    return subprocess.run([sys.executable, "-m", "zccp.ops.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def refused(out: subprocess.CompletedProcess, path: Path) -> None:
    assert out.returncode != 0, out.stdout
    assert str(path) in out.stderr and "refusing to use it" in out.stderr, out.stderr


def test_a_socket_directory_someone_else_made_is_refused_by_every_command(tmp_path, shared_tmp):
    sock_dir = squat(shared_tmp / "zccp")
    cfg = config(tmp_path, sock_dir)
    refused(cli("engine", "--check", "--config", str(cfg), "--run-dir", str(tmp_path / "run")), sock_dir)
    refused(cli("nginx", "--config", str(cfg), "--out", str(tmp_path / "out"), "--run-dir", str(tmp_path / "run")),
            sock_dir)
    assert list(sock_dir.iterdir()) == []          # nothing made in it: no admin dir, no last-good copies
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_the_issues_admin_squat_is_refused_and_no_key_is_handed_over(tmp_path, shared_tmp):
    """The report's layout: /tmp/zccp (0755) and /tmp/zccp/admin (0700), both the squatter's."""
    sock_dir = squat(shared_tmp / "zccp")
    admin = squat(sock_dir / "admin", 0o700)
    cfg = config(tmp_path, sock_dir)
    out = cli("nginx", "--config", str(cfg), "--out", str(tmp_path / "out"), "--run-dir", str(tmp_path / "run"))
    refused(out, sock_dir)
    assert list(admin.iterdir()) == []
    # the socket directory ours, the admin directory inside it still the squatter's
    os.chown(sock_dir, 0, -1)
    out = cli("nginx", "--config", str(cfg), "--out", str(tmp_path / "out"), "--run-dir", str(tmp_path / "run"))
    refused(out, admin)
    assert list(admin.iterdir()) == []


def test_zccp_stack_up_refuses_a_squatted_directory(tmp_path, shared_tmp):
    sock_dir = squat(shared_tmp / "zccp")
    s = Stack(tmp_path / "stack", {"server": {"socket_path": str(sock_dir / "doorbell.sock")},
                                   "model": {"backend": "null"}})
    p = StackProcess(s).start(wait=False)
    try:
        assert p.wait(120) != 0
        assert str(sock_dir) in p.text() and "refusing to use it" in p.text(), p.text()
        assert list(sock_dir.iterdir()) == []
    finally:
        p.stop()


@pytest.mark.parametrize("how", ["0777", "nobody's"])
def test_a_plugins_dir_others_can_write_is_refused(tmp_path, shared_tmp, how):
    plugins = tmp_path / "plugins"
    if how == "0777":
        plugins.mkdir()
        plugins.chmod(0o777)
    else:
        squat(plugins)
    cfg = config(tmp_path, shared_tmp / "zccp", plugins={"dir": str(plugins)})
    refused(cli("nginx", "--config", str(cfg), "--out", str(tmp_path / "out"), "--run-dir", str(tmp_path / "run")),
            plugins)
    # the engine never reads plugins.dir (nginx does): its check is not the engine's


def test_the_normal_path_makes_its_directories_its_own(tmp_path, shared_tmp):
    plugins = tmp_path / "plugins"
    plugins.mkdir(mode=0o755)
    sock_dir = shared_tmp / "zccp"
    cfg = config(tmp_path, sock_dir, plugins={"dir": str(plugins)})
    old = os.umask(0)                               # what ZCCP makes does not follow a careless umask
    try:
        out = cli("nginx", "--config", str(cfg), "--out", str(tmp_path / "out"), "--run-dir", str(tmp_path / "run"))
    finally:
        os.umask(old)
    assert out.returncode == 0, out.stderr
    modes = {p.name: (p.stat().st_uid, p.stat().st_mode & 0o777) for p in (sock_dir, *sock_dir.iterdir())}
    assert modes == {"zccp": (0, 0o755), "plugins.last_good": (0, 0o755), "admin": (0, 0o700)}, modes
    # and again, over what it made itself
    out = cli("nginx", "--config", str(cfg), "--out", str(tmp_path / "out"), "--run-dir", str(tmp_path / "run"))
    assert out.returncode == 0, out.stderr


def test_nginx_refuses_an_admin_dir_someone_made_after_the_render(tmp_path, shared_tmp):
    """A restart with no render before it (at boot, a member of /run/zccp's group was first):
    nginx's master refuses the admin socket's directory it did not make, and does not start."""
    sock_dir = shared_tmp / "zccp"
    cfg = config(tmp_path, sock_dir)
    raw = yaml.safe_load(cfg.read_text())
    raw["server"]["listen"] = f"127.0.0.1:{free_port()}"
    cfg.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    r = cli("nginx", "--config", str(cfg), "--out", str(out), "--run-dir", str(tmp_path / "run"),
            "--standalone", "--prefix", str(out))
    assert r.returncode == 0, r.stderr
    (sock_dir / "admin").rmdir()
    admin = squat(sock_dir / "admin", 0o700)
    nginx = [shutil.which("nginx") or "/usr/sbin/nginx", "-p", str(out), "-c", str(out / "nginx.conf"),
             "-g", "daemon off;"]
    proc = subprocess.Popen(nginx, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        said, _ = proc.communicate(timeout=60)   # init_by_lua fails: the master exits at once
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    logs = said + "".join(p.read_text() for p in out.rglob("*.log"))
    assert proc.returncode != 0 and str(admin) in logs and "refusing to use it" in logs, logs
    assert list(admin.iterdir()) == []
