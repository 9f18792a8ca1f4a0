"""The request id's cost on the real ZCCP stack (bench/services.start_d: redis, null engine,
nginx): a commit's lua/ and its zccp_http.conf request-id map (nginx's $request_id: one
RAND_bytes per request) against the worktree's (zccp.request_id's pool), and, as the bound
of what any cheaper id can save, the commit's with a constant in place of $request_id.
One stack; each variant is its lua/ and rendered conf, nginx reloaded between them; rounds
interleaved, the variants' order rotated each round; 1 KiB L1 hits and no-store misses.

    PYTHONPATH=engine python -m bench.request_id_ab --commit 8aabf74 [--rounds 6] [--json F]

nginx CPU per request: its processes' utime+stime over the run's requests (bench/procs).
bench/jit_paths.md ("The request id") has the method's figures.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
from pathlib import Path

from bench.bodies import synthetic_body
from bench.jit_paths import lua_at, reconfigure
from bench.run import NULL, measured_run, wrk
from bench.services import post, start_d
from tests.support.checkout import REPO, require_this_checkout
from zccp.ops.stack import nginx_paths

OLD_MAP = re.compile(r"map \$http_x_request_id \$zccp_request_id \{.*?\n\}\n", re.S)
NEW_MAPS = re.compile(r"map \$http_x_request_id \$zccp_caller_id \{.*?map \$zccp_caller_id \$zccp_own_id \{.*?\n\}\n",
                      re.S)
CONSTANT = "0123456789abcdef0123456789abcdef"


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", required=True, help="the before: a commit whose map uses $request_id")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--conc", type=int, default=16)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    require_this_checkout()
    tmp = Path(tempfile.mkdtemp(prefix="zccp-rid-"))
    body = tmp / "1k.jsonl"
    body.write_text(synthetic_body(1024, NULL["model_name"]) + "\n")
    old_http = subprocess.run(["git", "-C", str(REPO), "show", f"{args.commit}:nginx/zccp_http.conf"],
                              capture_output=True, text=True, check=True).stdout
    m = OLD_MAP.search(old_http)
    if not m:
        raise SystemExit(f"{args.commit}'s zccp_http.conf has no $request_id map to compare with")
    before_lua = lua_at(args.commit, tmp / "before")
    v = start_d(tmp / "D", dict(NULL, segment_size_kb=1024, tokens_kb=256, max_body_kb=64), 32)
    runs: dict[str, list[dict]] = {}
    try:
        post(v.url, body.read_bytes())
        prefix, _ = nginx_paths(tmp / "D")
        confs = {c: c.read_text() for name in ("zccp_http.conf", "zccp_server.conf") for c in prefix.rglob(name)}
        http = next(c for c in confs if c.name == "zccp_http.conf")
        old, const = dict(confs), dict(confs)
        old[http], n = NEW_MAPS.subn(lambda _: m.group(0), confs[http])
        if n != 1:
            raise SystemExit("the worktree's zccp_http.conf has no zccp_caller_id ... zccp_own_id maps")
        const[http] = old[http].replace("$request_id;", CONSTANT + ";", 2)
        variants = {"before": (before_lua, old), "after": (REPO / "lua", confs), "constant": (before_lua, const)}
        names = list(variants)
        for i in range(args.rounds):
            for name in names[i % 3:] + names[:i % 3]:
                reconfigure(v, variants[name][0], None, variants[name][1])
                for path, nocache in (("hit", False), ("miss", True)):
                    wrk(v.url, body, args.conc, 1, nocache)   # warm-up: traces, L1
                    v.wait_drained()
                    r = measured_run(v, body, args.conc, args.seconds, nocache)
                    if r["errors"]:
                        raise RuntimeError(f"{name} {path}: {r['errors']} errors {r['statuses']}")
                    us = r["procs"]["nginx"]["cpu_s_per_req"] * 1e6
                    runs.setdefault(f"{name} {path}", []).append(
                        {"nginx_us": us, "rps": r["rps"], "other_cores": r["other_cores"]})
                    print(f"round {i + 1} {name:8s} {path:4s} {r['rps']:8.0f} req/s  nginx {us:6.1f} µs/req"
                          f"  (other load {r['other_cores']:.2f} cores)", flush=True)
    finally:
        v.stop()
    print("\n| variant | path | req/s (median) | nginx µs/req (median) | least | paired vs before: µs | req/s |")
    print("|---|---|---|---|---|---|---|")
    for key, rs in runs.items():
        name, path = key.split()
        base = runs[f"before {path}"]
        d_us = median([b["nginx_us"] - r["nginx_us"] for b, r in zip(base, rs, strict=True)])
        q = median([r["rps"] / b["rps"] for b, r in zip(base, rs, strict=True)])
        us = [r["nginx_us"] for r in rs]
        print(f"| {name} | {path} | {median([r['rps'] for r in rs]):.0f} | {median(us):.1f} | {min(us):.1f} | "
              f"{-d_us:+.1f} | {q:.3f}× |")
    if args.json:
        args.json.write_text(json.dumps({"commit": args.commit, "rounds": args.rounds, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
