"""python -m bench.cache_eval [--quick] [--pairs N] [--unrelated N] ...

Brings up a real stack (redis + engine with the null model + nginx, tests/support/harness.py),
sends labelled prompt pairs through it and records X-ZCCP-Cache / X-ZCCP-Similarity,
then measures the latency of a cache hit with wrk. Writes bench/cache_eval/results.json,
RESULTS.md and hit_rate.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import re
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.cache_eval import report
from bench.cache_eval.baseline import BaselineStack
from bench.cache_eval.client import Client
from bench.cache_eval.jaccard import jaccard, signature, text_tokens
from bench.cache_eval.pairs import Pair, anth, build_pairs, dumps, max_tokens_for
from bench.cache_eval.prompts import DEDUP_BANDS, DEDUP_ROWS, build_pool
from tests.support.harness import Stack

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

OVERRIDES = {
    "model": {"backend": "null", "max_context": 200000},
    "cache": {"ttl_s": 3600},
    "shared_memory": {"segment_count": 64},
    "limits": {"max_body_kb": 256},
}


def log(msg: str) -> None:
    print(f"[cache_eval {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------- pairs

def run_pair(c: Client, p: Pair) -> Pair:
    r = c.send(p.api_base, p.base, p.base_headers)
    p.base_cache = r.cache if r.status == 200 else f"status {r.status}"
    # The answer is stored after it is sent: repeat the base until it hits, so that the
    # variant is looked up against a stored entry (the first repeat almost always hits).
    for i in range(1, 51):
        r = c.send(p.api_base, p.base, p.base_headers)
        if i == 1:
            p.confirm_first = r.cache
        p.confirm_tries = i
        if r.cache == "HIT":
            break
        time.sleep(0.005)
    v = c.send(p.api_var, p.variant, p.var_headers)
    # Redis timeouts (cache.timeout_ms) on the shared machine answer ERROR, and the engine then
    # skips Redis for a second: ask again after that second (counted in var_retries).
    while v.cache == "ERROR" and p.var_retries < 3:
        p.var_retries += 1
        time.sleep(1.1)
        v = c.send(p.api_var, p.variant, p.var_headers)
    p.var_status, p.var_cache, p.similarity = v.status, v.cache, v.similarity
    return p


# ----------------------------------------------------------------------------- unrelated

def unrelated(c: Client, pool, threads: int) -> dict:
    from zccp.cache.fp.csf import band_keys, estimate_jaccard
    VERIFY_MARGIN = 0.10     # fingerprint version 2's engine checked candidates this far below the threshold

    mt = max_tokens_for("unrelated")
    stored = [dumps(anth(b.text, mt)) for b in pool.stored]
    queries = [dumps(anth(b.text, mt)) for b in pool.queries]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        store_res = list(ex.map(lambda b: c.send("anthropic", b), stored))
    time.sleep(0.5)
    sample = random.Random(1).sample(range(len(stored)), min(len(stored), max(100, len(stored) // 10)))
    with ThreadPoolExecutor(threads) as ex:
        check = list(ex.map(lambda i: c.send("anthropic", stored[i]), sample))
    # The queries are sent with no-store: looked up, never stored, so the stored set stays
    # exactly the prompts above and queries never answer for each other.
    with ThreadPoolExecutor(threads) as ex:
        q_res = list(ex.map(lambda b: c.send("anthropic", b, {"cache-control": "no-store"}), queries))
    elapsed = time.perf_counter() - t0

    # Ground truth: each query's most similar stored prompt (true Jaccard), found through a
    # 32x4 MinHash index (catches J >= 0.6 with probability > 99%), and whether the query
    # shares any of the engine's 16x8 LSH bands with a stored prompt (= becomes a candidate).
    idx: dict = {}
    eng: dict = {}
    sigs = []
    # Only prompts that were stored count (a store answered NEAR is not stored).
    kept = [b for b, r in zip(pool.stored, store_res, strict=True) if r.cache == "MISS"]
    for i, b in enumerate(kept):
        sig = signature(list(_tokens(b)))
        sigs.append(sig)
        for k in range(DEDUP_BANDS):
            idx.setdefault((k, sig[k * DEDUP_ROWS:(k + 1) * DEDUP_ROWS]), []).append(i)
        for k, band in enumerate(band_keys(sig)):
            eng.setdefault((k, band), []).append(i)
    rows = []
    for qb, r in zip(pool.queries, q_res, strict=True):
        sig = signature(list(_tokens(qb)))
        cands = {i for k in range(DEDUP_BANDS) for i in idx.get((k, sig[k * DEDUP_ROWS:(k + 1) * DEDUP_ROWS]), ())}
        nn = max((jaccard(qb.shingles, kept[i].shingles) for i in cands), default=0.0)
        ecands = {i for k, band in enumerate(band_keys(sig)) for i in eng.get((k, band), ())}
        ests = [(estimate_jaccard(sig, sigs[i]), i) for i in ecands]
        best_est = max((e for e, _ in ests), default=0.0)
        # the engine checks the candidates whose estimate is within VERIFY_MARGIN of the
        # threshold exactly and serves the best one whose exact Jaccard reaches it
        best_j, best_i = max(((jaccard(qb.shingles, kept[i].shingles), i) for e, i in ests
                              if e >= report.THRESHOLD - VERIFY_MARGIN - 1e-9), default=(0.0, -1))
        row = {"nn_jaccard": round(nn, 5), "engine_candidates": len(ecands), "best_estimate": round(best_est, 5),
               "checked": sum(1 for e, _ in ests if e >= report.THRESHOLD - VERIFY_MARGIN - 1e-9),
               "best_checked_jaccard": round(best_j, 5),
               "cache": r.cache, "status": r.status, "similarity": r.similarity, "ntok": qb.ntok}
        if r.cache in ("HIT", "NEAR") and nn < report.THRESHOLD:      # a false hit: keep the reproducer
            row["query"] = qb.text
            if best_i >= 0:   # the candidate the engine would serve: the best exact Jaccard
                row["served_candidate"] = kept[best_i].text
                row["served_candidate_jaccard"] = round(best_j, 5)
        rows.append(row)
    return {
        "stored": len(kept), "sent_to_store": len(stored), "queries": len(queries), "elapsed_s": round(elapsed, 2),
        "store_statuses": _count(r.cache if r.status == 200 else f"status {r.status}" for r in store_res),
        "stored_check": _count(r.cache for r in check),
        "rows": rows,
    }


def _tokens(b):
    return text_tokens(b.text)


def _count(it) -> dict:
    out: dict = {}
    for x in it:
        out[x] = out.get(x, 0) + 1
    return out


# ----------------------------------------------------------------------------- hit latency

LATENCY_MAX_TOKENS = 2001   # a scope of its own: no category's entry can answer the latency bodies


def _wrk(url: str, body_file: Path, duration: int, cache_control: str = "", conns: int = 16) -> dict:
    threads = min(2, conns)
    cmd = ["wrk", f"-t{threads}", f"-c{conns}", f"-d{duration}s", "--latency", "-s", str(HERE / "post.lua"), url,
           "--", str(body_file), cache_control]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60)
    m = re.search(r"^WRKJSON (\{.*\})$", out.stdout, re.M)
    if not m:
        raise RuntimeError(f"wrk failed: {out.stdout}\n{out.stderr}")
    d = json.loads(m.group(1))
    d["rps"] = d["requests"] / (d["duration_us"] / 1e6)
    d["errors"] = d["err_connect"] + d["err_read"] + d["err_write"] + d["err_status"] + d["err_timeout"]
    d["connections"] = conns
    return d


def hit_latency(base_url: str, c: Client, pool, duration: int, workdir: Path, hits_only: bool = False,
                label: str = "") -> list[dict]:
    """wrk on one stored body (every answer a HIT), on a whitespace variant of it (every answer
    NEAR: near answers are not stored under their own key), and on the same body with
    Cache-Control no-cache (BYPASS, stored again) and no-cache, no-store (BYPASS, nothing
    stored); at 16 connections, and at 1 for HIT and no-store BYPASS. The engine's cache
    counters are read before and after each run. hits_only: the two HIT runs of the short
    body (the baseline's rows)."""
    by_len = sorted(pool.edit, key=lambda b: b.ntok)
    picks = {"short": min(by_len, key=lambda b: abs(b.ntok - 40)),
             "1k_tokens": min(by_len, key=lambda b: abs(b.ntok - 1000))}
    if hits_only:
        picks = {"short": picks["short"]}
    url = base_url + "/v1/messages"
    out = []
    for name, b in picks.items():
        body = dumps(anth(b.text, LATENCY_MAX_TOKENS))
        near = dumps(anth(b.text + "\n", LATENCY_MAX_TOKENS))
        f, fn = workdir / f"body_{name}.json", workdir / f"body_{name}_near.json"
        f.write_bytes(body)
        fn.write_bytes(near)
        first = c.send("anthropic", body).cache
        for _ in range(50):
            if c.send("anthropic", body).cache == "HIT":
                break
            time.sleep(0.01)
        _wrk(url, f, 2)   # warm-up, not measured
        runs = [("HIT", f, "", 16, duration), ("NEAR", fn, "", 16, duration),
                ("BYPASS", f, "no-cache", 16, duration), ("BYPASS", f, "no-cache, no-store", 16, duration),
                ("HIT", f, "", 1, max(2, duration // 2)), ("BYPASS", f, "no-cache, no-store", 1, max(2, duration // 2))]
        if hits_only:
            runs = [r for r in runs if r[0] == "HIT"]
        for want, bf, cc, conns, dur in runs:
            before = c.metrics()
            w = _wrk(url, bf, dur, cc, conns)
            time.sleep(0.3)
            after = c.metrics()
            delta = {k: int(after.get(k, 0) - before.get(k, 0)) for k in set(after) | set(before)}
            delta = {k: v for k, v in delta.items() if v}
            w.update(body=name, body_bytes=bf.stat().st_size, prompt_tokens=b.ntok, expect=want,
                     cache_control=cc, cache_delta=delta, first_store=first, stack=label,
                     all_as_expected=set(delta) == {want} and delta[want] >= w["requests"])
            out.append(w)
            log(f"  {label}{name:9s} c={conns:<2d} {want:6s} {('Cache-Control: ' + cc) if cc else '':34s} "
                f"{w['rps']:7.0f} req/s  p50 {w['p50_us'] / 1000:.3f} ms  p99 {w['p99_us'] / 1000:.3f} ms  "
                f"counters {delta}  errors {w['errors']}")
    return out


def exact_only_latency(pool, duration: int, workdir: Path) -> list[dict]:
    ov = json.loads(json.dumps(OVERRIDES))
    ov["cache"]["near_duplicate"] = False
    stack = Stack(workdir / "stack_exact_only", ov, with_redis=True).start()
    c = Client(stack.base_url, stack.admin_client)
    out = []
    try:
        b = min(sorted(pool.edit, key=lambda b: b.ntok), key=lambda b: abs(b.ntok - 40))
        body = dumps(anth(b.text, LATENCY_MAX_TOKENS))
        f = workdir / "body_short_exact_only.json"
        f.write_bytes(body)
        c.send("anthropic", body)
        for _ in range(50):
            if c.send("anthropic", body).cache == "HIT":
                break
            time.sleep(0.01)
        url = stack.base_url + "/v1/messages"
        _wrk(url, f, 2)
        for conns, dur in ((16, duration), (1, max(2, duration // 2))):
            before = c.metrics()
            w = _wrk(url, f, dur, "", conns)
            time.sleep(0.3)
            after = c.metrics()
            delta = {k: int(after.get(k, 0) - before.get(k, 0)) for k in set(after) | set(before)}
            delta = {k: v for k, v in delta.items() if v}
            w.update(body="short", body_bytes=len(body), prompt_tokens=b.ntok, expect="HIT", cache_control="",
                     cache_delta=delta, near_duplicate=False,
                     all_as_expected=set(delta) == {"HIT"} and delta["HIT"] >= w["requests"])
            out.append(w)
            log(f"  short     c={conns:<2d} HIT (near_duplicate off) {w['rps']:7.0f} req/s  "
                f"p50 {w['p50_us'] / 1000:.3f} ms"
                f"  p99 {w['p99_us'] / 1000:.3f} ms  counters {delta}  errors {w['errors']}")
    finally:
        c.close()
        stack.stop()
    return out


# ----------------------------------------------------------------------------- before

def run_baseline(a, pool, pairs: list[Pair], workdir: Path) -> dict:
    """The same unrelated queries and pairs through the baseline commit's gateway (fresh Redis):
    the 'before' columns. Fills Pair.before_cache / before_similarity."""
    log(f"before: the gateway of {a.baseline}")
    base = BaselineStack(a.baseline, workdir, OVERRIDES).start()
    c = Client(base.base_url, base.admin_client)
    try:
        u = unrelated(c, pool, a.threads)
        copies = [dataclasses.replace(p) for p in pairs]
        order = list(range(len(pairs)))
        random.Random(a.seed).shuffle(order)
        with ThreadPoolExecutor(a.threads) as ex:
            list(ex.map(lambda i: run_pair(c, copies[i]), order))
        for p, q in zip(pairs, copies, strict=True):
            p.before_cache = q.var_cache if q.var_status == 200 else f"status {q.var_status}"
            p.before_similarity = q.similarity
        fh = sum(1 for r in u["rows"] if r["cache"] in ("HIT", "NEAR"))
        log(f"  before: unrelated false hits {fh}/{len(u['rows'])}, pairs done")
        out = {"ref": a.baseline, "commit": base.commit, "unrelated_cache": [r["cache"] for r in u["rows"]],
               "unrelated_stored": u["stored"]}
        if not a.no_latency:
            out["latency"] = hit_latency(base.base_url, c, pool, a.wrk_seconds, workdir, hits_only=True,
                                         label=f"before ({a.baseline}) ")
        return out
    finally:
        c.close()
        base.stop()


# ----------------------------------------------------------------------------- main

def _machine() -> dict:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    try:
        wrk_v = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        wrk_v = ""
    return {"nproc": os.cpu_count(), "cpu": cpu, "commit": commit, "python": platform.python_version(),
            "kernel": platform.release(), "wrk": wrk_v}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cache_eval", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 40 pairs per category, 300+300 unrelated, 3 s wrk")
    ap.add_argument("--pairs", type=int, default=300, help="pairs per category (default 300)")
    ap.add_argument("--small", type=int, default=None, help="pairs for the small categories (default pairs/3)")
    ap.add_argument("--unrelated", type=int, default=2000, help="stored prompts and queries each (default 2000)")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--wrk-seconds", type=int, default=10)
    ap.add_argument("--no-latency", action="store_true")
    ap.add_argument("--seed", type=int, default=4)
    ap.add_argument("--baseline", default="main",
                    help="git ref whose gateway answers the same pairs first, for the 'before' columns ('' to skip)")
    ap.add_argument("--out", type=Path, default=HERE, help="where results.json, RESULTS.md and hit_rate.png go")
    ap.add_argument("--report-only", action="store_true", help="re-render RESULTS.md + plot from results.json")
    a = ap.parse_args(argv)
    if a.report_only:
        report.render(report.load_results(a.out / "results.json"), a.out)
        return 0
    if a.quick:
        a.pairs, a.unrelated, a.wrk_seconds = 40, 300, 3
    small = a.small if a.small is not None else max(10, a.pairs // 3)
    t_start = time.perf_counter()

    log(f"loading ShareGPT and building the prompt pool ({a.pairs} edit bases, {a.pairs} long, "
        f"{a.unrelated}x2 unrelated)")
    pool = build_pool(a.pairs, a.pairs, a.unrelated, a.seed, n_chats=small)
    pairs = build_pairs(pool, a.pairs, small, a.seed)
    log(f"{len(pairs)} pairs in {time.perf_counter() - t_start:.1f} s; long bases {len(pool.long)}")
    cost = None   # the meaning check's cost: python -m bench.cache_eval.meaning

    workdir = Path(tempfile.mkdtemp(prefix="zccp-cache-eval-"))
    before = None
    if a.baseline:
        before = run_baseline(a, pool, pairs, workdir)
    stack = Stack(workdir / "stack", OVERRIDES, with_redis=True).start()
    c = Client(stack.base_url, stack.admin_client)
    results: dict = {"machine": _machine(),
                     "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
                     "overrides": OVERRIDES, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "before": before,
                     "pool": {"conversations": pool.conversations, "first_turns": pool.first_turns,
                              "edit_bases": len(pool.edit), "long_bases": len(pool.long)}, "verify_cost": cost}
    try:
        m0 = c.metrics()
        log(f"unrelated: storing {len(pool.stored)} prompts, then querying {len(pool.queries)} others")
        results["unrelated"] = unrelated(c, pool, a.threads)
        u = results["unrelated"]
        fh = sum(1 for r in u["rows"] if r["cache"] in ("HIT", "NEAR"))
        log(f"  false hits {fh}/{len(u['rows'])}  stored check {u['stored_check']}  ({u['elapsed_s']} s)")

        log(f"pairs: {len(pairs)} through the gateway with {a.threads} threads")
        order = list(range(len(pairs)))
        random.Random(a.seed).shuffle(order)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(a.threads) as ex:
            list(ex.map(lambda i: run_pair(c, pairs[i]), order))
        results["pairs_elapsed_s"] = round(time.perf_counter() - t0, 2)
        log(f"  done in {results['pairs_elapsed_s']} s")
        m1 = c.metrics()
        results["engine_cache_counters"] = {k: int(m1.get(k, 0) - m0.get(k, 0)) for k in m1}
        results["engine_cache_reasons"] = {k: int(v) for k, v in c.metrics(by="reason").items()}
        results["pairs"] = [_pair_row(p) for p in pairs]

        if not a.no_latency:
            log(f"hit latency: wrk -t2 -c16 -d{a.wrk_seconds}s")
            results["latency"] = hit_latency(stack.base_url, c, pool, a.wrk_seconds, workdir)
            if before is not None:
                results["latency"] += before.pop("latency", [])
    finally:
        c.close()
        stack.stop()
    if not a.no_latency:
        log("hit latency with cache.near_duplicate: false (the lookup is one GET, no band reads)")
        results["latency"] += exact_only_latency(pool, a.wrk_seconds, workdir)
    results["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "results.json").write_text(report.dump_results(results))
    report.render(results, a.out)
    log(f"wrote {a.out / 'RESULTS.md'} ({results['elapsed_s']} s in all)")
    return 0


def _pair_row(p: Pair) -> dict:
    d = dataclasses.asdict(p)
    base, var = d.pop("base"), d.pop("variant")
    d["base_bytes"], d["variant_bytes"] = len(base), len(var)
    for k in ("jaccard", "est", "similarity"):
        if d[k] is not None:
            d[k] = round(d[k], 5)
    if not d["extra"]:
        d.pop("extra")
    # Keep the bodies of pairs whose answer missed its target or differs from the local model: reproducers.
    w = report.wanted(d)
    if (w is not None and report.is_hit(d["var_cache"]) != w) or d["var_cache"] != report.predicted(d):
        d["base_body"] = base.decode("utf-8", "replace")
        d["variant_body"] = var.decode("utf-8", "replace")
    return d
