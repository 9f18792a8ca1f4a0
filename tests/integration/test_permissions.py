"""Issue 13, point 6: what ZCCP creates is never world-readable or writable, whatever the
umask it is started under; /metrics answers only the clients server.metrics_allow names."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx

from tests.support.harness import anthropic_body


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
    r = httpx.get(s.url("/metrics"), timeout=5)
    assert r.status_code == 403
    assert httpx.get(s.url("/health"), timeout=5).status_code == 200     # health stays open


def test_metrics_default_is_loopback(null_stack):
    assert null_stack.cfg.server.metrics_allow.split() == ["127.0.0.1", "::1", "unix:"]
    r = httpx.get(null_stack.url("/metrics"), timeout=5)
    assert r.status_code == 200 and "zccp_engine_up 1" in r.text
