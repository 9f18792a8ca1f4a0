"""Batched prefill on the CPU, measured without HTTP: bench/peer.md's medium checkpoint.

    PYTHONPATH=engine .venv/bin/python -m bench.prefill_groups [--reps 5] [--group 256]

1. The forward alone: 16 distinct prompts of 64-77 tokens prefilled in groups of 1, 2, 4, 8
   and 16 rows (HfBackend.prefill_many), min and median ms of --reps.
2. The scheduler alone (zccp.serving.scheduler with the engine's planner, a sink that keeps nothing):
   c sequences at once, each replaced by a new distinct prompt when it ends until 2c have run,
   max_tokens 32, greedy; prefill one by one (zccp.serving.planner.CPU_GROUP_TOKENS = 1) against
   groups of --group tokens, alternating, --reps times: tokens/s (wall and per CPU second of
   the process) and TTFT p50 (submit -> first token on the model thread).
One torch thread. The numbers are written to stdout; bench/peer.md records them.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

import zccp.serving.planner as planner
from bench.peer import build
from zccp.observe.metrics import EngineMetrics
from zccp.model.hf import HfBackend
from zccp.serving.planner import Planner
from zccp.serving.scheduler import BatchLimits, BatchScheduler, Sequence
from zccp.shared_types import SamplingParams

MAX_TOKENS = 32


def prompts(n: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 590, (int(torch.randint(64, 78, (1,), generator=g)),), dtype=torch.int32, generator=g)
            for _ in range(n)]


@torch.inference_mode()
def forward_groups(hf: HfBackend, reps: int) -> None:
    ids = [p.long() for p in prompts(16, 0)]
    times: dict[int, list[float]] = {k: [] for k in (1, 2, 4, 8, 16)}
    for _ in range(reps):
        for k in times:
            t0 = time.perf_counter()
            for i in range(0, 16, k):
                hf.prefill_many([hf.new_state() for _ in ids[i:i + k]], ids[i:i + k])
            times[k].append((time.perf_counter() - t0) * 1000)
    for k, v in times.items():
        print(f"forward: 16 prompts in groups of {k:2d}: min {min(v):.0f} ms, median {statistics.median(v):.0f} ms")


class _Sink:
    blocked = False

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.first: float | None = None

    def start(self, *args: Any) -> None: ...

    def kept(self, tokens: int) -> None: ...

    def token(self, token: int, *args: Any) -> bool:
        if self.first is None:
            self.first = time.perf_counter() - self.t0
        return False

    def end(self, reason: str, output_tokens: int) -> int:
        return output_tokens

    def flush(self) -> bool:
        return True

    def fail(self) -> None:
        raise AssertionError("failed")

    def abandoned(self, exc: Exception) -> None:
        raise AssertionError("abandoned")


def scheduler_run(hf: HfBackend, conc: int, seed: int) -> tuple[float, float, float]:
    """(tokens/s wall, tokens per CPU second, TTFT p50 ms) of 2 x conc sequences."""
    per_token = hf.activation_bytes_per_token + hf.kv_bytes_per_token          # as zccp.process.engine plans
    plan = Planner(torch.device("cpu"), 512 << 20, per_token, 0, 16)
    sched = BatchScheduler(hf, BatchLimits(32, 64, 512 << 20), plan, None, EngineMetrics())
    todo = prompts(2 * conc, seed)
    lock, finished = threading.Lock(), threading.Event()
    tokens, ttfts, left = [0], [], [len(todo)]

    def submit() -> None:
        ids, sink = todo.pop(), _Sink()

        def done(value: Any, sink: _Sink = sink) -> None:
            with lock:
                tokens[0] += value or 0
                ttfts.append(sink.first or 0.0)
                left[0] -= 1
                if todo:
                    submit()
                elif not left[0]:
                    finished.set()

        sched.submit(Sequence(ids, ids.numpy(), SamplingParams(max_tokens=MAX_TOKENS, temperature=0), sink,
                              lambda: False, done))

    t0, c0 = time.perf_counter(), time.process_time()
    with lock:
        for _ in range(conc):
            submit()
    finished.wait()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    sched.stop()
    return tokens[0] / wall, tokens[0] / cpu, statistics.median(ttfts) * 1000


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.prefill_groups")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--group", type=int, default=planner.CPU_GROUP_TOKENS)
    ap.add_argument("--concs", default="8,16")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="zccp-groups-") as tmp:
        hf = HfBackend(str(build(Path(tmp) / "ckpt")), "zccp-hf-bench")
        forward_groups(hf, args.reps)
        for conc in (int(c) for c in args.concs.split(",")):
            res: dict[str, list[tuple[float, float, float]]] = {"one by one": [], f"groups of {args.group}": []}
            for rep in range(args.reps):
                for mode in res:
                    planner.CPU_GROUP_TOKENS = 1 if mode == "one by one" else args.group
                    res[mode].append(scheduler_run(hf, conc, rep))
            for mode, rows in res.items():
                tps, tpc, ttft = (statistics.median(r[i] for r in rows) for i in range(3))
                print(f"scheduler c={conc} {mode}: {tps:.1f} tok/s, {tpc:.1f} tok per CPU s, TTFT p50 {ttft:.0f} ms "
                      f"(medians of {args.reps})")


if __name__ == "__main__":
    main()
