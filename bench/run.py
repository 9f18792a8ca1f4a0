"""ZCCP benchmark: every variant, one session, loopback, wrk, in interleaved rounds (twice).

    python -m bench.run            # full run (~16 min on 2 cores), writes bench/RESULTS.md + results.png
    python -m bench.run --quick    # smoke run (a few seconds per variant)

See bench/README.md for what each variant is and how numbers are taken.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import procs
from bench.bodies import sharegpt_bodies, synthetic_body
from bench.services import BENCH, REPO, Variant, post, start_a, start_b, start_b_cache, start_c, start_d

SIZES = {"1k": 1024, "64k": 65536, "512k": 524288}

LIMITS = {
    "workers": 2,                    # nginx worker processes, every variant
    "segment_size_kb": 3072,         # D: 4 KiB header + 700 KiB payload + 2304 KiB tokens + 64 KiB response
    "tokens_kb": 2304,               # 589,824 token ids: a 512 KiB prompt is ~512K byte tokens
    "response_kb": 64,
    "max_body_kb": 600,              # every variant: nginx client_max_body_size / client_body_buffer_size
}
VARIANTS = ("A", "B", "B-cache", "C", "D")
NULL = dict(LIMITS, backend="null", model_name="zccp-null", max_context=1 << 20)
TINY = dict(LIMITS, backend="tiny", model_name="zccp-tiny", max_context=8192,
            segment_size_kb=1024, tokens_kb=256, max_body_kb=512)


def log(*a: object) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


# --- wrk ---------------------------------------------------------------------------------

def wrk(url: str, body_file: Path, conc: int, seconds: float, nocache: bool = False) -> tuple[dict, dict, str]:
    """Run wrk; returns (parsed results, wrk's own rusage, raw output)."""
    threads = min(2, conc)
    cmd = ["wrk", "-t", str(threads), "-c", str(conc), "-d", f"{max(1, round(seconds))}s", "--timeout", "30s",
           "--latency", "-s", str(BENCH / "wrk" / "post.lua"), url + "/v1/messages", "--", str(body_file)]
    if nocache:
        cmd.append("no-cache")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert p.stdout is not None
    out = p.stdout.read().decode(errors="replace")
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    m = re.search(r"^WRKJSON (\{.*\})$", out, re.M)
    if p.returncode != 0 or not m:
        raise RuntimeError(f"wrk failed ({p.returncode}):\n{out}")
    res = json.loads(m.group(1))
    return res, {"cpu_s": ru.ru_utime + ru.ru_stime}, out


def measured_run(v: Variant, body_file: Path, conc: int, seconds: float, nocache: bool) -> dict:
    roots = v.pids()
    before = {role: procs.snapshot(pid) for role, pid in roots.items()}
    busy0 = procs.machine_busy_s()
    t0 = time.perf_counter()
    res, wrk_ru, raw = wrk(v.url, body_file, conc, seconds, nocache)
    wall = time.perf_counter() - t0
    busy1 = procs.machine_busy_s()
    after = {role: procs.snapshot(pid) for role, pid in roots.items()}
    n = max(res["requests"], 1)
    per = {}
    for role in roots:
        d = procs.delta(before[role], after[role])
        per[role] = {"cpu_s_per_req": d["cpu_s"] / n, "cpu_util": d["cpu_s"] / wall,
                     "rchar_per_req": d["rchar"] / n, "wchar_per_req": d["wchar"] / n, "procs": d["procs"]}
    per["wrk"] = {"cpu_s_per_req": wrk_ru["cpu_s"] / n, "cpu_util": wrk_ru["cpu_s"] / wall}
    ours = sum(p["cpu_util"] for p in per.values())
    # CPU used by processes outside this benchmark (other sessions' tests): the noise.
    other_cores = max(0.0, (busy1 - busy0) / wall - ours)
    errors = res["err_connect"] + res["err_read"] + res["err_write"] + res["err_status"] + res["err_timeout"]
    return {
        "requests": res["requests"], "rps": res["requests"] / (res["duration_us"] / 1e6),
        "p50_ms": res["p50_us"] / 1000, "p90_ms": res["p90_us"] / 1000, "p99_ms": res["p99_us"] / 1000,
        "p999_ms": res["p999_us"] / 1000, "mean_ms": res["lat_mean_us"] / 1000, "max_ms": res["lat_max_us"] / 1000,
        "errors": errors, "non2xx": res["err_status"], "socket_errors": errors - res["err_status"],
        "statuses": res.get("statuses", {}),      # every non-2xx answer, by status (post.lua)
        "wall_s": wall, "procs": per, "other_cores": other_cores, "wrk_tail": raw[-600:],
    }


# --- the matrix --------------------------------------------------------------------------

def canned_reply(model: str) -> bytes:
    from zccp.api import anthropic
    from zccp.model.null import DEFAULT_REPLY
    from zccp.shared_types import GenerationRequest, GenerationResult, SamplingParams

    req = GenerationRequest("anthropic", model, "", (), SamplingParams(max_tokens=64))
    res = GenerationResult(DEFAULT_REPLY, "end_turn", None, 0, len(DEFAULT_REPLY.encode()))
    return anthropic.render_response(req, res, "msg_canned000000000000000000", 0)


def probe(v: Variant, files: dict[str, Path], nocache: bool) -> dict[str, dict]:
    """One request per workload before timing: status and the reply without its id."""
    out = {}
    for wl, f in files.items():
        body = f.read_text().splitlines()[0].encode()
        status, headers, data = post(v.url, body, {"Cache-Control": "no-cache, no-store"} if nocache else None)
        try:
            obj = json.loads(data)
            obj.pop("id", None)
            norm = json.dumps(obj, sort_keys=True)
        except ValueError:
            norm = data[:200].decode(errors="replace")
        out[wl] = {"status": status, "reply": norm, "bytes": len(data),
                   "cache": headers.get("X-ZCCP-Cache") or headers.get("x-zccp-cache")}
    return out


def run_matrix(args: argparse.Namespace, run_dir: Path, files: dict[str, Path], results: dict, save) -> None:
    """Every variant's stack up at once, and each workload and concurrency measured in rounds:
    one run of every variant per round, the order rotated from round to round. A variant's
    runs are then seconds from the other variants' runs, not minutes: the ratios between
    variants are taken under the same machine state (this host's speed drifts by 1.5-2x
    over an hour, bench/RESULTS.md's history), as bench/guard.py does."""
    reply = canned_reply(NULL["model_name"])
    starters = {
        "A": lambda: start_a(run_dir / "A", NULL, reply),
        "B": lambda: start_b(run_dir / "B", NULL, args.b_workers),
        "B-cache": lambda: start_b_cache(run_dir / "B-cache", NULL, args.b_workers),
        "C": lambda: start_c(run_dir / "C", NULL, args.c_workers),
        "D": lambda: start_d(run_dir / "D", dict(NULL, engine_processes=args.d_processes), args.slots),
    }
    stacks: dict[str, Variant] = {}
    try:
        for key in args.variants:
            log(f"variant {key}: starting")
            v = stacks[key] = starters[key]()
            # other engineers may change the tree during a session: identify the code each variant ran
            results["variants"][key] = {"url": v.url, "info": v.info, "roles": list(v.pids()),
                                        "started": time.strftime("%H:%M:%S"),
                                        "tree_digest": commit_info()["tree_digest"]}
        modes = [(label, stacks[key], nocache) for key in args.variants
                 for label, nocache in ([("D", False), ("D-nocache", True)] if key == "D" else [(key, False)])]
        for label, v, nocache in modes:
            results["probes"][label] = probe(v, files, nocache)
        for wl, f in files.items():
            for conc in args.conc:
                for rep in range(args.repeats):
                    k = rep % len(modes)
                    for label, v, nocache in modes[k:] + modes[:k]:
                        drained = v.wait_drained()   # the previous run's requests are not this run's load
                        if args.warmup > 0:   # not measured: the previous run was another variant's
                            wrk(v.url, f, conc, args.warmup, nocache)
                            drained += v.wait_drained()
                        r = measured_run(v, f, conc, args.duration, nocache)
                        r.update(variant=label, workload=wl, conc=conc, rep=rep + 1, drain_s=drained)
                        results["rows"].append(r)
                        log(f"{label:10s} {wl:8s} c={conc:<3d} run {rep + 1}: {r['rps']:9.1f} req/s  "
                            f"p50 {r['p50_ms']:8.2f} ms  p99 {r['p99_ms']:8.2f} ms  "
                            f"errors {r['errors']} {r['statuses'] or ''}"
                            f"  (waited {drained * 1000:.0f} ms for the last run to drain)")
                        save()
        if "D" in stacks and args.profile:
            results["profile"] = profile_engine(stacks["D"], files, args)
            save()
    finally:
        for v in stacks.values():
            v.stop()


# --- py-spy on the engine -----------------------------------------------------------------

def profile_engine(v: Variant, files: dict[str, Path], args: argparse.Namespace) -> dict:
    exe = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))   # the venv's
    if not exe:
        return {"skipped": "py-spy not installed"}
    out = {}
    pid = v.pids()["engine"]
    secs = max(2, min(6, int(args.duration)))
    for wl, conc in (("1k", 64), ("512k", 16)):
        if wl not in files:
            continue
        raw = v.services["engine"].log_path.parent / f"pyspy-{wl}.txt"
        spy = subprocess.Popen([exe, "record", "--pid", str(pid), "--duration", str(secs), "--rate", "250",
                                "--format", "raw", "--nonblocking", "-o", str(raw)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)
        try:
            wrk(v.url, files[wl], conc, secs, nocache=True)   # the engine's own path: hits never reach it (L1)
        except RuntimeError as exc:
            out[wl] = {"error": str(exc)[:300]}
        try:
            _, err = spy.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            spy.kill()
            err = b"timeout"
        if not raw.exists():
            out[wl] = {"error": err.decode(errors="replace")[-300:]}
            continue
        out[wl] = summarize_collapsed(raw.read_text(), conc)
        log(f"py-spy engine {wl} c={conc}: {out[wl]['samples']} samples")
    return out


def summarize_collapsed(text: str, conc: int) -> dict:
    """Self and inclusive sample shares per function from py-spy's collapsed stacks."""
    self_c: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [re.sub(r" \((.*/)?([^/]+)\)", r" (\2)", f) for f in stack.split(";")]
        # strip line numbers so one function is one row
        frames = [re.sub(r":\d+\)", ")", f) for f in frames]
        leaf = frames[-1]
        self_c[leaf] = self_c.get(leaf, 0) + n
        for f in set(frames):
            incl[f] = incl.get(f, 0) + n
    top_self = sorted(self_c.items(), key=lambda kv: -kv[1])[:12]
    boiler = ("(<frozen runpy>)", "(base_events.py)", "(runners.py)", "(cli.py)", "(events.py)")
    top_incl = sorted(((f, n) for f, n in incl.items() if not f.endswith(boiler)), key=lambda kv: -kv[1])[:14]
    return {"conc": conc, "samples": total,
            "self": [(f, round(100 * n / total, 1)) for f, n in top_self] if total else [],
            "inclusive": [(f, round(100 * n / total, 1)) for f, n in top_incl] if total else []}


# --- tiny model: TTFT and tokens/s --------------------------------------------------------

def run_tiny(args: argparse.Namespace, run_dir: Path, results: dict, save) -> None:
    from bench import ttft

    body = synthetic_body(1024, TINY["model_name"], max_tokens=args.tiny_max_tokens, seed=1).encode()
    body_stream = json.dumps(dict(json.loads(body), stream=True), separators=(",", ":")).encode()
    for key, start in (("B", lambda: start_b(run_dir / "tiny-B", TINY, args.b_workers)),
                       ("D", lambda: start_d(run_dir / "tiny-D", TINY, 16))):
        log(f"tiny model, variant {key}: starting")
        v = start()
        try:
            status, _, data = post(v.url, body)
            results["tiny_probe"][key] = {"status": status, "reply": json.loads(data).get("content")}
            ttft.measure(v.url, body, False, 1, min(1.0, args.tiny_duration))   # warm-up
            for stream in (False, True):
                for conc in (1, 8):
                    for rep in range(args.repeats):
                        roots = v.pids()
                        before = {role: procs.snapshot(pid) for role, pid in roots.items()}
                        nc = {"Cache-Control": "no-cache, no-store"} if key == "D" else None
                        r = ttft.measure(v.url, body_stream if stream else body, stream, conc, args.tiny_duration, nc)
                        after = {role: procs.snapshot(pid) for role, pid in roots.items()}
                        n = max(r["requests"], 1)
                        r["procs"] = {role: {"cpu_s_per_req": procs.delta(before[role], after[role])["cpu_s"] / n,
                                             "cpu_util": procs.delta(before[role], after[role])["cpu_s"] / r["wall_s"]}
                                      for role in roots}
                        r.update(variant=key, rep=rep + 1)
                        results["tiny"].append(r)
                        log(f"tiny {key} stream={stream!s:5s} c={conc}: {r['req_per_s']:.1f} req/s "
                            f"{r['tokens_per_s']:.0f} tok/s ttft p50 {r['ttft_p50_ms']} ms "
                            f"lat p50 {r['latency_p50_ms']:.1f} ms errors {r['errors']}")
                        save()
        finally:
            v.stop()


# --- environment ----------------------------------------------------------------------------

def commit_info() -> dict:
    """HEAD from .git files (no git command), plus a digest of the code measured."""
    info: dict[str, object] = {}
    git = REPO / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if head.startswith("ref: "):
            ref = head[5:]
            p = git / ref
            sha = p.read_text().strip() if p.exists() else None
            if sha is None and (git / "packed-refs").exists():
                for line in (git / "packed-refs").read_text().splitlines():
                    if line.endswith(" " + ref):
                        sha = line.split()[0]
            info["branch"], info["commit"] = ref.rsplit("/", 1)[-1], sha
        else:
            info["commit"] = head
    except OSError:
        info["commit"] = None
    h = hashlib.sha256()
    files = sorted([*(REPO / "engine" / "zccp").rglob("*.py"), *(REPO / "lua").rglob("*.lua"),
                    *(REPO / "nginx").glob("*.conf"), *(REPO / "shm_abi").glob("*.h")])
    for f in files:
        h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes())
    info["tree_digest"] = h.hexdigest()[:16]
    info["features"] = {
        "lua fingerprint (fingerprint.lua)": (REPO / "lua/zccp/fp/fingerprint.lua").exists(),
        "lua masks (mask_patterns.lua)": (REPO / "lua/zccp/mask_patterns.lua").exists(),
        "engine cache module": any("redis" in f.read_text(errors="ignore") and f.name != "stack.py"
                                   and f.name != "cli.py" and f.name != "config.py"
                                   for f in (REPO / "engine" / "zccp").rglob("*.py")),
    }
    return info


