"""Keys and limits on vs off (issue 18): what nginx's key check and limit reservation cost
on the hit path (the same 1 KiB body again and again: L1) and the miss path (no-cache,
no-store: every request goes to the engine's null model). Real nginx + engine + Redis (the
tests' Stack launcher), loopback, wrk (bench/wrk/post.lua).

    PYTHONPATH=engine python -m bench.keys [--seconds 3] [--conc 16]

Rows: auth off | keys (a key without limits: verified from the worker's cache, metered
after the answer) | keys+limits (rpm, input and output tokens per minute, daily and monthly
tokens, high enough never to refuse: reserved from the worker's leases, zccp.plugins.limits.lease) |
keys+limits+conc (the same and a concurrency limit: one Redis round trip per admission,
as that limit is exact) | A (nginx alone: cjson.decode of the body and a canned reply, bench.run's
ceiling; hit rows only), so that each mode's hit is set against A in the same round (issue 30:
>= 0.8x A with auth off, >= 0.75x with keys + limits). All five stacks run at once; each round measures every row once:
the hit rows one after the other, then the miss rows, the modes' order rotated from round to
round (no mode always first after a pause); the table shows each row's median over the
rounds (the machine is shared), and each comparison with off is paired within its round.
bench/keys_pieces.json (bench/keys_pieces.py), when there, adds the attribution table: ns
per piece of the key check and the limits, inside a real nginx request.
Writes bench/keys.md and bench/keys.json (--tag T: keys_T.md and keys_T.json, e.g. a second
concurrency). Every stack's access log is buffered as config.yaml ships it (the tests' harness
writes each line at once), as A's is. --commit C: the same run with C's lua/ in every
stack's nginx (git archive; the "before" of a change), written to bench/keys_before.json,
which keys.md's "Before" lines then compare against.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import procs
from bench.run import NULL as RUN_NULL
from bench.run import canned_reply
from bench.services import Variant, start_a
from tests.support.cache_requests import ENGINE_ENV
from tests.support.checkout import REPO, require_this_checkout
from tests.support.harness import Stack
from tests.support.leftovers import remove_socket_dirs
from zccp.config.paths import lua_vendor_dir

NULL = {"backend": "null", "name": "zccp-tiny", "max_context": 200000}
LIMITS = ["--rpm", "10000000", "--itpm", "1000000000", "--otpm", "1000000000",
          "--daily-tokens", "100000000000", "--monthly-tokens", "100000000000"]
CONC = ["--concurrency", "100000"]
MODES = ("off", "keys", "keys+limits", "keys+limits+conc")
CEILING = "A"   # nginx alone: cjson.decode of the body and a canned reply (bench.run's A), hit rows only


class Ceiling:
    """bench.run's variant A in the shape run_one() reads (base_url, nginx.proc)."""

    def __init__(self, v: Variant) -> None:
        self.variant = v
        self.base_url = v.url
        self.nginx = v.services["nginx"]

    def stop(self) -> None:
        self.variant.stop()


def start_ceiling(run_dir: Path) -> Ceiling:
    lim = dict(RUN_NULL, segment_size_kb=1024, tokens_kb=256, max_body_kb=64)   # as bench.guard's A
    return Ceiling(start_a(run_dir, lim, canned_reply(str(RUN_NULL["model_name"]))))


def body_1k(i: int = 0, model: str = "zccp-tiny") -> str:
    """A 1 KiB Anthropic body; i > 0: one of many distinct ones (its number leads the text)."""
    filler = (f"#{i} " if i else "") + "The quick brown fox jumps over the lazy dog. "
    body = {"model": model, "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": ""}]}
    base = len(json.dumps(body))
    body["messages"][0]["content"] = (filler * 40)[: 1024 - base]
    out = json.dumps(body)
    assert len(out) == 1024, len(out)
    return out


def bodies_1k(n: int, model: str = "zccp-tiny") -> str:
    """wrk's body file (bench/wrk/post.lua: one body per line): body_1k once (n = 1), or n
    distinct ones, cycled."""
    return "".join(body_1k(i + 1 if n > 1 else 0, model) + "\n" for i in range(n))


def make_key(s: Stack, mode: str) -> str:
    extra = (LIMITS if "limits" in mode else []) + (CONC if mode.endswith("conc") else [])
    out = subprocess.run([sys.executable, "-m", "zccp.ops.keys_cli", "create", "--tenant", "bench", *extra,
                          "--config", str(s.config_path), "--json"], capture_output=True, text=True,
                         timeout=60, env=ENGINE_ENV, check=True)
    return str(json.loads(out.stdout)["key"])


