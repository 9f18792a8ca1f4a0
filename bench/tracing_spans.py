"""The span process alone (zccp.trace_spans, a real child as the engine starts it), fed frames
of null-engine miss records at a steady rate, its CPU per record from /proc; the test OTLP
receiver in a process of its own. Several trees at once, their rounds interleaved, to compare
a change with its base on a shared host (bench/tracing.md).

    PYTHONPATH=engine python -m bench.tracing_spans [--rounds 5] [--frames 12] [--rate 3000] [TREE ...]

TREE: a checkout's root (default: this one); each runs its own engine/zccp.trace_spans.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from random import getrandbits
from statistics import median

from bench import procs
from zccp.abi import CacheStatus
from zccp.trace_export import BATCH, frame

REPO = Path(__file__).resolve().parents[1]
STATIC = {"model": "null", "engine": "e0", "server.address": "127.0.0.1", "server.port": 8000, "endpoint": None}
RECEIVER = "from tests.support.otlp_receiver import OtlpReceiver; import time; " \
           "rx = OtlpReceiver(keep=False); print(rx.url, flush=True); time.sleep(1e6)"


def miss_record(i: int) -> tuple[object, ...]:
    """A null-engine miss's record as zccp.trace_export.RequestTrace.end writes it (no client
    traceparent; the ids made for the histograms' exemplars)."""
    now = time.time_ns()
    perf0 = 1000.0 + i
    return (None, 0, getrandbits(128), getrandbits(64), (now - 300_000, 120), now - 250_000, perf0,
            (perf0 + 5e-5, perf0 + 7e-5, perf0 + 1e-4, perf0 + 1.2e-4), now, None, 200, int(CacheStatus.MISS),
            i % 32, f"{getrandbits(128):032x}", "anthropic", 16, None, (260, 16, "end_turn"),
            f"msg_{getrandbits(96):024x}", "")


def one_round(tree: Path, url: str, frames: list[bytes], rate: float) -> float:
    """The span process's CPU µs per record over `frames`, sent at `rate` records/s, after a
    warm-up of the same frames until its first export (its imports, its connection)."""
    env = dict(os.environ, PYTHONPATH=str(tree / "engine"), OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=url + "/v1/traces")
    p = subprocess.Popen([sys.executable, "-m", "zccp.trace_spans"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         env=env, cwd=tree)
    assert p.stdin is not None and p.stdout is not None
    out = p.stdout
    reports: list[bytes] = []
    reader = threading.Thread(target=lambda: reports.extend(out), daemon=True)
    reader.start()
    p.stdin.write(frame(STATIC))
    sent = 0

    def send(what: list[bytes]) -> None:
        nonlocal sent
        t0 = time.monotonic()
        for k, f in enumerate(what):
            assert p.stdin is not None
            p.stdin.write(f)
            p.stdin.flush()
            sent += 1
            time.sleep(max(0.0, t0 + (k + 1) * BATCH / rate - time.monotonic()))
            if what is not frames and reports:
                return

    while not reports:
        send(frames)
    cpu0 = procs.delta(procs.Snap({}, {}), procs.snapshot(p.pid))["cpu_s"]
    send(frames)
    p.stdin.close()
    reader.join()
    _, _, usage = os.wait4(p.pid, 0)     # its CPU up to its exit, the last post included
    p.returncode = 0
    exported = sum(int(line.split()[1]) for line in reports if line.startswith(b"exported"))
    if exported != 6 * BATCH * sent:
        raise RuntimeError(f"{tree}: {exported} spans exported of {6 * BATCH * sent}")
    return (usage.ru_utime + usage.ru_stime - cpu0) / (BATCH * len(frames)) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--frames", type=int, default=12)
    ap.add_argument("--rate", type=float, default=3000.0, help="records per second")
    ap.add_argument("trees", nargs="*", type=Path, default=[REPO])
    args = ap.parse_args()
    rx = subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'engine'}"))
    assert rx.stdout is not None
    url = rx.stdout.readline().strip()
    got: dict[Path, list[float]] = {t: [] for t in args.trees}
    try:
        for r in range(args.rounds):
            frames = [frame([miss_record(i) for i in range(BATCH)]) for _ in range(args.frames)]
            order = args.trees[r % len(args.trees):] + args.trees[:r % len(args.trees)]
            for t in order:
                got[t].append(one_round(t.resolve(), url, frames, args.rate))
            print(f"round {r + 1}: " + "  ".join(f"{t}: {got[t][-1]:.1f}" for t in args.trees), flush=True)
    finally:
        rx.kill()
    for t, us in got.items():
        print(f"{t}: span process {median(us):.1f} µs per miss record (median of {len(us)}; "
              f"{min(us):.1f}-{max(us):.1f})")


if __name__ == "__main__":
    main()
