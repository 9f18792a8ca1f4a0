"""The engine comes back by itself: N SIGKILLs of the engine under steady load.

Starts `zccp-stack up` (this checkout's package, the shipped config.yaml with its own ports,
arena name and run directory under bench/out/), drives steady traffic with a few client
threads, and kills the engine N times with SIGKILL. For each kill it records the time from
the kill to the first 200 answered to a request sent after the kill, and what every other
answer was; at the end, the slots still claimed or busy. Writes bench/out/engine_restart.json
and the tables in bench/faults/engine_restart.md.

    python -m bench.faults.engine_restart [--kills 20] [--clients 4] [--settle 11]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import yaml

from tests.support.checkout import REPO, require_this_checkout
from zccp.ops.stack import free_port

OUT = REPO / "bench" / "out"
REPORT = REPO / "bench" / "faults" / "engine_restart.md"


@dataclass
class Answer:
    sent: float
    done: float
    status: int          # 0: no HTTP answer (connection error)
    shaped: bool         # a 2xx body, or an API-shaped error


@dataclass
class Kill:
    n: int
    at: float
    engine_pid: int
    recovery_s: float = 0.0      # kill -> the first 200 to a request sent after the kill
    health_s: float = 0.0        # kill -> /health 200 with a new epoch
    answers: dict[str, int] = field(default_factory=dict)   # status -> count, sent during the outage


class Load:
    """Steady traffic: each client thread sends one request after the other."""

    def __init__(self, url: str, clients: int) -> None:
        self.url = url
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    def _run(self, i: int) -> None:
        n = 0
        with httpx.Client(base_url=self.url, timeout=30) as c:
            while not self._stop.is_set():
                n += 1
                body = {"model": "zccp-tiny", "max_tokens": 8, "temperature": 0,
                        "messages": [{"role": "user", "content": f"client {i} request {n}"}]}
                sent = time.monotonic()
                try:
                    r = c.post("/v1/messages", json=body)
                    status, shaped = r.status_code, _shaped(r)
                except httpx.HTTPError:
                    status, shaped = 0, False
                with self._lock:
                    self.answers.append(Answer(sent, time.monotonic(), status, shaped))
                if status != 200:
                    time.sleep(0.02)     # as a client honouring Retry-After would, only faster

    def since(self, t: float) -> list[Answer]:
        with self._lock:
            return [a for a in self.answers if a.sent >= t]


def _shaped(r: httpx.Response) -> bool:
    try:
        body = r.json()
    except ValueError:
        return False
    if r.status_code == 200:
        return body.get("type") == "message"
    return body.get("type") == "error" and "type" in body.get("error", {}) and "retry-after" in r.headers


def health(url: str) -> dict | None:
    try:
        r = httpx.get(url + "/health", timeout=2)
        return r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--settle", type=float, default=11.0,
                    help="seconds the engine serves before the next kill (the stack's backoff resets after 10 s)")
    ap.add_argument("--report", action="store_true", help="only re-render the report from the last run")
    args = ap.parse_args()
    require_this_checkout()

    run = OUT / "engine_restart"
    if args.report:
        write_report(json.loads((OUT / "engine_restart.json").read_text()) | {"restarts": restarts_of(run)})
        return
    run.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    port = free_port()
    cfg["server"]["listen"] = f"127.0.0.1:{port}"
    cfg["server"]["socket_path"] = f"/tmp/zccp-bench-{tag}/doorbell.sock"
    cfg["cache"]["redis_url"] = f"redis://127.0.0.1:{free_port()}/0"
    cfg["shared_memory"]["name"] = f"/zccp.bench.{tag}"
    cfg_path = run / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONPATH=str(REPO / "engine"))
    log = open(run / "zccp-stack.out", "wb")
    stack = subprocess.Popen([sys.executable, "-m", "zccp.ops.cli", "stack", "up", "--config", str(cfg_path),
                              "--run-dir", str(run)], stdout=log, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
    kills: list[Kill] = []
    load = Load(url, args.clients)
    try:
        end = time.monotonic() + 180
        while health(url) is None:
            assert stack.poll() is None and time.monotonic() < end, "the stack did not come up"
            time.sleep(0.2)
        nginx_master = int((run / "nginx" / "nginx.pid").read_text())
        load.start()
        load_start = os.getloadavg()[0]
        time.sleep(args.settle)
        for n in range(1, args.kills + 1):
            h = health(url)
            assert h is not None, "not healthy before a kill"
            k = Kill(n, time.monotonic(), h["engine_pid"])
            os.kill(k.engine_pid, signal.SIGKILL)
            while True:
                h2 = health(url)
                if h2 is not None and h2["epoch"] != h["epoch"] and not k.health_s:
                    k.health_s = time.monotonic() - k.at
                ok = [a for a in load.since(k.at) if a.status == 200]
                if ok:
                    k.recovery_s = min(a.done for a in ok) - k.at
                    break
                assert time.monotonic() < k.at + 120, f"kill {n}: no 200 within 120 s"
                time.sleep(0.02)
            outage = [a for a in load.since(k.at) if a.sent < k.at + k.recovery_s]
            k.answers = dict(Counter(str(a.status) for a in outage))
            bad = [a for a in outage if not a.shaped]
            assert not bad, f"kill {n}: answers that were not API-shaped: {bad[:3]}"
            kills.append(k)
            print(f"kill {n:2d}: recovered in {k.recovery_s:.2f} s (health {k.health_s:.2f} s), "
                  f"answers while down {k.answers}", flush=True)
            time.sleep(args.settle)
        load.stop()
        time.sleep(1.0)
        final = health(url)
        assert final is not None
        leaked = {"slots_claimed": final["slots_claimed"], "slots_busy": final["slots_busy"]}
        same_nginx = int((run / "nginx" / "nginx.pid").read_text()) == nginx_master
    finally:
        load.stop()
        os.kill(stack.pid, signal.SIGINT)
        stack.wait(60)
        log.close()
        shutil.rmtree(Path(cfg["server"]["socket_path"]).parent, ignore_errors=True)
    statuses = Counter(str(a.status) for a in load.answers)
    rec = sorted(k.recovery_s for k in kills)
    result = {
        "kills": [asdict(k) | {"at": None} for k in kills],
        "recovery_p50_s": statistics.median(rec), "recovery_max_s": max(rec), "recovery_min_s": min(rec),
        "leaked": leaked, "nginx_restarted": not same_nginx, "all_answers": dict(statuses),
        "clients": args.clients, "settle_s": args.settle,
        "machine": f"{platform.node()} {os.cpu_count()} cores, {platform.platform()}",
        "backend": cfg["model"]["backend"],
        "loadavg": f"{load_start:.1f}, {os.getloadavg()[0]:.1f}",
    }
    result["restarts"] = restarts_of(run)
    (OUT / "engine_restart.json").write_text(json.dumps(result, indent=1))
    write_report(result)
    print(f"p50 {result['recovery_p50_s']:.2f} s, max {result['recovery_max_s']:.2f} s, leaked {leaked}")


def restarts_of(run: Path) -> list[float]:
    """zccp-stack's own account of each restart: engine exit -> serving again, in seconds."""
    out = (run / "zccp-stack.out").read_text(errors="replace")
    return [float(m) for m in re.findall(r"engine serving again \(pid \d+\), ([\d.]+) s after it exited", out)]


