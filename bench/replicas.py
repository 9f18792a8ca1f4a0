"""The 1 KiB miss with engine replicas (issue 29): one engine vs N engines of the null model
under one nginx (an `engines:` list) vs nginx -> FastAPI (B), interleaved in one run.

    .venv/bin/python -m bench.replicas                  # D1, D2, D2rr, B; c=16,64; 4 rounds of 4 s
    .venv/bin/python -m bench.replicas --variants D1,D2,D3,D2ll --rounds 6 --duration 5

Every variant runs at once (started before the first round, stopped after the last); each
round runs every (variant, c) once, the variants' order rotating per round, so a change in
the machine's load falls on all of them alike. D runs send `Cache-Control: no-cache, no-store`
(the miss: every request reaches an engine); B has no cache. Writes bench/replicas.json and
bench/replicas.md (medians over rounds, µs of CPU per request per role, cores busy).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.bodies import synthetic_body
from bench.run import NULL, log, measured_run, wrk
from bench.services import BENCH, Variant, start_b, start_d

ROLES = ("nginx", "engine", "backend", "redis", "wrk")


POLICIES = {"": "affinity", "rr": "round_robin", "ll": "least_loaded"}


def _spec(label: str) -> tuple[int, str]:
    """"D2rr" -> (2, "round_robin"): D, the engines per model, the routing policy's suffix."""
    n = label[1:].rstrip("rl")
    if not label.startswith("D") or not n.isdigit() or label[1 + len(n):] not in POLICIES:
        raise SystemExit(f"--variants: {label!r} is not D<engines>[rr|ll]")
    return int(n), POLICIES[label[1 + len(n):]]


def _roles(row: dict) -> dict[str, dict[str, float]]:
    """Per role µs/req and cores, the engines (engine, engine-r1, ...) summed as "engine"."""
    out: dict[str, dict[str, float]] = {}
    for role, p in row["procs"].items():
        key = "engine" if role.startswith("engine") else role
        acc = out.setdefault(key, {"us_per_req": 0.0, "cores": 0.0})
        acc["us_per_req"] += p["cpu_s_per_req"] * 1e6
        acc["cores"] += p["cpu_util"]
    return out


def _median_rows(rows: list[dict]) -> dict:
    roles = [_roles(r) for r in rows]
    med: dict = {"rps": statistics.median(r["rps"] for r in rows),
                 "p50_ms": statistics.median(r["p50_ms"] for r in rows),
                 "p99_ms": statistics.median(r["p99_ms"] for r in rows),
                 "errors": sum(r["errors"] for r in rows),
                 "other_cores": statistics.median(r["other_cores"] for r in rows), "roles": {}}
    for role in ROLES:
        have = [x[role] for x in roles if role in x]
        if have:
            med["roles"][role] = {k: statistics.median(h[k] for h in have) for k in ("us_per_req", "cores")}
    med["cores"] = sum(v["cores"] for v in med["roles"].values())
    # each engine's cores (how evenly the router spread the requests)
    names = sorted(k for k in rows[0]["procs"] if k.startswith("engine"))
    med["engine_cores"] = [statistics.median(r["procs"][k]["cpu_util"] for r in rows) for k in names]
    return med


