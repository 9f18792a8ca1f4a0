"""Tracing's cost on the real ZCCP stack (bench/services.start_d: redis, null engine, nginx):
one stack with tracing off, one with it on at ratio 1.0 (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
pointing at tests/support/otlp_receiver, a real OTLP/HTTP server in this process), both
running at once; rounds interleaved, the order swapped each round; 1 KiB nginx L1 hits and
no-cache misses (the null engine: a miss is the engine's per-request work alone, the worst
case for tracing's share).

    PYTHONPATH=engine python -m bench.tracing_ab [--rounds 3] [--seconds 3] [--ratio R] [--model tiny] [--json F]

--ratio: the traced stack's sampling ratio (OTEL_TRACES_SAMPLER=parentbased_traceidratio);
--model tiny: the tiny torch model instead of the null engine (a miss then decodes tokens).
--aa: "on" untraced as well (OTEL_SDK_DISABLED=true): what the two stacks differ by alone.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from statistics import median

from bench import procs
from bench.bodies import synthetic_body
from bench.run import NULL, TINY, measured_run, wrk
from bench.services import post, start_d
from tests.support.checkout import require_this_checkout
from tests.support.otlp_receiver import OtlpReceiver


def span_pids(engine_root: int) -> list[int]:
    """The engine's span processes (zccp.observe.trace_spans): their CPU is reported apart."""
    out = []
    for pid in procs.descendants(engine_root):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"zccp.observe.trace_spans" in f.read():
                    out.append(pid)
        except OSError:
            pass
    return out


def span_cpu_s(pids: list[int]) -> float:
    return sum(procs.delta(procs.Snap({}, {}), procs.snapshot(p))["cpu_s"] for p in pids)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--conc", type=int, default=16)
    ap.add_argument("--ratio", type=float, default=1.0)
    ap.add_argument("--model", choices=("null", "tiny"), default="null")
    ap.add_argument("--aa", action="store_true",
                    help="the second stack untraced too (OTEL_SDK_DISABLED=true): the bench's own bias")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    require_this_checkout()
    tmp = Path(tempfile.mkdtemp(prefix="zccp-tracing-"))
    body = tmp / "1k.jsonl"
    base = TINY if args.model == "tiny" else dict(NULL, segment_size_kb=1024, tokens_kb=256, max_body_kb=64)
    body.write_text(synthetic_body(1024, base["model_name"]) + "\n")
    rx = OtlpReceiver(keep=False)
    lim = dict(base)
    sampler = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": rx.url + "/v1/traces",
               "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": str(args.ratio)}
    if args.aa:
        sampler["OTEL_SDK_DISABLED"] = "true"
    variants = {}
    try:
        variants["off"] = start_d(tmp / "off", lim, 32)
        os.environ.update(sampler)
        try:
            variants["on"] = start_d(tmp / "on", lim, 32)
        finally:
            for k in sampler:
                del os.environ[k]
        runs: dict[str, list[dict]] = {}
        names = list(variants)
        for v in variants.values():
            post(v.url, body.read_bytes())
        for i in range(args.rounds):
            for name in names[i % 2:] + names[:i % 2]:
                v = variants[name]
                for path, nocache in (("hit", False), ("miss", True)):
                    wrk(v.url, body, args.conc, 1, nocache)   # warm-up
                    v.wait_drained()
                    spans_at = span_pids(v.pids()["engine"])
                    cpu0 = span_cpu_s(spans_at)
                    r = measured_run(v, body, args.conc, args.seconds, nocache)
                    span_us = (span_cpu_s(spans_at) - cpu0) / max(r["requests"], 1) * 1e6
                    if r["errors"]:
                        raise RuntimeError(f"{name} {path}: {r['errors']} errors {r['statuses']}")
                    engine_us = r["procs"]["engine"]["cpu_s_per_req"] * 1e6 - span_us
                    runs.setdefault(f"{name} {path}", []).append(
                        {"rps": r["rps"], "engine_us": engine_us, "span_process_us": span_us,
                         "other_cores": r["other_cores"]})
                    print(f"round {i + 1} tracing {name:3s} {path:4s} {r['rps']:8.0f} req/s  engine "
                          f"{engine_us:6.1f} µs/req  span process {span_us:5.1f} µs/req  "
                          f"(other load {r['other_cores']:.2f} cores)", flush=True)
    finally:
        for v in variants.values():
            v.stop()
        spans = rx.count
        rx.close()
    print(f"\nspans received from the traced stack: {spans}")
    print("| tracing | path | req/s (median) | engine CPU µs/req (median) | span process µs/req | "
          "paired req/s on/off |")
    print("|---|---|---|---|---|---|")
    for key, rs in runs.items():
        name, path = key.split()
        base = runs[f"off {path}"]
        q = median([r["rps"] / b["rps"] for b, r in zip(base, rs, strict=True)])
        print(f"| {name} | {path} | {median([r['rps'] for r in rs]):.0f} | "
              f"{median([r['engine_us'] for r in rs]):.1f} | {median([r['span_process_us'] for r in rs]):.1f} | "
              f"{q:.3f}× |")
    if args.json:
        args.json.write_text(json.dumps({"rounds": args.rounds, "ratio": args.ratio, "model": args.model,
                                         "spans": spans, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