def write_report(r: dict) -> None:
    restarts = r.get("restarts") or []

    def row(i: int, k: dict) -> str:
        restart = f"{restarts[i]:.1f}" if i < len(restarts) else "?"
        answers = ", ".join(f"{s}: {c}" for s, c in sorted(k["answers"].items()))
        return f"| {k['n']} | {k['recovery_s']:.2f} | {k['health_s']:.2f} | {restart} | {answers} |"

    rows = "\n".join(row(i, k) for i, k in enumerate(r["kills"]))
    text = REPORT.read_text()
    start, end = "<!-- results -->", "<!-- /results -->"
    body = f"""{start}
Run: {r['machine']}; backend `{r['backend']}`; {r['clients']} clients; {len(r['kills'])} kills,
{r['settle_s']:.0f} s of service between them; load average {r.get('loadavg', '?')} (start, end).

| kill | first 200 after the kill (s) | /health back (s) | engine exit → serving, by zccp-stack (s) | \
answers to requests sent until the first 200 (status: count) |
|---|---|---|---|---|
{rows}

**Recovery (kill → first 200): p50 {r['recovery_p50_s']:.2f} s, min {r['recovery_min_s']:.2f} s,
max {r['recovery_max_s']:.2f} s.** Leaked slots after the run: {r['leaked']['slots_claimed']} claimed,
{r['leaked']['slots_busy']} busy. nginx restarted: {'yes' if r['nginx_restarted'] else 'no'}.
Every answer of the run, by status: {', '.join(f'{s}: {c}' for s, c in sorted(r['all_answers'].items()))}.
{end}"""
    REPORT.write_text(text[: text.index(start)] + body + text[text.index(end) + len(end):])


if __name__ == "__main__":
    main()