def use_lua_of(commit: str, tmp: Path, stacks: list[Stack]) -> None:
    """Every stack's nginx loads ZCCP's Lua modules from `commit`'s lua/ (its rendered
    lua_package_path, then a reload); waits until the old workers are gone."""
    root = tmp / "lua-at-commit"
    root.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "lua"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    for s in stacks:
        assert s.nginx is not None
        http = next((s.run_dir / "nginx").rglob("zccp_http.conf"))
        path = f"{root / 'lua'}/?.lua;{lua_vendor_dir()}/?.lua;;"
        text, n = re.subn(r'lua_package_path "[^"]*";', f'lua_package_path "{path}";',
                          http.read_text())
        assert n == 1
        http.write_text(text)
        s.hup_nginx(30)   # every old worker gone: the new Lua answers


def run_one(s: Stack | Ceiling, body_file: Path, conc: int, seconds: float, nocache: bool, key: str | None) -> dict:
    args_tail = ["no-cache" if nocache else "-"] + ([key] if key else [])
    nginx_pid = s.nginx.proc.pid if s.nginx else 0
    load = os.getloadavg()[0]
    before = procs.snapshot(nginx_pid)
    t0 = time.perf_counter()
    res = wrk_with(s.base_url, body_file, conc, seconds, args_tail)
    wall = time.perf_counter() - t0
    after = procs.snapshot(nginx_pid)
    n = max(1, res["requests"])
    cpu = procs.delta(before, after)["cpu_s"]
    return {"rps": res["requests"] / (res["duration_us"] / 1e6), "p50_ms": res["p50_us"] / 1000,
            "p99_ms": res["p99_us"] / 1000, "non2xx": res["err_status"], "requests": res["requests"],
            "nginx_cpu_us_per_req": cpu / n * 1e6, "wall_s": wall, "load1": (load + os.getloadavg()[0]) / 2}


