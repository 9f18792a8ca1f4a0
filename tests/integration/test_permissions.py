"""Issue 13, point 6: what ZCCP creates is never world-readable or writable, whatever the
umask it is started under; /metrics answers only the clients server.metrics_allow names."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.support.harness import REPO, Stack, anthropic_body
from zccp.ops.stack import Service, nginx_service, redis_service, reload_masks, wait_for_engine
from zccp.config.paths import lua_file
from zccp.config.runtime import log_dir


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_nothing_is_world_accessible_under_umask_000(make_stack):
    old = os.umask(0)          # the stack's processes inherit it
    try:
        s = make_stack(with_redis=True)
    finally:
        os.umask(old)
    r = s.client().post("/v1/messages", json=anthropic_body("hello"))
    assert r.status_code == 200, r.text
    sock = Path(s.cfg.server.socket_path)
    files = {
        "arena": Path("/dev/shm") / s.cfg.shared_memory.name.lstrip("/"),
        "doorbell socket": sock,
        "metrics socket": Path(str(sock) + ".metrics"),
        "last-good mask file": sock.parent / "mask_patterns.last_good.lua",
    }
    for what, path in files.items():
        assert path.exists(), what
        assert _mode(path) & stat.S_IRWXO == 0, f"{what} {path} is {oct(_mode(path))}"
    # directories holding them: nobody else may replace what is inside
    for d in {sock.parent, *(p for p in sock.parent.rglob("*") if p.is_dir())}:
        assert _mode(d) & stat.S_IWOTH == 0, f"{d} is {oct(_mode(d))}"
    s.assert_no_leaks()


def test_metrics_answer_only_where_the_config_allows(make_stack):
    s = make_stack({"server": {"metrics_allow": "10.11.12.13 192.168.0.0/16"}})
    r = s.admin_client().get("/metrics")
    assert r.status_code == 403
    assert httpx.get(s.url("/health"), timeout=5).status_code == 200     # health stays open


def test_metrics_default_is_loopback(null_stack):
    assert null_stack.cfg.server.metrics_allow.split() == ["127.0.0.1", "::1", "unix:"]
    r = null_stack.admin_client().get("/metrics")
    assert r.status_code == 200 and "zccp_engine_up 1" in r.text


def _add_mask(path: Path) -> None:
    """An extra mask pattern, as an operator adds one (the last entry of the table)."""
    text = path.read_text()
    head, _, _ = text.rpartition("}")
    path.write_text(head + '    { name = "ticket", pattern = [[\\bTCK-\\d{6}\\b]], replacement = "<ticket>" },\n}\n')


@pytest.mark.skipif(os.geteuid() != 0, reason="starts the engine as another user: needs root")
@pytest.mark.parametrize("mode", [0o2770, 0o770], ids=["2770", "0770-without-setgid"])
def test_an_engine_of_its_own_user_keeps_its_hits_after_a_mask_reload(mode):
    """The systemd install (docs/existing-nginx.md): the engine runs as its own user (here
    `nobody`, group www-data: the group nginx's workers are in), /run/zccp is the unit's
    RuntimeDirectory (owned by the engine's user and group) and nginx's master, root, writes
    the masks' last-good copy into it at every reload. With the unit's mode 2770 (setgid)
    that file is in the engine's group and the engine keeps serving hits after a mask edit +
    reload; without the setgid bit (0770) it cannot read the file and serves uncached."""
    user, group = pwd.getpwnam("nobody"), grp.getgrnam("www-data")
    as_user = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={group.gr_gid}", "--clear-groups"]
    probe = subprocess.run([*as_user, sys.executable, "-c", "import redis.asyncio, torch"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"this venv's Python is not usable by user nobody: {probe.stderr.decode()[-200:]}")
    base = Path(tempfile.mkdtemp(prefix="zccp-own-user-"))
    base.chmod(0o755)                      # the engine reads its config and mask file here
    run = base / "run"
    run.mkdir()
    os.chown(run, user.pw_uid, group.gr_gid)
    run.chmod(mode)                        # what systemd's RuntimeDirectoryMode= makes
    masks = base / "mask_patterns.lua"
    shutil.copy(lua_file("mask_patterns.lua"), masks)
    masks.chmod(0o644)
    s = Stack(base / "stack", {"server": {"socket_path": str(run / "doorbell.sock")},
                               "shared_memory": {"group": "www-data"},
                               "cache": {"mask_patterns": str(masks), "ttl_s": 600},
                               "model": {"backend": "null"}}, with_redis=True)
    try:
        s.redis = redis_service(s.cfg.cache.redis_url, s.run_dir)
        env = dict(os.environ, HOME=str(base), PYTHONPATH=str(REPO / "engine"))
        s.engine = Service("engine", [*as_user, sys.executable, "-m", "zccp.ops.cli", "engine",
                                      "--config", str(s.config_path), "--run-dir", str(s.run_dir)],
                           log_dir(s.run_dir) / "engine.log", env=env)
        s.engine.start()
        wait_for_engine(s.engine, s.cfg)
        assert Path(f"/proc/{s.engine.pid}/status").read_text().split("Uid:")[1].split()[0] == str(user.pw_uid)
        s.nginx, _ = nginx_service(s.cfg, s.run_dir)
        s.wait_healthy()
        assert _cached(s, "before the reload") == "HIT"
        _add_mask(masks)
        in_force = reload_masks(s.cfg, s.run_dir)
        assert in_force.patterns >= 1 and not in_force.errors
        last_good = run / "mask_patterns.last_good.lua"
        st = last_good.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o640)
        assert (st.st_gid == group.gr_gid) == bool(mode & stat.S_ISGID)
        got = _cached(s, "after the reload, ticket TCK-123456")
        if mode & stat.S_ISGID:
            assert got == "HIT"
            assert "Permission denied" not in s.engine_log()
        else:   # the failure the setgid bit prevents
            assert got == "BYPASS" and "Permission denied" in s.engine_log()
    finally:
        s.stop()
        shutil.rmtree(base, ignore_errors=True)


def _cached(s: Stack, text: str) -> str:
    """A MISS, then the X-ZCCP-Cache of repeats until one is not a MISS (2 s at most)."""
    body = anthropic_body(text)
    first = s.client().post("/v1/messages", json=body)
    assert first.status_code == 200, first.text
    got = first.headers["x-zccp-cache"]
    for _ in range(100):
        r = s.client().post("/v1/messages", json=body)
        assert r.status_code == 200, r.text
        got = r.headers["x-zccp-cache"]
        if got != "MISS":
            return got
        time.sleep(0.02)
    return got
