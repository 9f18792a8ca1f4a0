"""Kill -9 of the engine to the first 200 after it, under docker compose as a user runs it
(docker-compose.yml: redis + engine + nginx, the CPU image zccp:local, tiny model, cache on).

    python -m bench.restart_compose [--kills 10] [--port 18093] [--json F]

The stack is brought up (`docker compose up -d`, no build: the image must exist), then 2
clients send misses the whole time, and each round: the engine answering (a 200), its warm
standby ready if it has one (its log line), 1 s more (--settle),
SIGKILL from the host to the serving engine process (by its host pid: no `docker exec` in
the timing), then a probe POST every 20 ms until a 200, each with a
prompt of its own (an answer from the cache would hide a dead engine). Compose brings the
engine back: with `--warm-standby` (its command) the standby in the container takes over;
without, the container exits with its process and Docker's restart policy starts it again,
which pays a whole engine start (`--compose-file` adds files, e.g. an engine command). Ends with
`docker compose down -v`. Method and results: bench/restart.md.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
_probe = itertools.count()


FILES: list[str] = []    # -f docker-compose.yml [-f more] (main)


def dc(*args: str, check: bool = True) -> str:
    out = subprocess.run(["docker", "compose", *FILES, *args], cwd=REPO, capture_output=True, text=True, timeout=300)
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


def serving_engine(pids: Iterable[int]) -> int:
    """Of these host pids, the engine serving now: the engine process with the arena mapped
    (nginx's workers map it too; a warm standby has not yet; a --warm-standby parent never)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            engine = b"zccp" in Path(f"/proc/{pid}/cmdline").read_bytes() and b"nginx" not in Path(
                f"/proc/{pid}/comm").read_bytes()
            if engine and _maps_arena(pid):
                return pid
    raise RuntimeError("no process has the arena mapped")


def _maps_arena(pid: int) -> bool:
    return "/dev/shm/zccp." in Path(f"/proc/{pid}/maps").read_text()


def standby_ready(pids: Iterable[int], log: Callable[[], str]) -> bool:
    """Whether a warm standby among these host pids has said it is ready (its imports done)
    in the engine's log, which names it by its pid in the container (NSpid's last). A standby
    that took over keeps --standby in its command line and its line in the log: it is the
    one with the arena mapped, not a standby any more."""
    for pid in pids:
        with contextlib.suppress(OSError):
            if b"--standby" in Path(f"/proc/{pid}/cmdline").read_bytes() and not _maps_arena(pid):
                ns = Path(f"/proc/{pid}/status").read_text().split("NSpid:")[1].split("\n")[0].split()[-1]
                if f"standby ready (pid {ns})" in log():
                    return True
    return False


def container_pids(cid: str) -> list[int]:
    top = subprocess.run(["docker", "top", cid, "-eo", "pid"], capture_output=True, text=True, check=True).stdout
    return [int(line) for line in top.split()[1:]]


def wait_standby(cid: str, log: Callable[[], str], timeout: float = 120.0) -> bool:
    """Until the container's standby is ready (False: none there, e.g. no --warm-standby)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        pids = container_pids(cid)
        if not any(b"--warm-standby" in Path(f"/proc/{p}/cmdline").read_bytes() for p in pids
                   if Path(f"/proc/{p}").exists()):
            return False        # no supervisor with a standby in this container
        if standby_ready(pids, log):
            return True
        time.sleep(0.2)
    raise RuntimeError("the standby did not get ready")


def kill_rounds(url: str, kills: int, settle: float, rows: list[float], ready: Callable[[], bool],
                host_pid: Callable[[], int]) -> bool:
    """`kills` rounds of: a 200, the runner's standby ready (`ready`: False when it has none),
    `settle` s more, SIGKILL to the serving engine (`host_pid`), then probes until a 200;
    each kill's seconds to that 200 appended to `rows`. Whether a standby was waited for."""
    standby = False
    for i in range(kills):
        probe_until_200(url)
        standby = ready()
        time.sleep(settle)
        pid = host_pid()
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        back = probe_until_200(url)
        rows.append(back - killed)
        print(f"kill {i + 1}: first 200 after {back - killed:.2f} s", flush=True)
    return standby


def engine_host_pid() -> int:
    """The serving engine's pid on the host, among the engine container's processes."""
    return serving_engine(container_pids(dc("ps", "-q", "engine").strip()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--port", type=int, default=18093)
    ap.add_argument("--settle", type=float, default=1.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--compose-file", action="append", default=["bench/compose.engine-mount.yml"],
                    help="added after docker-compose.yml (default: this checkout's engine/ mounted)")
    a = ap.parse_args()
    FILES.extend(x for f in ["docker-compose.yml", *a.compose_file] for x in ("-f", f))
    os.environ.update(COMPOSE_PROJECT_NAME="zccp-restart-bench", COMPOSE_PROFILES="cpu", COMPOSE_BAKE="false",
                      ZCCP_PORT=str(a.port))
    url = f"http://127.0.0.1:{a.port}/v1/messages"
    command = json.loads(dc("config", "--format", "json"))["services"]["engine"]["command"]
    t0 = time.monotonic()
    dc("up", "-d", "--no-build")
    stop = threading.Event()
    rows: list[float] = []
    restarts: list[int] = []
    standby = False
    try:
        first = probe_until_200(url, 300)
        print(f"compose up to first 200: {first - t0:.1f} s", flush=True)
        loaders = [threading.Thread(target=load, args=(url, stop), daemon=True) for _ in range(2)]
        for t in loaders:
            t.start()
        standby = kill_rounds(url, a.kills, a.settle, rows,
                              lambda: wait_standby(dc("ps", "-q", "engine").strip(), lambda: dc("logs", "engine")),
                              engine_host_pid)
        cid = dc("ps", "-q", "engine").strip()
        restarts.append(int(subprocess.run(["docker", "inspect", "-f", "{{.RestartCount}}", cid],
                                           capture_output=True, text=True).stdout.strip() or -1))
    finally:
        stop.set()
        dc("down", "-v", check=False)
    res = {"runner": "docker compose", "files": FILES[1::2], "engine_command": command, "waited_for_standby": standby,
           "backend": "tiny",
           "load_clients": 2,
           "kills": len(rows), "kill_to_200_s": [round(x, 3) for x in rows], "p50_s": round(statistics.median(rows), 3),
           "max_s": round(max(rows), 3), "engine_restart_count": restarts}
    print(json.dumps(res, indent=1))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
