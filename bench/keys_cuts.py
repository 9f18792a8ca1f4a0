"""Keys + limits before and after a change, paired in one session (issue 47, item 4): three
stacks at once (bench.keys' Stack: nginx 2 workers, null engine, Redis): auth off, and
keys+limits twice, one on --commit's lua/ (before) and one on the worktree's (after).
Each round measures hit and miss on each stack (wrk, --bodies distinct 1 KiB bodies
cycled), the order rotated from round to round; nginx CPU per request as bench.keys
(utime + stime of the nginx processes / requests). Printed: each run, then the paired
medians (before - off, after - off, after - before, per round).

--phases: then both keys+limits stacks get bench/keys_cuts.lua's timed wrappers (the plugin
phases and the limits' pieces, worker thread CPU clock: time preempted by other processes
is not charged) and are measured again, interleaved: µs per request per piece.

    PYTHONPATH=engine python -m bench.keys_cuts --commit C [--rounds 4] [--seconds 2]
        [--bodies 2000] [--phases] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
from pathlib import Path

from bench.jit_paths import INIT_WORKER, JIT_LIB, JITV, aborts, lua_at, report_aborts
from bench.keys import NULL, bodies_1k, make_key, median, run_one, wrk_with
from bench.services import http_get
from tests.support.checkout import REPO, require_this_checkout
from tests.support.harness import Stack
from tests.support.leftovers import remove_socket_dirs
from zccp.ops.stack import nginx_paths
from zccp.config.paths import lua_vendor_dir

LOCATION = "\nlocation = /zccp-bench/phases {\n    content_by_lua_block { require(\"jit_paths\").report() }\n}\n"


def reconfigure(s: Stack, lua_dir: Path, phases: bool, jitv: str | None = None) -> None:
    """The stack's nginx on lua_dir's modules (with phases, keys_cuts.lua's wrappers; with
    jitv, LuaJIT's jit.v into files jitv + PID); reloaded, waits until the old workers are gone."""
    prefix, _ = nginx_paths(s.run_dir)
    http = next(prefix.rglob("zccp_http.conf"))
    server = next(prefix.rglob("zccp_server.conf"))
    text = http.read_text()
    path = f"{lua_dir}/?.lua;{lua_vendor_dir()}/?.lua;{JIT_LIB}/?.lua;{REPO / 'bench'}/?.lua;;"
    text, n = re.subn(r'lua_package_path "[^"]*";', f'lua_package_path "{path}";', text)
    assert n == 1
    text = re.sub(r'require\("jit.v"\)\.on\("[^"]*" \.\. ngx\.worker\.pid\(\)\); ', "", text)
    if jitv:
        text = text.replace(INIT_WORKER, JITV % jitv)
    if phases and "keys_cuts" not in text:
        text = text.replace("init_by_lua_block {", 'init_by_lua_block {\n    require("keys_cuts").install()', 1)
        text += "\nlua_shared_dict zccp_bench_phases 1m;\n"
        server.write_text(server.read_text() + LOCATION)
    http.write_text(text)
    assert s.nginx is not None
    s.hup_nginx(30)   # every old worker gone: the new Lua answers


def phase_run(s: Stack, body: Path, seconds: float, nocache: bool, key: str) -> dict[str, float]:
    """µs per request of each wrapped piece over one run (its warm-up's sums dropped)."""
    wrk_with(s.base_url, body, 16, 1, ["no-cache" if nocache else "-", key])
    http_get(s.base_url + "/zccp-bench/phases?reset=1", 5)
    wrk_with(s.base_url, body, 16, seconds, ["no-cache" if nocache else "-", key])
    got = json.loads(http_get(s.base_url + "/zccp-bench/phases", 5)[1])
    clock = got.pop("clock_overhead_ns")
    n = max(got.get("phase log", {}).get("calls", 0), 1)
    out = {k: x["ns"] / n / 1e3 for k, x in got.items()}
    out["(a wrapped call's clock, included above)"] = clock / 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commit", required=True, help="the before: this commit's lua/")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--bodies", type=int, default=2000)
    ap.add_argument("--phases", action="store_true")
    ap.add_argument("--no-totals", action="store_true", help="only --phases")
    ap.add_argument("--jitv", action="store_true", help="first: the trace aborts of each stack's first seconds")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    require_this_checkout()
    out: dict = {"commit": args.commit, "bodies": args.bodies, "runs": {}, "phases": {}, "aborts": {}}
    with tempfile.TemporaryDirectory() as tmp:
        body = Path(tmp) / "body.jsonl"
        body.write_text(bodies_1k(args.bodies))
        before_lua = lua_at(args.commit, Path(tmp) / "before")
        stacks: dict[str, Stack] = {}
        keys: dict[str, str | None] = {"off": None}
        try:
            for name in ("off", "before", "after"):
                over: dict = {"model": NULL, "shared_memory": {"segment_count": 64},
                              "logging": {"access_flush_ms": 1000}}
                if name != "off":
                    over["auth"] = {"mode": "keys"}
                stacks[name] = Stack(Path(tmp) / name, over, with_redis=True).start()
                if name != "off":
                    keys[name] = make_key(stacks[name], "keys+limits")
            reconfigure(stacks["before"], before_lua, False)
            if args.jitv:
                logs = Path(tmp) / "jitv"
                logs.mkdir()
                Path(tmp).chmod(0o755)
                logs.chmod(0o1777)
                for name, lua in (("before", before_lua), ("after", REPO / "lua")):
                    for path, nocache in (("hit", False), ("miss", True)):
                        files = str(logs / f"{name}-{path}-")
                        reconfigure(stacks[name], lua, False, files)
                        wrk_with(stacks[name].base_url, body, 16, 3, ["no-cache" if nocache else "-", str(keys[name])])
                        out["aborts"][f"{name} {path}"] = report_aborts(aborts(files), f"\n{name}, {path}: aborts")
                    reconfigure(stacks[name], lua, False)
            rows = ("off", "before", "after")
            for rnd in range(0 if args.no_totals else args.rounds):
                for path, nocache in (("hit", False), ("miss", True)):
                    for name in rows[rnd % 3:] + rows[:rnd % 3]:
                        if rnd == 0:
                            run_one(stacks[name], body, 16, 1, nocache, keys[name])   # warm-up, L1's store
                        r = run_one(stacks[name], body, 16, args.seconds, nocache, keys[name])
                        out["runs"].setdefault(f"{name}/{path}", []).append(r)
                        print(rnd, name, path, f"{r['rps']:.0f} req/s, nginx {r['nginx_cpu_us_per_req']:.1f} µs/req, "
                              f"load {r['load1']:.2f}", flush=True)
            if args.phases:
                reconfigure(stacks["before"], before_lua, True)
                reconfigure(stacks["after"], REPO / "lua", True)
                for rnd in range(args.rounds):
                    for path, nocache in (("hit", False), ("miss", True)):
                        for name in ("before", "after") if rnd % 2 == 0 else ("after", "before"):
                            got = phase_run(stacks[name], body, args.seconds, nocache, str(keys[name]))
                            out["phases"].setdefault(f"{name}/{path}", []).append(got)
        finally:
            for s in stacks.values():
                s.stop()
    remove_socket_dirs()
    runs = out["runs"]
    if runs:
        print("\n| path | off | before | after | before - off | after - off | after - before |")
        print("|---|---|---|---|---|---|---|")
        for path in ("hit", "miss"):
            cpu = {n: [r["nginx_cpu_us_per_req"] for r in runs[f"{n}/{path}"]] for n in ("off", "before", "after")}
            d = {k: median([x - y for x, y in zip(cpu[a], cpu[b], strict=True)])
                 for k, (a, b) in {"bo": ("before", "off"), "ao": ("after", "off"), "ab": ("after", "before")}.items()}
            print(f"| {path} | {median(cpu['off']):.1f} | {median(cpu['before']):.1f} | {median(cpu['after']):.1f} | "
                  f"{d['bo']:+.1f} | {d['ao']:+.1f} | {d['ab']:+.1f} |")
    for path in ("hit", "miss"):
        if f"before/{path}" not in out["phases"]:
            continue
        print(f"\n{path}: µs per request (median of {args.rounds} rounds), thread CPU clock\n"
              "| piece | before | after |\n|---|---|---|")
        names = sorted({k for r in out["phases"][f"after/{path}"] for k in r})
        for k in names:
            b = median([r.get(k, 0.0) for r in out["phases"][f"before/{path}"]])
            a = median([r.get(k, 0.0) for r in out["phases"][f"after/{path}"]])
            print(f"| {k} | {b:.2f} | {a:.2f} |")
    out["load"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