def machine_info() -> dict:
    def cmd(*c: str) -> str:
        try:
            return subprocess.run(c, capture_output=True, text=True, timeout=10).stdout.strip() or \
                subprocess.run(c, capture_output=True, text=True, timeout=10).stderr.strip()
        except (OSError, subprocess.TimeoutExpired):
            return "?"

    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
    import torch
    return {
        "cpu": cpu, "cores": os.cpu_count(), "mem_gib": round(int(mem) / 1048576, 1),
        "kernel": platform.release(), "python": platform.python_version(), "torch": torch.__version__,
        "nginx": cmd("nginx", "-v").replace("nginx version: ", ""),
        "wrk": cmd("wrk", "-v").splitlines()[0] if cmd("wrk", "-v") else "?",
        "redis": cmd("redis-server", "--version").split(" ")[2] if cmd("redis-server", "--version") else "?",
        "loadavg_start": Path("/proc/loadavg").read_text().split()[:3],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 s runs, one repeat, c=16 only")
    ap.add_argument("--duration", type=float, default=7.0, help="seconds per measured wrk run (default 7)")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds of unmeasured wrk before each measured run")
    ap.add_argument("--repeats", type=int, default=2, help="measured rounds: one run of every variant each (default 2)")
    ap.add_argument("--conc", default="16,64", help="wrk connections (default 16,64)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}")
    ap.add_argument("--workloads", default="1k,64k,512k,sharegpt")
    ap.add_argument("--b-workers", type=int, default=2, help="uvicorn workers for B (default 2 = cores)")
    ap.add_argument("--c-workers", type=int, default=4, help="gunicorn sync workers for C (default 4 = 2 x cores)")
    ap.add_argument("--d-processes", type=int, default=2, help="ZCCP's engine processes (server.engine_processes; "
                    "default 2 = B's workers)")
    ap.add_argument("--slots", type=int, default=96, help="ZCCP slots (>= the largest concurrency)")
    ap.add_argument("--sharegpt-sample", type=int, default=2000)
    ap.add_argument("--tiny-duration", type=float, default=6.0)
    ap.add_argument("--tiny-max-tokens", type=int, default=128)
    ap.add_argument("--no-tiny", dest="tiny", action="store_false")
    ap.add_argument("--no-profile", dest="profile", action="store_false")
    ap.add_argument("--out", default=str(BENCH), help="where RESULTS.md, results.png, results.json go")
    args = ap.parse_args(argv)
    if args.quick:
        args.duration, args.warmup, args.repeats, args.conc = 2.0, 0.0, 1, "16"
        args.tiny_duration, args.sharegpt_sample = 1.5, 300
    args.conc = [int(c) for c in args.conc.split(",")]
    by_name = {v.lower(): v for v in VARIANTS}
    try:
        args.variants = [by_name[v.strip().lower()] for v in args.variants.split(",")]
    except KeyError as exc:
        ap.error(f"--variants: unknown variant {exc.args[0]!r} (known: {', '.join(VARIANTS)})")
    args.workloads = [w.strip() for w in args.workloads.split(",")]
    if max(args.conc) > args.slots:
        ap.error("--slots must be >= the largest --conc (ZCCP answers 429 when no slot is free)")
    for tool in ("wrk", "nginx", "redis-server"):
        if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
            sys.exit(f"bench: {tool} not found; run bash bench/setup.sh")

    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix="zccp-bench-"))
    log(f"run dir {run_dir}")
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")

    files: dict[str, Path] = {}
    bodies_dir = run_dir / "bodies"
    bodies_dir.mkdir()
    for wl in args.workloads:
        if wl in SIZES:
            files[wl] = bodies_dir / f"{wl}.jsonl"
            files[wl].write_text(synthetic_body(SIZES[wl], NULL["model_name"]) + "\n")
    sharegpt_stats = None
    if "sharegpt" in args.workloads:
        picked, sharegpt_stats = sharegpt_bodies(NULL["model_name"], NULL["max_body_kb"] * 1024, args.sharegpt_sample)
        files["sharegpt"] = bodies_dir / "sharegpt.jsonl"
        files["sharegpt"].write_text("\n".join(picked) + "\n")
        log(f"sharegpt: {sharegpt_stats}")

    results: dict = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "argv": sys.argv[1:], "quick": args.quick,
        "settings": {k: (v if not isinstance(v, Path) else str(v)) for k, v in vars(args).items()},
        "limits_null": NULL, "limits_tiny": TINY, "machine": machine_info(), "code": commit_info(),
        "sharegpt": sharegpt_stats, "body_bytes": {wl: SIZES.get(wl) for wl in files},
        "variants": {}, "probes": {}, "rows": [], "tiny": [], "tiny_probe": {}, "profile": None,
    }
    json_path = out_dir / "results.json"

    def save() -> None:
        json_path.write_text(json.dumps(results, indent=1))

    t0 = time.monotonic()
    try:
        run_matrix(args, run_dir, files, results, save)
        if args.tiny:
            run_tiny(args, run_dir, results, save)
    finally:
        results["elapsed_s"] = round(time.monotonic() - t0, 1)
        results["machine"]["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
        save()
    from bench import report

    report.write(results, out_dir)
    log(f"wrote {out_dir / 'RESULTS.md'} and {out_dir / 'results.png'} in {results['elapsed_s']} s")
    shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
