"""Kill -9 of the engine to the first 200 after it, under docker compose as a user runs it
(docker-compose.yml: redis + engine + nginx, the CPU image zccp:local, tiny model, cache on).

    python -m bench.restart_compose [--kills 10] [--port 18093] [--json F]

The stack is brought up (`docker compose up -d`, no build: the image must exist), then 2
clients send misses the whole time, and each round: the engine answering (a 200), 4 s more,
SIGKILL from the host to the engine process (the engine container's init's child, by its host
pid: no `docker exec` in the timing), then a probe POST every 20 ms until a 200, each with a
prompt of its own (an answer from the cache would hide a dead engine). Compose brings the
engine back by its restart policy (`restart: unless-stopped`): the container exits with
its process and Docker starts it again, which then pays a full engine start. Ends with
`docker compose down -v`. Method and results: bench/restart.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
_probe = itertools.count()


def dc(*args: str, check: bool = True) -> str:
    out = subprocess.run(["docker", "compose", *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    if check and out.returncode != 0:
        raise RuntimeError(f"docker compose {' '.join(args)}: {out.stderr[-2000:]}")
    return out.stdout


def body(text: str) -> dict:
    return {"model": "zccp-tiny", "max_tokens": 4, "messages": [{"role": "user", "content": text}]}


def ok(c: httpx.Client, url: str) -> bool:
    try:
        return c.post(url, json=body(f"probe {os.getpid()} {next(_probe)}")).status_code == 200
    except httpx.HTTPError:
        return False


def probe_until_200(url: str, timeout: float = 120.0) -> float:
    end = time.monotonic() + timeout
    with httpx.Client(timeout=5) as c:
        while time.monotonic() < end:
            if ok(c, url):
                return time.monotonic()
            time.sleep(0.02)
    raise RuntimeError("no 200 within the timeout")


def load(url: str, stop: threading.Event) -> None:
    with httpx.Client(timeout=10) as c:
        while not stop.is_set():
            if not ok(c, url):
                time.sleep(0.05)   # a client backing off on 503, not a spin


def engine_host_pid() -> int:
    """The engine's pid on the host: the only child of the engine container's init (tini)."""
    cid = dc("ps", "-q", "engine").strip()
    init = subprocess.run(["docker", "inspect", "-f", "{{.State.Pid}}", cid], capture_output=True, text=True,
                          check=True).stdout.strip()
    kids = Path(f"/proc/{init}/task/{init}/children").read_text().split()
    assert len(kids) == 1, kids
    return int(kids[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--port", type=int, default=18093)
    ap.add_argument("--settle", type=float, default=4.0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    os.environ.update(COMPOSE_PROJECT_NAME="zccp-restart-bench", COMPOSE_PROFILES="cpu", COMPOSE_BAKE="false",
                      ZCCP_PORT=str(a.port))
    url = f"http://127.0.0.1:{a.port}/v1/messages"
    t0 = time.monotonic()
    dc("up", "-d", "--no-build")
    stop = threading.Event()
    rows: list[float] = []
    restarts: list[int] = []
    try:
        first = probe_until_200(url, 300)
        print(f"compose up to first 200: {first - t0:.1f} s", flush=True)
        loaders = [threading.Thread(target=load, args=(url, stop), daemon=True) for _ in range(2)]
        for t in loaders:
            t.start()
        for i in range(a.kills):
            probe_until_200(url)
            time.sleep(a.settle)
            pid = engine_host_pid()
            killed = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            back = probe_until_200(url)
            rows.append(back - killed)
            print(f"kill {i + 1}: first 200 after {back - killed:.2f} s", flush=True)
        cid = dc("ps", "-q", "engine").strip()
        restarts.append(int(subprocess.run(["docker", "inspect", "-f", "{{.RestartCount}}", cid],
                                           capture_output=True, text=True).stdout.strip() or -1))
    finally:
        stop.set()
        dc("down", "-v", check=False)
    res = {"runner": "docker compose (restart: unless-stopped)", "backend": "tiny", "load_clients": 2,
           "kills": len(rows), "kill_to_200_s": [round(x, 3) for x in rows], "p50_s": round(statistics.median(rows), 3),
           "max_s": round(max(rows), 3), "engine_restart_count": restarts}
    print(json.dumps(res, indent=1))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
