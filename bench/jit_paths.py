"""Where LuaJIT gives up on the request path (issue 30, item 5) and what nginx's CPU per
request is (issue 29): one real ZCCP stack (bench/services.start_d: redis, null engine,
nginx), LuaJIT's jit.v on in every worker, L1-hit traffic and then miss traffic
(Cache-Control: no-cache, no-store) from wrk; every trace abort listed with its reason and
source line, per path. With --commit, the same stack also runs that commit's lua/ (git
archive; nginx reloaded between them), rounds interleaved, so before and after share one
machine state. nginx CPU per request: the nginx processes' utime+stime over the run's
request count (bench/procs), jit.v off while it is measured.

    python -m bench.jit_paths [--seconds 3] [--rounds 3] [--conc 16] [--commit C] [--json F]
        [--bodies N [--like-keys]] [--steady S] [--vmstate] [--phases] [--no-jitv]

--steady S: after each jit.v run, S s more on the same workers, now warm: the aborts they
still add (LuaJIT stops retrying a spot once it blacklists a root trace's start or a side
exit's counter is spent, so a worker's first seconds list more spots than requests pay
for later). --vmstate: LuaJIT's sampling profiler in every worker (jit.profile): the share
of samples per VM state and the Lua lines the interpreter's and the collector's samples were
at (a GC step runs inside an allocation).

bench/jit_paths.md: the method and the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.bodies import synthetic_body
from bench.keys import bodies_1k
from bench.run import NULL, measured_run, wrk
from bench.services import Variant, http_get, post, start_d
from tests.support.checkout import REPO, require_this_checkout
from zccp.ops.stack import nginx_paths
from zccp.config.paths import lua_vendor_dir

JIT_LIB = "/usr/share/luajit-2.1.0-beta3"   # Debian's libluajit-5.1-common: jit/v.lua
INIT_WORKER = 'require("zccp.init").init_worker()'
# jit.v per worker (one file each: the workers would truncate one shared file).
JITV = 'require("jit.v").on("%s" .. ngx.worker.pid()); ' + INIT_WORKER
# [TRACE --- (7/3) handler.lua:40 -- NYI: FastFunc coroutine.wrap at relay.lua:80]
PHASES_LOCATION = """
location = /zccp-bench/phases {
    content_by_lua_block { require("jit_paths").report() }
}
"""
# LuaJIT's sampling profiler in every worker (bench/jit_paths.lua: profile)
PROFILE = 'require("jit_paths").profile(); ' + INIT_WORKER
VMSTATES = {"N": "compiled traces", "I": "interpreter", "C": "C (nginx, the Lua module, FFI callees)",
            "G": "garbage collector", "J": "trace compiler"}
ABORT = re.compile(r"^\[TRACE --- (?:\(\d+/\d+\) )?(\S+) -- (.*?)(?: at (\S+))?\]$")


def reconfigure(v: Variant, lua_dir: Path, jitv: str | None, confs: dict[Path, str], phases: bool = False,
                profile: bool = False) -> None:
    """Rewrites the rendered zccp_http.conf (ZCCP's Lua from lua_dir; jit.v into files
    jitv + PID, or off; phases: bench/jit_paths.lua's timed wrappers and their location;
    profile: its VM-state sampler in every worker, same location) and reloads nginx: new
    workers, fresh traces."""
    for conf, original in confs.items():
        text = original
        if conf.name == "zccp_http.conf":
            text = text.replace(INIT_WORKER, JITV % jitv if jitv else PROFILE if profile else INIT_WORKER)
            path = f"{lua_dir}/?.lua;{lua_vendor_dir()}/?.lua;{JIT_LIB}/?.lua;{REPO / 'bench'}/?.lua;;"
            text, n = re.subn(r'lua_package_path "[^"]*";', f'lua_package_path "{path}";', text)
            assert n == 1, "no lua_package_path in the rendered zccp_http.conf"
            if phases:
                text = text.replace("init_by_lua_block {", 'init_by_lua_block {\n    require("jit_paths").install()', 1)
            if phases or profile:
                text += "\nlua_shared_dict zccp_bench_phases 1m;\n"
        elif phases or profile:
            text += PHASES_LOCATION
        conf.write_text(text)
    nginx = v.services["nginx"].proc
    assert nginx is not None
    old = workers(nginx.pid)
    os.kill(nginx.pid, signal.SIGHUP)
    end = time.monotonic() + 30
    while time.monotonic() < end:   # the old workers gone, the new ones answering
        now = workers(nginx.pid)
        if now and not (now & old) and http_get(v.url + "/health", 2)[0] == 200:
            return
        time.sleep(0.1)
    raise RuntimeError("nginx did not come back after the reload")


def workers(master: int) -> set[int]:
    with contextlib.suppress(OSError):
        return {int(p) for p in Path(f"/proc/{master}/task/{master}/children").read_text().split()}
    return set()


def jitv_lines(prefix: str) -> dict[Path, list[str]]:
    d = Path(prefix).parent
    return {f: f.read_text(errors="replace").splitlines() for f in d.glob(Path(prefix).name + "*")}


def aborts(prefix: str, after: dict[Path, int] | None = None) -> Counter[tuple[str, str, str]]:
    """(trace start, reason, where) -> count, over every worker's jit.v file; after: only
    the lines past each file's count there (what a later run added)."""
    c: Counter[tuple[str, str, str]] = Counter()
    for f, lines in jitv_lines(prefix).items():
        for line in lines[(after or {}).get(f, 0):]:
            m = ABORT.match(line.strip())
            if m:
                c[(m.group(1), m.group(2), m.group(3) or "")] += 1
    return c


