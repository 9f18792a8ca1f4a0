"""The engine's CPU per output token beyond the model's forward (issue 47): one request at a
time through a real stack (the tests' Stack: nginx + engine, cache off), n = 1, no tools, no
stops, a long max_tokens, streamed and not. The null backend names each token itself (no
logits, no sampling): what its model thread spends per token is the engine's own path
(scheduler step, sink, text assembly, SSE framing, ring writes). Counters, not wall time
(the machine is shared): the model thread's CPU clock (/proc/<pid>/task/<tid>/schedstat, ns),
its share in the kernel, and the whole engine process's (utime + stime), each divided by the
tokens generated (the wall time per token beside them, for pairs run together); with
--profile, the model thread's function calls per token (cProfile, a separate run).

    PYTHONPATH=engine python -m bench.per_token [--tokens 4000] [--requests 8] [--concurrency 1] [--profile]

The non-streamed null request would take the inline path (no model thread) with no token
delay, so every run sets model.null_token_delay_ms to a microsecond (the scheduler path); the
CPU of that time.sleep call, measured in this process, is the "forward" subtracted. Writes
bench/per_token.json; bench/per_token.md records the method and the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.support.harness import Stack

HOOK = str(Path(__file__).resolve().parent / "per_token_hook")
DELAY_MS = 0.001


def sleep_cpu_ns(n: int = 20000) -> float:
    """CPU per time.sleep(DELAY_MS / 1000) on this thread: the null backend's 'forward'."""
    t0 = time.thread_time_ns()
    for _ in range(n):
        time.sleep(DELAY_MS / 1000)
    return (time.thread_time_ns() - t0) / n


def thread_ns(pid: int, tid: int) -> int:
    return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])


def thread_sys_share(pid: int, tid: int) -> tuple[int, int]:
    """The thread's utime and stime, in clock ticks (its time in the kernel: the doorbell's send)."""
    f = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(f[11]), int(f[12])


def process_switches(pid: int) -> int:
    """Context switches of all the engine's threads so far (a loop woken per token shows here)."""
    n = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if "ctxt_switches:" in line:
                n += int(line.split()[1])
    return n


def decode_steps(stack: Stack) -> float:
    """The engine's batched decode steps so far (tokens / steps: the batch the model thread ran)."""
    m = re.search(r"^zccp_engine_decode_steps_total (\S+)$", stack.admin_client().get("/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def process_ns(pid: int) -> int:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def one(stack: Stack, stream: bool, tokens: int) -> int:
    body = {"model": "zccp-null", "max_tokens": tokens, "stream": stream,
            "messages": [{"role": "user", "content": "hi"}]}
    with stack.client(timeout=120) as c:
        if stream:
            with c.stream("POST", "/v1/messages", json=body) as r:
                assert r.status_code == 200, r.read()
                for _ in r.iter_raw():
                    pass
        else:
            r = c.post("/v1/messages", json=body)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["output_tokens"] == tokens, r.text
    return tokens


def run(stream: bool, tokens: int, requests: int, profile: Path | None, backend: str,
        concurrency: int = 1) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="zccp-pertoken-") as d:
        tid_file = Path(d) / "tid"
        env = {"ZCCP_BENCH_TID": str(tid_file), "PYTHONPATH": os.pathsep.join([HOOK, os.environ.get("PYTHONPATH", "")])}
        if profile is not None:
            env["ZCCP_BENCH_PROFILE"] = str(profile)
        model: dict[str, Any] = {"backend": backend, "name": "zccp-null", "max_context": 4 * tokens + 4096,
                                 "null_reply": "abcdefgh" * (tokens // 8 + 1), "null_token_delay_ms": DELAY_MS}
        if backend == "tiny":
            model = {"backend": "tiny", "name": "zccp-null", "max_context": 4 * tokens + 4096}
        stack = Stack(Path(d) / "run", overrides={"model": model, "logging": {"level": "warning"},
                                                  "limits": {"request_timeout_ms": 120000}})
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            stack.start()
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        try:
            assert stack.engine is not None and stack.engine.proc is not None
            pid = stack.engine.proc.pid
            one(stack, stream, 64)                       # warm
            tid = int(tid_file.read_text())
            t0, p0, s0, c0 = thread_ns(pid, tid), process_ns(pid), thread_sys_share(pid, tid), process_switches(pid)
            w0, d0 = time.perf_counter_ns(), decode_steps(stack)
            with ThreadPoolExecutor(concurrency) as pool:     # requests streams, concurrency at a time
                n = sum(pool.map(lambda _: one(stack, stream, tokens), range(requests)))
            w1, d1 = time.perf_counter_ns(), decode_steps(stack)
            t1, p1, s1, c1 = thread_ns(pid, tid), process_ns(pid), thread_sys_share(pid, tid), process_switches(pid)
        finally:
            stack.stop()
    user, system = s1[0] - s0[0], s1[1] - s0[1]
    return {"tokens": n, "model_thread_ns": (t1 - t0) / n, "process_ns": (p1 - p0) / n,
            "model_thread_kernel_share": system / max(1, user + system), "wall_ns": (w1 - w0) / n,
            "switches": (c1 - c0) / n, "tokens_per_step": n / max(1.0, d1 - d0)}


def calls_per_token(path: Path, tokens: int, top: int = 25) -> list[tuple[str, float, float]]:
    st = pstats.Stats(str(path))
    rows = []
    for (file, line, fn), (_cc, nc, tt, _ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        rows.append((f"{Path(file).name}:{line}:{fn}", nc / tokens, tt * 1e6 / tokens))
    total = sum(r[1] for r in rows)
    rows.sort(key=lambda r: -r[2])
    return [("TOTAL calls", total, sum(r[2] for r in rows)), *rows[:top]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=1, help="streams at once (the batch the model thread steps)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--backend", default="null", choices=["null", "tiny"])
    ap.add_argument("--json", default=str(Path(__file__).with_suffix(".json")))
    a = ap.parse_args()
    forward = sleep_cpu_ns() if a.backend == "null" else 0.0
    out: dict[str, Any] = {"forward_ns": forward, "backend": a.backend, "rows": {}}
    for stream in (True, False):
        key = "streamed" if stream else "non-streamed"
        row = run(stream, a.tokens, a.requests, None, a.backend, a.concurrency)
        row["beyond_forward_us"] = (row["model_thread_ns"] - forward) / 1000
        if a.profile:
            prof = Path(tempfile.mkdtemp()) / "model.prof"
            run(stream, a.tokens, 2, prof, a.backend)
            row["calls"] = calls_per_token(prof, 2 * a.tokens + 64)
        out["rows"][key] = row
        print(f"{key}: model thread {row['model_thread_ns'] / 1000:.1f} us/token, beyond the forward "
              f"{row['beyond_forward_us']:.1f} us ({row['model_thread_kernel_share']:.0%} in the kernel); "
              f"engine process {row['process_ns'] / 1000:.1f} us/token, "
              f"{row['switches']:.2f} context switches/token; wall {row['wall_ns'] / 1000:.1f} us/token; "
              f"{row['tokens_per_step']:.2f} tokens/step")
        for name, calls, us in row.get("calls", []):
            print(f"    {calls:8.2f} calls {us:7.2f} us  {name}")
    Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
