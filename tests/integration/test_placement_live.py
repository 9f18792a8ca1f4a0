"""Placement on this machine, read back: the engine's threads' Cpus_allowed_list, its
arena's memory policy and pages in numa_maps, nginx's workers' CPUs (the real stack,
placement auto; `zccp-stack status` prints the same)."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from tests.support.harness import REPO, Stack, anthropic_body
from zccp.ops.placement_status import allowed_cpus, arena_numa, thread_cpus
from zccp.ops.stack import _workers_of
from zccp.config import for_engine
from zccp.process.placement import format_cpulist, placement_for

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="placement needs two CPUs or more")


def _nginx_workers(s: Stack) -> list[int]:
    return sorted(_workers_of(int((s.run_dir / "nginx" / "nginx.pid").read_text())))


@pytest.fixture
def placed(tmp_path):
    s = Stack(tmp_path / "auto", {"placement": "auto", "model": {"backend": "tiny"}}).start()
    try:
        yield s
    finally:
        s.stop()


def test_auto_placement_is_in_force_and_read_back(placed):
    s = placed
    want = placement_for(s.cfg)
    assert want is not None and want.numa_node is not None
    r = httpx.post(s.url("/v1/messages"), json=anthropic_body("placed", max_tokens=8), timeout=30)
    assert r.status_code == 200          # the model thread and its torch threads exist now
    pid = s.health()["engine_pid"]
    threads = thread_cpus(pid)
    assert len(threads) >= 3 and all(cpus == list(want.cpus) for cpus in threads.values()), threads
    numa = arena_numa(pid, s.cfg.shared_memory.name)
    assert numa is not None and numa.policy == f"prefer:{want.numa_node}"
    assert numa.pages.get(want.numa_node, 0) > 0 and set(numa.pages) == {want.numa_node}
    workers = _nginx_workers(s)
    assert len(workers) == 2
    for w in workers:
        cpus = allowed_cpus(w)
        assert cpus and not set(cpus) & set(want.cpus), (cpus, want.cpus)   # beside the engine, not on it
    out = subprocess.run([sys.executable, "-m", "zccp.ops.cli", "stack", "status", "--config", str(s.config_path),
                          "--run-dir", str(s.run_dir)], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(REPO / "engine")))
    assert out.returncode == 0, out.stderr
    assert f"engine default (pid {pid}): CPUs {want.cpulist} " in out.stdout
    assert f"policy prefer:{want.numa_node}, pages on node {want.numa_node}:" in out.stdout
    assert f"nginx worker (pid {workers[0]}): CPUs {format_cpulist(allowed_cpus(workers[0]))}" in out.stdout
    h = s.health()          # the admin /health says the same
    assert h["engine_cpus"] == want.cpulist
    assert h["worker_cpus"] == format_cpulist(allowed_cpus(h["worker_pid"]))


def test_placement_none_leaves_everything_where_it_was(tmp_path):
    s = Stack(tmp_path / "none", {"model": {"backend": "null"}}).start()
    try:
        pid = s.health()["engine_pid"]
        mine = sorted(os.sched_getaffinity(0))
        assert all(cpus == mine for cpus in thread_cpus(pid).values())
        numa = arena_numa(pid, s.cfg.shared_memory.name)
        assert numa is not None and numa.policy == "default"
        assert "worker_cpu_affinity" not in (s.run_dir / "nginx" / "nginx.conf").read_text()
    finally:
        s.stop()


def test_admin_health_shows_each_engines_placement(tmp_path):
    """engines: each engine's entry in the admin /health: the CPUs it runs on (read back from
    /proc) and its planned node; the public /health says none of it."""
    s = Stack(tmp_path / "two", {"placement": "auto", "model": {"backend": "null"},
                                 "engines": [{"name": "a"}, {"name": "b"}]}).start()
    try:
        h = s.health()
        assert set(h["engines"]) == {"a", "b"}
        for name, st in h["engines"].items():
            want = placement_for(for_engine(s.cfg, name))
            assert want is not None
            assert st["engine_cpus"] == format_cpulist(allowed_cpus(st["engine_pid"])) == want.cpulist, (name, st)
            assert st["engine_node"] == want.numa_node
        public = httpx.get(s.url("/health"), timeout=10).json()
        assert public == {"status": "ok"}
    finally:
        s.stop()