def report_aborts(found: Counter[tuple[str, str, str]], title: str) -> list[dict]:
    """Prints the aborts under title, most frequent first; their rows for the JSON."""
    print(title)
    for (start, reason, at), n in found.most_common():
        print(f"  {n:5d}  {reason}  at {at}  (trace from {start})")
    return [{"start": k[0], "reason": k[1], "at": k[2], "count": n} for k, n in found.most_common()]


def phase_costs(v: Variant, body: Path, args: argparse.Namespace, nocache: bool, title: str) -> dict:
    """µs of nginx CPU per request in each wrapped piece (bench/jit_paths.lua), beside the
    whole request's (bench/procs, the wrappers' own cost included)."""
    wrk(v.url, body, args.conc, 1, nocache)   # warm-up
    v.wait_drained()
    http_get(v.url + "/zccp-bench/phases?reset=1", 5)
    r = measured_run(v, body, args.conc, args.seconds, nocache)
    got = json.loads(http_get(v.url + "/zccp-bench/phases", 5)[1])
    clock = got.pop("clock_overhead_ns")
    n = max(got.get("phase log", {}).get("calls", 0), 1)
    rows = {k: {"us": x["ns"] / n / 1e3, "calls_per_req": x["calls"] / n} for k, x in sorted(got.items())}
    total = r["procs"]["nginx"]["cpu_s_per_req"] * 1e6
    print(f"\n{title}: {n} requests, nginx {total:.1f} µs/req in all (wrappers included; "
          f"a wrapped call's clock costs {clock / 1e3:.2f} µs, not subtracted)")
    for k, x in rows.items():
        print(f"  {x['us']:7.2f} µs/req  {x['calls_per_req']:4.2f} calls/req  {k}")
    rest = total - sum(x["us"] for k, x in rows.items() if not k.startswith(" "))
    print(f"  {rest:7.2f} µs/req  the rest: nginx's own HTTP work, the handler's glue, the relay")
    return {"total_us": total, "clock_us": clock / 1e3, "requests": n, "rows": rows, "rest_us": rest}


def vm_states(v: Variant, body: Path, args: argparse.Namespace, nocache: bool, title: str) -> dict:
    """Shares of jit.profile's samples (1 per ms of a worker's CPU) per VM state over a
    measured run after a warm-up, and the Lua lines the interpreter's and the collector's
    samples were at."""
    wrk(v.url, body, args.conc, 1, nocache)   # warm-up: traces, L1
    v.wait_drained()
    http_get(v.url + "/zccp-bench/phases?reset=1", 5)
    r = measured_run(v, body, args.conc, args.seconds, nocache)
    got = json.loads(http_get(v.url + "/zccp-bench/phases?raw=1", 5)[1])
    states = {k[3:]: n for k, n in got.items() if k.startswith("vm ")}
    total = max(sum(states.values()), 1)
    print(f"\n{title}: {total} samples over {r['requests']} requests (nginx "
          f"{r['procs']['nginx']['cpu_s_per_req'] * 1e6:.1f} µs/req, the sampler's own cost included)")
    for st, n in sorted(states.items(), key=lambda x: -x[1]):
        print(f"  {100 * n / total:5.1f} %  {VMSTATES.get(st, st)}")
    out = {"samples": states, "requests": r["requests"]}
    for st, whose, key in (("I", "interpreter's", "interpreted_at"), ("G", "collector's", "collected_at")):
        lines = sorted(((n, k[5:]) for k, n in got.items() if k.startswith(f"at {st} ")), reverse=True)
        of = max(states.get(st, 0), 1)
        for n, where in lines[:12]:
            print(f"      {100 * n / of:5.1f} % of the {whose}  {where}")
        out[key] = {where: n for n, where in lines}
    return out


