"""Misses that grow with cores (issue 47 item 2): the null model's misses per second through
ZCCP with 1, 2 and 3 engine processes (server.engine_processes) against nginx -> FastAPI (B,
two uvicorn workers), cache bypassed, on core subsets (every process of a variant and wrk
pinned with sched_setaffinity, as `taskset` would), and the miss rows of bench.run's matrix
(1 KiB, ShareGPT, 64 KiB, 512 KiB at c=16 and c=64). Rounds interleaved: each ratio is the
median of per-round ratios, both sides seconds apart.

    python -m bench.prep_scaling [--seconds 2.5] [--rounds 3] [--json bench/prep_scaling.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from bench import procs
from bench.bodies import sharegpt_bodies, synthetic_body
from bench.run import NULL, SIZES, log, measured_run, wrk
from bench.services import Variant, start_b, start_d

PROCESSES = (1, 2, 3)
ALL_CPUS = sorted(os.sched_getaffinity(0))


def pin(v: Variant | None, cpus: list[int]) -> None:
    """This process (wrk inherits it) and every process of v on cpus."""
    os.sched_setaffinity(0, cpus)
    if v is None:
        return
    for root in v.pids().values():
        for pid in procs.descendants(root):
            try:
                os.sched_setaffinity(pid, cpus)
            except (ProcessLookupError, PermissionError):
                pass


def start_all(tmp: Path) -> dict[str, Variant]:
    out: dict[str, Variant] = {}
    try:
        out["B"] = start_b(tmp / "B", NULL, 2)
        for n in PROCESSES:
            out[f"D{n}"] = start_d(tmp / f"D{n}", dict(NULL, engine_processes=n), 72)
    except BaseException:
        for v in out.values():
            v.stop()
        raise
    return out


def cell(variants: dict[str, Variant], keys: list[str], body: Path, conc: int, seconds: float,
         rounds: int, cpus: list[int]) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {k: [] for k in keys}
    for _ in range(rounds):
        for k in keys:
            v = variants[k]
            pin(v, cpus)
            v.wait_drained()
            r = measured_run(v, body, conc, seconds, nocache=True)
            pin(v, ALL_CPUS)
            if r["errors"]:
                raise RuntimeError(f"{k}: {r['errors']} errors {r['statuses']}: {r['wrk_tail']}")
            engine = r["procs"].get("engine", {})
            runs[k].append({"rps": r["rps"], "p99_ms": r["p99_ms"], "other_cores": r["other_cores"],
                            "engine_cores": engine.get("cpu_util", 0.0), "engine_procs": engine.get("procs", 0)})
    return runs


def summary(runs: dict[str, list[dict]]) -> dict[str, dict]:
    out = {}
    for k, rs in runs.items():
        ratios = [r["rps"] / b["rps"] for r, b in zip(rs, runs["B"], strict=True)]
        out[k] = {"rps": statistics.median(r["rps"] for r in rs), "vs_B": statistics.median(ratios),
                  "vs_B_rounds": ratios, "engine_cores": statistics.median(r["engine_cores"] for r in rs),
                  "other_cores": statistics.median(r["other_cores"] for r in rs)}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sharegpt-sample", type=int, default=300)
    ap.add_argument("--json", default="bench/prep_scaling.json")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="zccp-prep-"))
    files = {}
    for name, size in SIZES.items():
        files[name] = tmp / f"{name}.jsonl"
        files[name].write_text(synthetic_body(size, NULL["model_name"]) + "\n")
    picked, _ = sharegpt_bodies(NULL["model_name"], NULL["max_body_kb"] * 1024, args.sharegpt_sample)
    files["sharegpt"] = tmp / "sharegpt.jsonl"
    files["sharegpt"].write_text("\n".join(picked) + "\n")
    variants = start_all(tmp)
    result: dict = {"cpus": ALL_CPUS, "seconds": args.seconds, "rounds": args.rounds, "scaling": [], "matrix": [],
                    "load1_start": os.getloadavg()[0]}
    try:
        for v in variants.values():   # warm-up
            wrk(v.url, files["1k"], 16, 1, True)
        keys = ["B", *[f"D{n}" for n in PROCESSES]]
        for ncpu in range(1, len(ALL_CPUS) + 1):
            cpus = ALL_CPUS[:ncpu]
            for conc in (16, 64):
                s = summary(cell(variants, keys, files["1k"], conc, args.seconds, args.rounds, cpus))
                result["scaling"].append({"cpus": cpus, "conc": conc, "variants": s})
                log(f"cpus {cpus} c={conc}: " + "  ".join(f"{k} {x['rps']:.0f}/s ({x['vs_B']:.2f}x B)"
                                                          for k, x in s.items()))
        for wl in ("1k", "sharegpt", "64k", "512k"):
            for conc in (16, 64):
                s = summary(cell(variants, ["B", "D1", "D2"], files[wl], conc, args.seconds, args.rounds, ALL_CPUS))
                result["matrix"].append({"workload": wl, "conc": conc, "variants": s})
                log(f"{wl} c={conc}: " + "  ".join(f"{k} {x['rps']:.0f}/s ({x['vs_B']:.2f}x B)"
                                                   for k, x in s.items()))
    finally:
        for v in variants.values():
            v.stop()
        result["load1_end"] = os.getloadavg()[0]
        Path(args.json).write_text(json.dumps(result, indent=1))
        log(f"written {args.json}")


if __name__ == "__main__":
    main()