def report(results: dict) -> str:
    a = results["args"]
    out = ["# The 1 KiB miss with engine replicas (issue 29)", "",
           f"`python -m bench.replicas {results['argv']}` ({results['started']} UTC, {a['rounds']} rounds of "
           f"{a['duration']:.0f} s per variant and concurrency, interleaved, order rotating per round; medians).",
           "D1: one engine (no `engines:` list, the default); DN: N engines of the null model in one "
           "`engines:` list under the same nginx (2 workers), routing.policy affinity (DNrr: round_robin, "
           "DNll: least_loaded); every D request `Cache-Control: no-cache, no-store`; wrk cycles "
           f"{a['bodies']} distinct 1 KiB bodies (conversations) in every variant. B: nginx -> FastAPI on uvicorn, "
           f"{a['b_workers']} workers. Machine: {results['cores']} cores shared with wrk; load average at the "
           f"start {results['load_before']}, at the end {results['load_after']}; \"other\" is the CPU used "
           "by processes outside this benchmark during the run.", "",
           "| c | variant | req/s | ×B | p50 ms | p99 ms | nginx µs/req (cores) | engines µs/req (cores) | "
           "each engine's cores | backend µs/req (cores) | wrk µs/req (cores) | cores | other | errors |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def cell(m: dict, role: str) -> str:   # µs/req (cores); the engines summed
        r = m["roles"].get(role)
        return f"{r['us_per_req']:.0f} ({r['cores']:.2f})" if r and (r["us_per_req"] >= 0.5 or role != "redis") \
            else "–"

    for conc in a["conc"]:
        b = results["median"].get(f"B c={conc}")
        for label in results["labels"]:
            m = results["median"][f"{label} c={conc}"]
            ratio = f"{m['rps'] / b['rps']:.2f}" if b else "–"
            out.append(f"| {conc} | {label} | {m['rps']:,.0f} | {ratio} | {m['p50_ms']:.2f} | {m['p99_ms']:.2f} | "
                       f"{cell(m, 'nginx')} | {cell(m, 'engine')} | "
                       f"{' / '.join(f'{x:.2f}' for x in m['engine_cores']) or '–'} | {cell(m, 'backend')} | "
                       f"{cell(m, 'wrk')} | "
                       f"{m['cores']:.2f} | {m['other_cores']:.2f} | {m['errors']} |")
    rounds = " | ".join(f"r{i + 1}" for i in range(a["rounds"]))
    out += ["", "Every round, req/s:", "", f"| c | variant | {rounds} |", "|---|---|" + "---|" * a["rounds"]]
    for conc in a["conc"]:
        for label in results["labels"]:
            rps = [r["rps"] for r in results["rows"] if r["variant"] == label and r["conc"] == conc]
            out.append(f"| {conc} | {label} | " + " | ".join(f"{x:,.0f}" for x in rps) + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="D1,D2,D2rr",
                    help="D variants, D<engines>[rr|ll]: D1 one engine (no engines:), D2 two replicas with "
                         "affinity, D2rr round_robin, D2ll least_loaded (default D1,D2,D2rr)")
    ap.add_argument("--bodies", type=int, default=64,
                    help="distinct 1 KiB bodies (conversations: each its own route key), cycled by wrk")
    ap.add_argument("--conc", default="16,64")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--duration", type=float, default=4.0, help="seconds per measured run")
    ap.add_argument("--slots", type=int, default=72, help="slots per engine (>= the largest c)")
    ap.add_argument("--b-workers", type=int, default=2)
    ap.add_argument("--no-b", action="store_true", help="leave B out")
    ap.add_argument("--out", default=str(BENCH / "replicas"), help="writes OUT.json and OUT.md")
    args = ap.parse_args(argv)
    conc = [int(c) for c in args.conc.split(",")]
    specs = {label: _spec(label) for label in args.variants.split(",")}
    tmp = Path(tempfile.mkdtemp(prefix="zccp-replicas-"))
    body = tmp / "1k.jsonl"
    body.write_text("".join(synthetic_body(1024, str(NULL["model_name"]), seed=k) + "\n"
                            for k in range(args.bodies)))
    lim = dict(NULL)
    variants: dict[str, Variant] = {}
    results: dict = {"argv": " ".join(argv) if argv is not None else " ".join(__import__("sys").argv[1:]),
                     "started": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "cores": __import__("os").cpu_count(),
                     "load_before": open("/proc/loadavg").read().split()[:3],
                     "args": {"conc": conc, "rounds": args.rounds, "duration": args.duration,
                              "b_workers": args.b_workers, "slots": args.slots,
                              "bodies": args.bodies}, "rows": []}
    try:
        for label, (n, policy) in specs.items():
            log(f"starting {label}")
            variants[label] = start_d(tmp / label, lim, args.slots, replicas=n if n > 1 else 0,
                                      routing={"policy": policy} if n > 1 and policy != "affinity" else None)
        if not args.no_b:
            log("starting B")
            variants["B"] = start_b(tmp / "B", lim, args.b_workers)
        labels = list(variants)
        results["labels"] = labels
        for label, v in variants.items():   # warm-up: JIT traces, pools, every replica's path
            for c in conc:
                v.wait_drained()
                wrk(v.url, body, c, 1, label != "B")
        for rnd in range(args.rounds):
            order = labels[rnd % len(labels):] + labels[:rnd % len(labels)]
            for c in conc:
                for label in order:
                    v = variants[label]
                    v.wait_drained()
                    r = measured_run(v, body, c, args.duration, label != "B")
                    r.update(variant=label, conc=c, round=rnd + 1)
                    results["rows"].append(r)
                    roles = _roles(r)
                    log(f"round {rnd + 1} c={c:<3d} {label:3s} {r['rps']:8.0f} req/s  "
                        + "  ".join(f"{k} {x['us_per_req']:.0f}µs ({x['cores']:.2f})" for k, x in roles.items())
                        + f"  other {r['other_cores']:.2f}  errors {r['errors']}")
    finally:
        for v in variants.values():
            v.stop()
    results["load_after"] = open("/proc/loadavg").read().split()[:3]
    results["median"] = {f"{label} c={c}": _median_rows([r for r in results["rows"]
                                                         if r["variant"] == label and r["conc"] == c])
                         for label in results["labels"] for c in conc}
    for r in results["rows"]:
        r.pop("wrk_tail", None)
    Path(args.out + ".json").write_text(json.dumps(results, indent=1))
    Path(args.out + ".md").write_text(report(results))
    print(report(results))


if __name__ == "__main__":
    main()
