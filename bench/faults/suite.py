"""The fault suite: each fault injected while mixed traffic runs, what every request got.

One command, bounded in time and requests, loopback only:

    python -m bench.faults.suite [--only kill,stop,...] [--kills 20] [--clients 32]

Starts its own stack in bench/out/faults/ (redis + engine + nginx, the null model streaming
a token every 5 ms, the cache on, 48 slots, a 3 s request deadline) and supervises the engine
as zccp-stack does (restart on exit; here with a backoff capped at 1 s so that 20 kills fit in
two minutes: bench/faults/engine_restart.md measures zccp-stack's own path). Mixed traffic
(`Traffic`): c=32 clients, 1 KiB and 64 KiB bodies, streams and not, cache hits (8 prompts
that repeat) and misses (unique), both APIs. For each fault: 4 s of traffic without it (the
baseline p99), the fault, then the traffic stops and the stack settles. Its null reply is
~1,600 bytes (a stream of up to 600 tokens within the deadline), each client connection's kernel
send buffer 16 KiB (server.send_buffer_kb) and the stall limit 1.5 s, so that a client that
stops reading stalls a relay as it would on a real network (on loopback the kernel would
otherwise buffer megabytes): the stalled-reader faults (issue 20).

Every answer is classified: 2xx (a complete JSON answer, or a stream that ends properly);
API-shaped error (a JSON error of the API called, 429/503 with Retry-After, or a stream
that ends with the API's error event); anything else (a non-API body, a reset, a stream cut
without an error event, no answer within deadline + 10 s): must be 0. Results go to
bench/faults/results.json and the tables in bench/faults/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import Counter

from bench.faults.harness import (
    DEADLINE_MS,
    HIT_PROMPTS,
    OUT,
    REPLY,
    REPORT,
    RESULTS_JSON,
    RETRIED,
    SLOTS,
    SNDBUF_KB,
    STALL_MS,
    STALL_TOKENS,
    FaultStack,
    Outcome,
    Traffic,
    _body,
    classify,
    label_of,
    one_request,
)
from bench.faults.injections import (
    BROKEN,
    FAULTS,
    FaultResult,
    f_disconnect,
    f_exhaust,
    f_kill,
    f_redis,
    f_reload,
    f_slow,
    f_stalled_1x,
    f_stalled_2x,
    f_stop,
    f_trickle,
    streams_ended,
)
from tests.support.checkout import REPO, require_this_checkout

__all__ = [   # what bench.faults.suite offered before its stack, traffic and faults moved out
    "BROKEN", "DEADLINE_MS", "FAULTS", "HIT_PROMPTS", "OUT", "REPLY", "REPO", "REPORT", "RESULTS_JSON", "RETRIED",
    "SLOTS", "SNDBUF_KB", "STALL_MS", "STALL_TOKENS", "FaultResult", "FaultStack", "Outcome", "Traffic", "_body",
    "classify", "f_disconnect", "f_exhaust", "f_kill", "f_redis", "f_reload", "f_slow", "f_stalled_1x",
    "f_stalled_2x", "f_stop", "f_trickle", "label_of", "main", "one_request", "p99", "recovery", "run_fault",
    "streams_ended", "write_report",
]


def p99(xs: list[Outcome]) -> float | None:
    lat = sorted((o.done - o.sent) * 1000 for o in xs if o.cls == "2xx")
    if len(lat) < 2:
        return None
    return statistics.quantiles(lat, n=100)[98]


def recovery(t: Traffic, injections: list[float], fault_end: float) -> float:
    """Max over injections: the time from the injection (or the fault's end, for faults that
    last) to the first 2xx completed for a request sent after it."""
    worst = 0.0
    points = injections + [fault_end]
    for at in points:
        ok = [o.done for o in t.outcomes if o.normal and o.sent >= at and o.cls == "2xx"]
        worst = max(worst, (min(ok) - at) if ok else float("inf"))
    return worst


def run_fault(name: str, s: FaultStack, args) -> dict:
    RETRIED.clear()
    t = Traffic(s.url, args.clients, seed=hash(name) & 0xFFFF)
    s.serving()
    s.settle()
    t.start()
    time.sleep(4)
    base_t1 = time.monotonic()
    res = FAULTS[name](s, t, args)
    res.t0, res.t1 = base_t1, time.monotonic()
    time.sleep(2)                                    # traffic after the fault: served again
    t.stop()
    after = s.settle()
    normal = t.window(base_t1, time.monotonic())
    baseline = t.window(0, base_t1)
    every = normal + res.own
    statuses = Counter(o.status for o in every if o.cls == "api")
    others = Counter(o.status for o in every if o.cls == "other")
    out = {
        "fault": res.name, "what": res.what, "sent": len(every),
        "sent_normal": len(normal), "sent_fault_clients": len(res.own),
        "ok": sum(1 for o in every if o.cls == "2xx"),
        "api_errors": sum(statuses.values()), "api_statuses": dict(statuses),
        "other": sum(others.values()), "other_kinds": dict(others),
        "client_aborts": sum(1 for o in every if o.cls == "aborted"),
        "slots_claimed_after": after.get("slots_claimed"), "slots_busy_after": after.get("slots_busy"),
        "recovery_s": recovery(t, res.injections, res.extra.pop("after", res.t1) if name == "exhaust" else res.t1),
        "p99_ms_during": p99(t.window(base_t1, res.t1)), "p99_ms_without": p99(baseline),
        "injections": len(res.injections), "extra": res.extra,
        "engine_restarts": s.supervisor.restarts,
        "retried_before_answer": dict(RETRIED),
    }
    print(f"{res.name}: sent {out['sent']}, 2xx {out['ok']}, api {dict(statuses)}, OTHER {dict(others)}, "
          f"claimed after {out['slots_claimed_after']}, recovery {out['recovery_s']:.2f} s, "
          f"p99 {out['p99_ms_during']} vs {out['p99_ms_without']} ms", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(FAULTS), help=f"subset of {','.join(FAULTS)}")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--report", action="store_true", help="only re-render RESULTS.md from results.json")
    args = ap.parse_args()
    require_this_checkout()
    if args.report:
        write_report(json.loads(RESULTS_JSON.read_text()))
        return
    started = time.monotonic()
    s = FaultStack(OUT)
    rows = []
    try:
        warm = Traffic(s.url, args.clients, seed=1)      # not measured: caches, first requests
        warm.start()
        time.sleep(5)
        warm.stop()
        for name in args.only.split(","):
            rows.append(run_fault(name.strip(), s, args))
    finally:
        s.stop()
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    rows = _with_earlier_rows(rows, commit + ("+dirty" if dirty else ""))
    result = {"commit": commit + ("+dirty" if dirty else ""), "argv": sys.argv[1:], "rows": rows,
              "seconds": round(time.monotonic() - started),
              "machine": f"{platform.node()}, {os.cpu_count()} cores, {platform.platform()}",
              "clients": args.clients, "slots": SLOTS, "deadline_ms": DEADLINE_MS}
    RESULTS_JSON.write_text(json.dumps(result, indent=1, default=str))
    write_report(result)


def _with_earlier_rows(rows: list[dict], commit: str) -> list[dict]:
    """A run of some faults (--only) replaces their rows; the other faults' rows of the last
    results stay, each marked with the commit it was measured at."""
    for x in rows:
        x["commit"] = commit
    if not RESULTS_JSON.exists():
        return rows
    earlier = json.loads(RESULTS_JSON.read_text())
    mine = {x["fault"] for x in rows}
    kept = [dict(x, commit=x.get("commit", earlier["commit"])) for x in earlier["rows"] if x["fault"] not in mine]
    return kept + rows


def _fmt(v, nd: int = 0) -> str:
    if v is None:
        return "–"
    if v == float("inf"):
        return "never"
    return f"{v:.{nd}f}"


def write_report(r: dict) -> None:
    rows = []
    for x in r["rows"]:
        st = ", ".join(f"{k}: {v}" for k, v in sorted(x["api_statuses"].items())) or "–"
        oth = f"**{x['other']}**" + (f" ({', '.join(f'{k}: {v}' for k, v in x['other_kinds'].items())})"
                                      if x["other"] else "")
        rows.append(f"| {x['fault']} ({x.get('commit', r['commit'])}) | "
                    f"{x['sent']} ({x['sent_fault_clients']} by the fault's clients) | {x['ok']} | "
                    f"{x['api_errors']} ({st}) | {oth} | **{x['slots_claimed_after']}** | {_fmt(x['recovery_s'], 2)} | "
                    f"{_fmt(x['p99_ms_during'])} / {_fmt(x['p99_ms_without'])} |")
    notes = "\n".join(f"- **{x['fault']}**: {x['what']}." + (f" {x['extra']}" if x["extra"] else "")
                      + (f" Client aborts (by design): {x['client_aborts']}." if x["client_aborts"] else "")
                      + (f" Connections closed before any answer, retried once as the SDKs do (then counted "
                         f"by their final answer): {x['retried_before_answer']}."
                         if x.get("retried_before_answer") else "")
                      for x in r["rows"])
    table = f"""<!-- faults -->
Last run at commit {r['commit']} (each row names the commit it was measured at); \
`python -m bench.faults.suite {' '.join(r['argv'])}` ({r['seconds']} s); {r['machine']};
{r['clients']} clients of mixed traffic, {r['slots']} slots, request deadline {r['deadline_ms']} ms, null model
(a token every 5 ms), cache on.

| fault | requests sent | 2xx | API-shaped errors (statuses) | anything else (must be 0) | \
slots claimed after settling (must be 0) | time until served again (s) | \
p99 of normal 2xx during / without the fault (ms) |
|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

{notes}
<!-- /faults -->"""
    empty = "# Faults, soak and hostile input\n\n<!-- faults -->\n<!-- /faults -->\n"
    text = REPORT.read_text() if REPORT.exists() else empty
    a, b = "<!-- faults -->", "<!-- /faults -->"
    REPORT.write_text(text[: text.index(a)] + table + text[text.index(b) + len(b):])


if __name__ == "__main__":
    main()
