"""Kill -9 of the engine to the first 200 after it, under `zccp-stack up` as a user runs it.

    PYTHONPATH=engine:. python -m bench.restart [--kills 10] [--backend tiny] [--no-standby] [--load 2]

Each round: clients sending misses on the side (`--load`), the standby ready (its own log
line; without one, the engine serving), SIGKILL to the serving engine (the admin /health's
engine_pid), then a probe POST every 20 ms until a 200: kill -> first 200. Also zccp-stack's
own "serving again" figure. Method and results: bench/restart.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from tests.support.harness import REPO, Stack, anthropic_body


def engine_pids(s: Stack, stack_pid: int) -> tuple[int | None, int | None]:
    """(the serving engine: the admin /health's, its standby: zccp-stack's other engine child)."""
    try:
        serving = int(s.health()["engine_pid"])
    except (httpx.HTTPError, KeyError, ValueError):
        return None, None
    standby = None
    for p in Path(f"/proc/{stack_pid}/task/{stack_pid}/children").read_text().split():
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--standby" in cmd and int(p) != serving:
            standby = int(p)
    return serving, standby


def probe_until_200(url: str, timeout: float = 60.0) -> float:
    body = anthropic_body("restart probe", max_tokens=4)
    end = time.monotonic() + timeout
    with httpx.Client(timeout=5) as c:
        while time.monotonic() < end:
            try:
                if c.post(url, json=body).status_code == 200:
                    return time.monotonic()
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
    raise RuntimeError("no 200 within the timeout")


def load(url: str, stop: threading.Event) -> None:
    i = 0
    with httpx.Client(timeout=10) as c:
        while not stop.is_set():
            i += 1
            try:
                ok = c.post(url, json=anthropic_body(f"load {os.getpid()} {i}", max_tokens=16)).status_code == 200
            except httpx.HTTPError:
                ok = False
            if not ok:
                time.sleep(0.05)   # a client backing off on 503, not a spin


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--backend", default="tiny")
    ap.add_argument("--no-standby", action="store_true")
    ap.add_argument("--load", type=int, default=2, help="clients sending misses during the kills")
    ap.add_argument("--settle", type=float, default=4.0, help="seconds after each 200 before the next kill")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    s = Stack(Path(tempfile.mkdtemp(prefix="zccp-restart-")), {"model": {"backend": a.backend}})
    env = dict(os.environ, PYTHONPATH=str(REPO / "engine"))
    cmd = [sys.executable, "-m", "zccp.ops.cli", "stack", "up", "--config", str(s.config_path),
           "--run-dir", str(s.run_dir)] + (["--no-standby"] if a.no_standby else [])
    out = open(s.run_dir / "zccp-stack.out", "wb")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = s.url("/v1/messages")
    stop = threading.Event()
    rows: list[float] = []
    try:
        probe_until_200(url, 120)
        loaders = [threading.Thread(target=load, args=(url, stop), daemon=True) for _ in range(a.load)]
        for t in loaders:
            t.start()
        for i in range(a.kills):
            end = time.monotonic() + 30
            log = (s.run_dir / "logs" / "engine.log")
            while True:   # the standby (when on) has done its imports (seconds of CPU)
                serving, standby = engine_pids(s, proc.pid)
                if serving and (a.no_standby or (standby and f"standby ready (pid {standby})" in log.read_text())):
                    break
                assert time.monotonic() < end, "no engine/standby"
                time.sleep(0.1)
            time.sleep(a.settle)
            killed = time.monotonic()
            os.kill(serving, signal.SIGKILL)
            back = probe_until_200(url)
            rows.append(back - killed)
            print(f"kill {i + 1}: first 200 after {back - killed:.2f} s", flush=True)
    finally:
        stop.set()
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        out.close()
    again = [float(line.split(", ")[1].split(" s")[0]) for line in
             (s.run_dir / "zccp-stack.out").read_text().splitlines() if "serving again" in line]
    res = {"backend": a.backend, "standby": not a.no_standby, "load_clients": a.load, "kills": len(rows),
           "kill_to_200_s": rows, "p50_s": statistics.median(rows), "max_s": max(rows),
           "stack_serving_again_s": again}
    print(json.dumps(res, indent=1))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