def wrk_with(url: str, body_file: Path, conc: int, seconds: float, tail: list[str], path: str = "/v1/messages") -> dict:
    """Like bench.run.wrk, with post.lua's extra arguments (no-cache flag, API key)."""
    cmd = ["wrk", "-t", str(min(2, conc)), "-c", str(conc), "-d", f"{max(1, round(seconds))}s", "--timeout", "30s",
           "--latency", "-s", str(REPO / "bench" / "wrk" / "post.lua"), url + path, "--", str(body_file),
           *tail]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60).stdout
    m = re.search(r"^WRKJSON (\{.*\})$", out, re.M)
    if not m:
        raise RuntimeError(out)
    return dict(json.loads(m.group(1)))


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def render(runs: dict[str, list[dict]], seconds: float, conc: int, bodies: int = 1) -> str:
    """keys.md from every run. Rows: each row's median req/s, latencies and nginx CPU over the
    rounds; the comparisons are paired: in each round, the row against off's run of that
    round (the machine's load drifts between rounds), and the median of those."""
    rounds = len(runs["off/hit"])
    loads = [r.get("load1", float("nan")) for rs in runs.values() for r in rs]
    lines = ["# Keys and limits on vs off (bench/keys.py)", "",
             f"Four ZCCP stacks and A at once (nginx 2 workers each, engine with the null model, its own "
             "redis-server), "
             f"loopback; wrk -c {conc} -t 2 for {seconds:g} s per row after a 1 s warm-up; "
             + ("one 1 KiB Anthropic body" if bodies == 1 else f"{bodies} distinct 1 KiB Anthropic bodies, cycled "
                "(nginx's per-body work, e.g. the output reservation's decode, is paid per request)")
             + f"; {rounds} rounds, each measuring every row in turn. The table shows each row's "
             "medians over the rounds; the comparisons below are paired (each round's run against off's run "
             "of the same round, then the median), as the shared machine's load drifts between rounds. "
             "hit: the same body (or bodies) again and again (nginx's L1 answers); miss: "
             "`Cache-Control: no-cache, no-store` "
             "(every request goes to the engine). keys: `auth.mode: keys`, a key without limits (verified from "
             "the worker's cache, metered in the worker's batch sent every 50 ms). keys+limits: a key with rpm, "
             "itpm, otpm, daily and monthly tokens set (never refused): reserved from the worker's leases "
             "(plugins/limits/lease; a Redis round trip when a lease runs low). keys+limits+conc: the same and a "
             "concurrency limit of 100000: one Redis script per admission that finds no spare slot (a round "
             "gives a worker 1/16 of the free slots while the limit is far; plugins/limits/lease). nginx CPU: "
             "its processes' user+system time over the run / requests. The machine is shared (2 cores, other sessions' "
             "tests running): read the numbers as indicative. Each round measures the hit rows one after the "
             "other, then the miss rows, the modes' order rotated from round to round. A: nginx alone "
             "(`cjson.decode` of the body and a canned reply, bench.run's ceiling, 2 workers), measured with "
             "the hit rows of every round. Every nginx (the four stacks' and A's) writes its access log in 64 KiB "
             "batches at most 1 s apart, as config.yaml ships ZCCP's.", "",
             f"Machine load while measuring (1-minute load average, 2 cores): median {median(loads):.2f}, "
             f"from {min(loads):.2f} to {max(loads):.2f}.", "",
             "| auth | path | req/s | p50 ms | p99 ms | non-2xx | nginx CPU µs/req | req/s of each round |",
             "|---|---|---|---|---|---|---|---|"]
    for mode in ((CEILING,) if f"{CEILING}/hit" in runs else ()) + MODES:
        for path in ("hit",) if mode == CEILING else ("hit", "miss"):
            rs = runs[f"{mode}/{path}"]
            lines.append(f"| {mode} | {path} | {median([r['rps'] for r in rs]):.0f} | "
                         f"{median([r['p50_ms'] for r in rs]):.2f} | {median([r['p99_ms'] for r in rs]):.2f} | "
                         f"{sum(r['non2xx'] for r in rs)} | {median([r['nginx_cpu_us_per_req'] for r in rs]):.1f} | "
                         f"{', '.join(str(round(r['rps'])) for r in rs)} |")
    lines.append("")
    lines += paired(runs)
    lines += against_ceiling(runs)
    before = REPO / "bench" / "keys_before.json"
    if before.exists():
        saved = json.loads(before.read_text())
        bl = [r.get("load1", float("nan")) for rs in saved["runs"].values() for r in rs]
        lines += ["", f"Before: the lua/ of {saved['commit']} (bench/keys_before.json, written by the last "
                      f"`--commit` run, not necessarily this session's; load median {median(bl):.2f}, from "
                      f"{min(bl):.2f} to {max(bl):.2f}; {saved.get('bodies', 1)} distinct bodies; "
                      f"c = {saved.get('conc', '?')}):", ""]
        lines += paired(saved["runs"])
    lines += attribution()
    return "\n".join(lines) + "\n"


def paired_medians(on: list[dict], base: list[dict]) -> tuple[float, float]:
    """Two rows' runs paired round by round: the median ratio of req/s and the median
    difference of nginx CPU per request."""
    ratio = median([a["rps"] / b["rps"] for a, b in zip(on, base, strict=True)])
    cpu = median([a["nginx_cpu_us_per_req"] - b["nginx_cpu_us_per_req"] for a, b in zip(on, base, strict=True)])
    return ratio, cpu


def paired(runs: dict[str, list[dict]]) -> list[str]:
    """Each mode against off, paired within each round."""
    out = []
    for path in ("hit", "miss"):
        for mode in MODES[1:]:
            ratio, cpu = paired_medians(runs[f"{mode}/{path}"], runs[f"off/{path}"])
            out.append(f"* {path}, {mode}: {ratio * 100:.0f}% of off's req/s; nginx CPU {cpu:+.1f} µs per "
                       "request (paired medians).")
    return out


def against_ceiling(runs: dict[str, list[dict]]) -> list[str]:
    """Each mode's hit against A's run of the same round (issue 30: the L1 hit >= 0.8x A with
    auth off, >= 0.75x A with keys + limits)."""
    ceiling = runs.get(f"{CEILING}/hit")
    if not ceiling:
        return []
    out = [""]
    for mode in MODES:
        ratio, cpu = paired_medians(runs[f"{mode}/hit"], ceiling)
        out.append(f"* hit, {mode}: **{ratio:.2f}× A's req/s**; nginx CPU {cpu:+.1f} µs per request above A's "
                   "(paired medians).")
    return out


