"""Interleaved live A/B of the engine's CPU per 1 KiB null-model miss (no-cache, no-store):
two D stacks side by side, one running a base checkout's engine, one this checkout's, measured
in turns (base, new, then new, base, ...), each round's engine and nginx CPU µs per request
from /proc (bench.run.measured_run).

    PYTHONPATH=. .venv/bin/python -m bench.engine_ab BASE_ENGINE_DIR [rounds] [seconds] [conc] [workload]

BASE_ENGINE_DIR: the other checkout's engine/ (e.g. a worktree of main); nginx and its Lua
are this checkout's for both. workload: 1k (default) or sharegpt (bench.run's 2000 prompts).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench.services as S
from bench.bodies import sharegpt_bodies, synthetic_body
from bench.run import NULL, measured_run, wrk

HERE = str(Path(__file__).resolve().parents[1] / "engine")
orig = S.engine_service


def make(tree: str) -> Any:
    """bench.services' engine_service, the engine's package taken from `tree`."""
    def svc(config_path: Path, cfg: Any, run_dir: Path, extra_env: dict[str, str] | None = None, **kw: Any) -> Any:
        return orig(config_path, cfg, run_dir, dict(extra_env or {}, PYTHONPATH=tree), **kw)
    return svc


def main() -> None:
    trees = {"base": sys.argv[1], "new": HERE}
    args = sys.argv[2:] + ["8", "3", "16", "1k"][len(sys.argv) - 2:]
    rounds, secs, conc, workload = int(args[0]), float(args[1]), int(args[2]), args[3]
    tmp = Path(tempfile.mkdtemp(prefix="zccp-ab-"))
    body = tmp / f"{workload}.jsonl"
    if workload == "sharegpt":
        picked, _ = sharegpt_bodies(str(NULL["model_name"]), int(NULL["max_body_kb"]) * 1024, 2000)
        body.write_text("\n".join(picked) + "\n")
    else:
        body.write_text(synthetic_body(1024, str(NULL["model_name"])) + "\n")
    lim = dict(NULL, segment_size_kb=1024, tokens_kb=256, max_body_kb=64)
    vs: dict[str, S.Variant] = {}
    try:
        for k, tree in trees.items():
            S.engine_service = make(tree)
            vs[k] = S.start_d(tmp / k, lim, 32)
        S.engine_service = orig
        for k in vs:
            wrk(vs[k].url, body, conc, 1, True)
        for i in range(rounds):
            for k in (("base", "new") if i % 2 == 0 else ("new", "base")):
                vs[k].wait_drained()
                r = measured_run(vs[k], body, conc, secs, True)
                e = r["procs"]["engine"]["cpu_s_per_req"] * 1e6
                n = r["procs"]["nginx"]["cpu_s_per_req"] * 1e6
                print(f"{time.strftime('%H:%M:%S')} round {i+1} {k:4s} {r['rps']:8.0f} req/s engine {e:6.1f} µs/req "
                      f"nginx {n:6.1f} µs/req errors {r['errors']} other load {r['other_cores']:.2f}", flush=True)
    finally:
        for v in vs.values():
            v.stop()


if __name__ == "__main__":
    main()
