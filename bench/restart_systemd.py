"""Kill -9 of the engine to the first 200 after it, under systemd: deploy/systemd/zccp-engine.service
as shipped (its sandboxing on, Restart=on-failure, RestartSec=100ms) in a container whose PID 1
is systemd, nginx beside it (bench/systemd/: the image is zccp:local plus Debian's systemd;
this checkout's engine/ is mounted over the image's, compiled beforehand: `compileall engine`).

    python -m bench.restart_systemd [--kills 10] [--port 18094] [--json F]

Each round as in bench.restart_compose (2 clients of misses, a 200, the standby ready, 1 s more, SIGKILL from the
host to the serving engine process, a probe every 20 ms with a prompt of its own until a 200);
then, from the journal, each restart's systemd "Started" to the engine's "engine serving".
The container needs every capability but CAP_SYS_RESOURCE (this host's Docker cannot grant
that one: `--privileged` fails), no seccomp filter, and the host's cgroup tree.
Method and results: bench/restart.md.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
from datetime import datetime
from pathlib import Path

from bench.restart_compose import REPO, container_pids, kill_rounds, load, probe_until_200, serving_engine, wait_standby

IMAGE, NAME = "zccp:systemd-bench", "zccp-systemd-bench"


def docker(*args: str, check: bool = True) -> str:
    out = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=600)
    if check and out.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:2])}: {out.stderr[-2000:]}")
    return out.stdout


def build() -> None:
    """The image from a context of its own (.dockerignore leaves deploy/systemd out of the checkout's)."""
    with tempfile.TemporaryDirectory() as ctx:
        for rel in ("deploy/systemd/zccp-engine.service", "bench/systemd/Dockerfile", "bench/systemd/config.yaml",
                    "bench/systemd/zccp-nginx-bench.service"):
            (Path(ctx) / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / rel, Path(ctx) / rel)
        docker("build", "-q", "-t", IMAGE, "-f", f"{ctx}/bench/systemd/Dockerfile", ctx)


def engine_host_pid() -> int:
    return serving_engine(container_pids(NAME))


def started_to_serving(journal: str) -> list[float]:
    """Per start in the journal: systemd's "Started zccp-engine" to the engine's "engine serving"."""
    out, started = [], None
    for line in journal.splitlines():
        m = re.match(r"(\S+) ", line)
        if not m:
            continue
        ts = datetime.fromisoformat(m.group(1)).timestamp()
        if "Started zccp-engine.service" in line:
            started = ts
        elif '"engine serving' in line and started is not None:
            out.append(round(ts - started, 3))
            started = None
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--port", type=int, default=18094)
    ap.add_argument("--settle", type=float, default=1.0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    build()
    docker("rm", "-f", NAME, check=False)
    docker("run", "-d", "--name", NAME, "--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
           "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
           "--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
           "-v", f"{REPO}/engine:/opt/zccp/engine:ro",     # this checkout's engine over the image's
           "-p", f"127.0.0.1:{a.port}:8080", IMAGE)
    url = f"http://127.0.0.1:{a.port}/v1/messages"
    stop = threading.Event()
    rows: list[float] = []
    standby = False
    try:
        probe_until_200(url, 300)
        loaders = [threading.Thread(target=load, args=(url, stop), daemon=True) for _ in range(2)]
        for t in loaders:
            t.start()
        journal = ("exec", NAME, "journalctl", "-u", "zccp-engine", "-o", "short-iso-precise", "--no-pager")
        standby = kill_rounds(url, a.kills, a.settle, rows, lambda: wait_standby(NAME, lambda: docker(*journal)),
                              engine_host_pid)
        log = docker(*journal)
    finally:
        stop.set()
        docker("rm", "-f", NAME, check=False)
    res = {"runner": "systemd 252 as PID 1, deploy/systemd/zccp-engine.service", "backend": "tiny",
           "load_clients": 2, "kills": len(rows), "kill_to_200_s": [round(x, 3) for x in rows],
           "p50_s": round(statistics.median(rows), 3), "max_s": round(max(rows), 3),
           "exec_start": re.findall(r"ExecStart=(.*)", (REPO / "deploy/systemd/zccp-engine.service").read_text()),
           "waited_for_standby": standby, "unit_started_to_serving_s": started_to_serving(log)}
    print(json.dumps(res, indent=1))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
