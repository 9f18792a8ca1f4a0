"""What TLS and HTTP/2 framing cost: A, B and D (and D's miss path, D-nocache) at 1 KiB and
512 KiB, each over plain HTTP/1.1, HTTP/1.1 over TLS and HTTP/2 over TLS, with one client
for all three (h2load, Debian's nghttp2-client: `bash bench/setup.sh`).

    .venv/bin/python -m bench.h2tls [--duration 4] [--conc 16] [--variants A B D]
        -> bench/h2tls.json and bench/h2tls.md (RESULTS.md's "HTTP/2 and TLS" section)
    .venv/bin/python -m bench.h2tls --report   # h2tls.md again from h2tls.json

Short runs (the default: 1 s warm-up + 4 s measured per row, c=16, one stream per
connection so HTTP/1.1 and HTTP/2 carry the same concurrency); every variant is started
twice, once in clear and once with an HTTPS + HTTP/2 listener (a self-signed EC P-256
certificate, TLS 1.3), on the same limits as bench.run (600 KiB bodies in memory, 3 MiB slots).
D answers a repeated body from nginx's L1 (the hit path); D-nocache sends
`Cache-Control: no-cache, no-store` (every request through the engine: the miss path).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench import procs
from bench.bodies import synthetic_body
from bench.run import NULL, canned_reply, commit_info, log, machine_info
from bench.services import BENCH, Variant, post, start_a, start_b, start_d

SIZES = {"1k": 1024, "512k": 524288}
PROTOCOLS = {            # label -> (TLS listener?, h2load arguments)
    "http/1.1": (False, ["--h1"]),
    "http/1.1+tls": (True, ["--h1"]),
    "h2+tls": (True, []),
}
NOCACHE = ["-H", "cache-control: no-cache, no-store"]


def certificate(d: Path) -> tuple[Path, Path]:
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "1", "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert),
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


def h2load(url: str, body: Path, conc: int, seconds: float, extra: list[str]) -> dict:
    """One h2load run (duration mode, after a 1 s warm-up): parsed numbers and the raw output."""
    cmd = ["h2load", "-c", str(conc), "-m", "1", "-t", "1", "--warm-up-time", "1", "-D", str(max(1, round(seconds))),
           "-d", str(body), "-H", "content-type: application/json", *extra, url + "/v1/messages"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    out = p.stdout + p.stderr
    m = re.search(r"finished in ([\d.]+)s, ([\d.]+) req/s", out)
    req = re.search(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored",
                    out)
    codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
    lat = re.search(r"time for request:\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)", out)
    proto = re.search(r"Application protocol: (\S+)", out)
    if not (m and req and codes and lat):
        raise RuntimeError(f"h2load output not understood:\n{out[-1500:]}")

    def ms(v: str, unit: str) -> float:
        return float(v) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    return {"rps": float(m.group(2)), "done": int(req.group(2)), "succeeded": int(req.group(3)),
            "failed": int(req.group(4)), "errored": int(req.group(5)),
            "non2xx": sum(int(codes.group(i)) for i in (2, 3, 4)),
            "mean_ms": ms(lat.group(5), lat.group(6)), "max_ms": ms(lat.group(3), lat.group(4)),
            "protocol": proto.group(1) if proto else "?", "tail": out[-800:]}


def measured(v: Variant, body: Path, conc: int, seconds: float, extra: list[str]) -> dict:
    roots = v.pids()
    before = {role: procs.snapshot(pid) for role, pid in roots.items()}
    busy0, t0 = procs.machine_busy_s(), time.perf_counter()
    r = h2load(v.url, body, conc, seconds, extra)
    wall = time.perf_counter() - t0
    busy1 = procs.machine_busy_s()
    n = max(r["done"], 1)
    cpu = {role: procs.delta(before[role], procs.snapshot(pid))["cpu_s"] for role, pid in roots.items()}
    r["cpu_ms_per_req"] = {role: 1000 * c / n for role, c in cpu.items()}
    r["server_cpu_ms_per_req"] = 1000 * sum(cpu.values()) / n
    r["machine_busy_cores"] = (busy1 - busy0) / wall    # everything on the machine, other sessions included
    return r


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.h2tls", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--conc", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2, help="measured runs per row, back to back")
    ap.add_argument("--variants", nargs="+", default=["A", "B", "D"])
    ap.add_argument("--b-workers", type=int, default=2)
    ap.add_argument("--slots", type=int, default=96)
    ap.add_argument("--out", type=Path, default=BENCH / "h2tls.json")
    ap.add_argument("--report", action="store_true", help="only write h2tls.md from --out")
    args = ap.parse_args(argv)
    md = args.out.with_suffix(".md")
    if args.report:
        md.write_text(report(json.loads(args.out.read_text())))
        return

    run_dir = Path(tempfile.mkdtemp(prefix="zccp-bench-h2tls-"))
    try:
        run(args, run_dir, md)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def run(args: argparse.Namespace, run_dir: Path, md: Path) -> None:
    tls = certificate(run_dir)
    files = {}
    for wl, size in SIZES.items():
        f = run_dir / f"{wl}.json"
        f.write_text(synthetic_body(size, NULL["model_name"]))
        files[wl] = f
    reply = canned_reply(NULL["model_name"])
    results: dict = {"machine": machine_info(), "commit": commit_info(), "conc": args.conc,
                     "duration_s": args.duration, "repeats": args.repeats, "rows": []}
    starters = {
        "A": lambda d, t: start_a(d, NULL, reply, t),
        "B": lambda d, t: start_b(d, NULL, args.b_workers, t),
        "D": lambda d, t: start_d(d, NULL, args.slots, t),
    }
    for key in args.variants:
        for secure in (False, True):
            v = starters[key](run_dir / f"{key}-{'tls' if secure else 'clear'}", tls if secure else None)
            try:
                modes = [("D", []), ("D-nocache", NOCACHE)] if key == "D" else [(key, [])]
                for label, extra in modes:
                    for wl, f in files.items():
                        if not secure:   # the same answer over every protocol (checked in clear once)
                            status, _, _ = post(v.url, f.read_bytes(),
                                                {"Cache-Control": "no-cache, no-store"} if extra else None)
                            assert status == 200, (label, wl, status)
                        for proto, (needs_tls, h2args) in PROTOCOLS.items():
                            if needs_tls != secure:
                                continue
                            for n in range(args.repeats):
                                v.wait_drained()
                                r = measured(v, f, args.conc, args.duration, h2args + extra)
                                r.update(variant=label, workload=wl, proto=proto, rep=n + 1)
                                results["rows"].append(r)
                                log(f"{label:10s} {wl:5s} {proto:13s} {r['rps']:9.1f} req/s  "
                                    f"mean {r['mean_ms']:8.2f} ms  server CPU {r['server_cpu_ms_per_req']:.3f} ms/req"
                                    f"  failed {r['failed']} non-2xx {r['non2xx']}  ({r['protocol']})")
                                args.out.write_text(json.dumps(results, indent=1))
            finally:
                v.stop()
    md.write_text(report(results))
    print(md.read_text())


ORDER = {p: i for i, p in enumerate(PROTOCOLS)}
WL_ORDER = {w: i for i, w in enumerate(SIZES)}


def _mean(rows: list[dict], k: str) -> float:
    return sum(r[k] for r in rows) / len(rows)


def report(results: dict) -> str:
    """bench/h2tls.md: method, the rows, and what TLS and HTTP/2 cost per row."""
    rows = sorted(results["rows"], key=lambda r: (r["variant"], WL_ORDER[r["workload"]], ORDER[r["proto"]],
                                                  r.get("rep", 1)))
    m, c = results["machine"], results["commit"]
    out = [
        "Method: `.venv/bin/python -m bench.h2tls` (bench/h2tls.py): h2load "
        f"(nghttp2 1.52), c={results['conc']} connections, one stream each (`-m 1`), 1 s warm-up, "
        f"{results['duration_s']:g} s measured per run, {results.get('repeats', 1)} run(s) per row back to back; "
        "the same limits as the tables "
        "above (null model, 600 KiB bodies in memory, 3 MiB slots). Each variant runs twice: in clear "
        "(HTTP/1.1 rows) and with an HTTPS + HTTP/2 listener (`listen … ssl http2`, a self-signed EC "
        "P-256 certificate, TLS 1.3 chosen by both ends, session cache; HTTP/1.1 over TLS with `--h1`). "
        "D answers a repeated body from nginx's L1 (the hit path), D-nocache sends `Cache-Control: "
        "no-cache, no-store` (the engine on every request: the miss path). Over HTTP/2, D's 512 KiB "
        "bodies go through nginx's in-memory body buffer and one copy into the slot (zccp.core.body); over "
        "HTTP/1.1 they stream from the socket into the slot. Server CPU = utime+stime of every process "
        "of the variant (nginx, engine, redis, uvicorn) per request, from /proc; h2load itself runs on "
        "the same 2 cores.",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, shared with other sessions' test runs (load average at "
        f"start {' '.join(m['loadavg_start'])}; the busy-cores column is the whole machine's, others "
        f"included): short single runs, so differences under ~20 % are within the noise. Code: "
        f"tree digest {c.get('tree_digest', '?')} (bench.run's digest of engine/, lua/, nginx/, shm_abi/).",
        "",
        "| variant | body | protocol | run | req/s | mean ms | server CPU ms/req | failed + non-2xx "
        "| machine busy cores |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(f"| {r['variant']} | {r['workload']} | {r['proto']} | {r.get('rep', 1)} | {r['rps']:,.0f} | "
                   f"{r['mean_ms']:.2f} | "
                   f"{r['server_cpu_ms_per_req']:.3f} | {r['failed'] + r['non2xx']} | "
                   f"{r['machine_busy_cores']:.2f} |")
    out += ["", "What each step costs (ratios of the rows' means: TLS = HTTP/1.1+TLS vs clear HTTP/1.1; "
            "HTTP/2 = h2+TLS vs HTTP/1.1+TLS):", "",
            "| variant | body | TLS: req/s | TLS: server CPU/req | HTTP/2: req/s | HTTP/2: server CPU/req |",
            "|---|---|---:|---:|---:|---:|"]
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["variant"], r["workload"], r["proto"]), []).append(r)
    by = {k: {"rps": _mean(g, "rps"), "server_cpu_ms_per_req": _mean(g, "server_cpu_ms_per_req")}
          for k, g in groups.items()}
    for v, wl in dict.fromkeys((r["variant"], r["workload"]) for r in rows):
        h1, t1, h2 = (by.get((v, wl, p)) for p in PROTOCOLS)
        if not (h1 and t1 and h2):
            continue

        def ratio(a: dict, b: dict, k: str) -> str:
            return f"{a[k] / b[k]:.2f}×" if b[k] else "-"

        out.append(f"| {v} | {wl} | {ratio(t1, h1, 'rps')} | {ratio(t1, h1, 'server_cpu_ms_per_req')} | "
                   f"{ratio(h2, t1, 'rps')} | {ratio(h2, t1, 'server_cpu_ms_per_req')} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