def lua_at(commit: str, into: Path) -> Path:
    into.mkdir(parents=True)
    # shm_abi/ beside lua/: a module required before zccp.transport.abi.init finds the header there
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "lua", "shm_abi"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "lua"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0, help="per measured run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conc", type=int, default=16)
    ap.add_argument("--commit", help="also run this commit's lua/ (the before of a change), interleaved")
    ap.add_argument("--no-jitv", action="store_true", help="only the CPU per request")
    ap.add_argument("--phases", action="store_true", help="also nginx CPU per phase (bench/jit_paths.lua)")
    ap.add_argument("--steady", type=float, default=0.0, metavar="S",
                    help="after each jit.v run, S s more on the same (warm) workers: the aborts they add")
    ap.add_argument("--vmstate", action="store_true",
                    help="also LuaJIT's profiler: the share of samples per VM state, interpreted lines")
    ap.add_argument("--bodies", type=int, default=1,
                    help="distinct 1 KiB bodies, cycled (default 1); see --like-keys")
    ap.add_argument("--like-keys", action="store_true",
                    help="the bodies bench.keys --bodies sends (one template, the same length, a number at the "
                         "front) instead of bench.bodies' random text")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    require_this_checkout()
    tmp = Path(tempfile.mkdtemp(prefix="zccp-jit-"))
    body = tmp / "1k.jsonl"
    if args.like_keys:
        body.write_text(bodies_1k(args.bodies, str(NULL["model_name"])))
    else:
        body.write_text("".join(synthetic_body(1024, NULL["model_name"], seed=i) + "\n" for i in range(args.bodies)))
    lim = dict(NULL, segment_size_kb=1024, tokens_kb=256, max_body_kb=64)
    logs = tmp / "jitv"   # the workers run as the stack's nginx user (www-data under root)
    logs.mkdir()
    tmp.chmod(0o755)
    logs.chmod(0o1777)
    trees = {"worktree": REPO / "lua"}
    if args.commit:
        trees = {args.commit[:10]: lua_at(args.commit, tmp / "before"), **trees}
    v = start_d(tmp / "D", lim, 32)
    out: dict = {"aborts": {}, "steady": {}, "cpu": {}, "phases": {}, "vmstate": {}}
    try:
        status, _, data = post(v.url, body.read_bytes().split(b"\n")[0])
        if status != 200:
            raise RuntimeError(f"D answered {status}: {data[:300]!r}")
        prefix, _ = nginx_paths(tmp / "D")
        confs = {c: c.read_text() for name in ("zccp_http.conf", "zccp_server.conf") for c in prefix.rglob(name)}
        for label, lua in trees.items():
            if args.no_jitv:
                break
            for path, nocache in (("hit", False), ("miss", True)):
                files = str(logs / f"{label}-{path}-")
                reconfigure(v, lua, files, confs)
                wrk(v.url, body, args.conc, args.seconds, nocache)
                if not list(logs.glob(f"{label}-{path}-*")):
                    raise RuntimeError(f"jit.v wrote nothing (see {tmp}/D/logs/nginx-error.log)")
                found = aborts(files)
                out["aborts"][f"{label} {path}"] = report_aborts(
                    found, f"\n{label}, {path}: {sum(found.values())} trace aborts in the workers' first "
                           f"{args.seconds:g} s")
                if args.steady:
                    # the same workers, warm: what LuaJIT still tries and gives up once every spot
                    # it gave up on is blacklisted (a root trace's start) or spent (a side exit's
                    # counter, 255 tries at most)
                    marks = {f: len(lines) for f, lines in jitv_lines(files).items()}
                    r = measured_run(v, body, args.conc, args.steady, nocache)
                    steady = aborts(files, marks)
                    out["steady"][f"{label} {path}"] = {
                        "seconds": args.steady, "requests": r["requests"],
                        "aborts": report_aborts(steady, f"{label}, {path}, warm: {sum(steady.values())} trace "
                                                        f"aborts in {r['requests']} requests over the next "
                                                        f"{args.steady:g} s")}
        for i in range(args.rounds):
            for label, lua in trees.items():
                reconfigure(v, lua, None, confs)
                for path, nocache in (("hit", False), ("miss", True)):
                    wrk(v.url, body, args.conc, 1, nocache)   # warm-up: traces, L1
                    v.wait_drained()
                    r = measured_run(v, body, args.conc, args.seconds, nocache)
                    if r["errors"]:
                        raise RuntimeError(f"{label} {path}: {r['errors']} errors {r['statuses']}")
                    us = r["procs"]["nginx"]["cpu_s_per_req"] * 1e6
                    out["cpu"].setdefault(f"{label} {path}", []).append(
                        {"nginx_us": us, "rps": r["rps"], "other_cores": r["other_cores"]})
                    print(f"round {i + 1} {label:10s} {path:4s} {r['rps']:8.0f} req/s  nginx {us:6.1f} µs/req"
                          f"  (other load {r['other_cores']:.2f} cores)", flush=True)
        if args.vmstate:
            for label, lua in trees.items():
                reconfigure(v, lua, None, confs, profile=True)
                for path, nocache in (("hit", False), ("miss", True)):
                    out["vmstate"][f"{label} {path}"] = vm_states(v, body, args, nocache, f"{label}, {path}")
        if args.phases:
            for label, lua in trees.items():
                reconfigure(v, lua, None, confs, phases=True)
                for path, nocache in (("hit", False), ("miss", True)):
                    out["phases"][f"{label} {path}"] = phase_costs(v, body, args, nocache, f"{label}, {path}")
    finally:
        v.stop()
    print("\n| lua/ | path | nginx µs per request (least of rounds) | median |\n|---|---|---|---|")
    for key, rs in out["cpu"].items():
        us = sorted(r["nginx_us"] for r in rs)
        label, path = key.rsplit(" ", 1)
        print(f"| {label} | {path} | {us[0]:.1f} | {us[len(us) // 2]:.1f} |")
    out["load"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