def attribution() -> list[str]:
    """bench/keys_pieces.json as a table: ns per piece, a column per measured label."""
    path = REPO / "bench" / "keys_pieces.json"
    if not path.exists():
        return []
    saved = json.loads(path.read_text())
    labels = list(saved)
    names = list(dict.fromkeys(r["name"] for label in labels for r in saved[label]["rows"] if r["ns"] > 0))
    out = ["", "**Attribution: ns per piece (bench/keys_pieces.py).**", "",
           "Each piece run N times inside one real request of a stack with keys on (nginx, null engine, Redis), "
           "the least of several runs (the machine is shared); one key without limits, one with the limits of "
           "the keys+limits row. The columns: " + "; ".join(
               f"{label}: lua/ of {saved[label]['commit']}, load {saved[label]['load'][0]:.2f}" for label in labels)
           + ". The interpreter columns: LuaJIT's interpreter only (jit.off() in that worker); a real request's Lua "
           "runs mostly compiled today (bench.jit_paths --vmstate: 22% of a hit's nginx samples in compiled traces, "
           "4-6% in the interpreter), so the compiled columns are the closer. The \"once per request\" rows: the key "
           "check, the admission, the settlement and a usage line run once per request on a location driven by wrk "
           "for 3 s (bench/keys_once.lua), as on ZCCP's own path: what they cost there, in ns per request, "
           "including the garbage collection their allocations bring.", "",
           "| piece | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for name in names:
        cells = []
        for label in labels:
            ns = next((r["ns"] for r in saved[label]["rows"] if r["name"] == name), None)
            cells.append("-" if ns is None else f"{ns:.0f}")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--conc", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--render", action="store_true", help="only rewrite keys.md from keys.json")
    ap.add_argument("--bodies", type=int, default=1, help="distinct 1 KiB bodies, cycled (default 1)")
    ap.add_argument("--tag", default="", help="write keys_TAG.md and keys_TAG.json (e.g. c64)")
    ap.add_argument("--commit", help="run with this commit's lua/; writes bench/keys_before.json only")
    args = ap.parse_args()
    stem = f"keys_{args.tag}" if args.tag else "keys"
    out_json, out_md = REPO / "bench" / f"{stem}.json", REPO / "bench" / f"{stem}.md"
    if args.render:
        saved = json.loads(out_json.read_text())
        out_md.write_text(render(saved["runs"], saved["seconds"], saved["conc"], saved.get("bodies", 1)))
        return
    require_this_checkout()
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        body_file = Path(tmp) / "body.jsonl"
        body_file.write_text(bodies_1k(args.bodies))
        stacks: dict[str, Stack | Ceiling] = {}
        keys: dict[str, str | None] = {CEILING: None}
        try:
            stacks[CEILING] = start_ceiling(Path(tmp) / "A")
            for mode in MODES:
                # the access log buffered as config.yaml ships it (the harness writes at once)
                over: dict = {"model": NULL, "shared_memory": {"segment_count": 64},
                              "logging": {"access_flush_ms": 1000}}
                if mode != "off":
                    over["auth"] = {"mode": "keys"}
                stacks[mode] = Stack(Path(tmp) / mode.replace("+", "_"), over, with_redis=True).start()
                keys[mode] = make_key(stacks[mode], mode) if mode != "off" else None
            if args.commit:
                use_lua_of(args.commit, Path(tmp), [s for s in stacks.values() if isinstance(s, Stack)])
            for rnd in range(args.rounds):
                for path, nocache in (("hit", False), ("miss", True)):
                    rows = ((CEILING,) + MODES) if path == "hit" else MODES
                    for mode in rows[rnd % len(rows):] + rows[:rnd % len(rows)]:
                        s = stacks[mode]
                        run_one(s, body_file, args.conc, 1, nocache, keys[mode])   # warm-up (and the hit's store)
                        r = run_one(s, body_file, args.conc, args.seconds, nocache, keys[mode])
                        runs.setdefault(f"{mode}/{path}", []).append(r)
                        print(rnd, mode, path, r, flush=True)
        finally:
            for s in stacks.values():
                s.stop()
    remove_socket_dirs()
    if args.commit:
        (REPO / "bench" / "keys_before.json").write_text(json.dumps(
            {"commit": args.commit, "seconds": args.seconds, "conc": args.conc, "bodies": args.bodies, "runs": runs},
            indent=1))
        print("\n".join(paired(runs)))
        return
    out_json.write_text(json.dumps({"seconds": args.seconds, "conc": args.conc, "bodies": args.bodies, "runs": runs},
                                   indent=1))
    text = render(runs, args.seconds, args.conc, args.bodies)
    out_md.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
