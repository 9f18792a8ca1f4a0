"""RESULTS.md's cost sections: what a cache hit costs under load (wrk) and what the exact
check of a near candidate costs in-process (bench/cache_eval/verify_cost.py)."""

from __future__ import annotations

from bench.cache_eval.decision import VERIFY_MARGIN
from bench.cache_eval.markdown import table


def latency_section(res: dict) -> list[str]:
    """Cache-hit latency under wrk, HIT / NEAR / BYPASS (absent from results.json: nothing)."""
    L: list[str] = []
    lat = res.get("latency")
    if lat:
        L += ["## Cache-hit latency (bench only)", "",
              "`wrk -t2 -c16 -d" + str(res["args"]["wrk_seconds"]) + "s --latency -s bench/cache_eval/post.lua` "
              "(and `-t1 -c1` for the unloaded rows) posting one Anthropic body, a ShareGPT prompt, in a cache "
              "scope of its own. **HIT**: the body was stored once. **NEAR**: the body plus a trailing newline "
              "(NEAR answers are not stored under their own key, so every request takes the near path). "
              "**BYPASS**: the same body with `Cache-Control: no-cache` (no lookup; the null model answers and "
              "the answer is stored again) or `no-cache, no-store` (no lookup, no store). The last two rows: a "
              "second stack with `cache.near_duplicate: false`, where a lookup is one GET instead of a GET plus "
              "16 SMEMBERS. Rows marked *before* ran on the baseline commit's gateway, earlier in the same run. "
              "The engine's "
              "`zccp_engine_cache_total` counters are read before and after each run: every answer must be of "
              "the expected kind. wrk shares the 2 cores with nginx (2 workers), the engine and Redis.", ""]
        lrows = []
        for w in lat:
            d = w["cache_delta"]
            check = ("✓ " if w["all_as_expected"] else "**✗** ") + ", ".join(f"{k} {v:,}" for k, v in sorted(d.items()))
            lrows.append([(w.get("stack") or "") + w["body"], f"{w['prompt_tokens']} tok / {w['body_bytes']:,} B",
                          str(w["connections"]),
                          w["expect"] + (f" (`{w['cache_control']}`)" if w["cache_control"] else "")
                          + (" — `near_duplicate: false`" if w.get("near_duplicate") is False else ""),
                          f"{w['rps']:,.0f}", f"{w['p50_us'] / 1000:.3f}", f"{w['p90_us'] / 1000:.3f}",
                          f"{w['p99_us'] / 1000:.3f}", str(w["errors"]), check])
        L += table(["body", "prompt", "clients", "answer", "req/s", "p50 ms", "p90 ms", "p99 ms", "errors",
                     "engine counters (delta)"], lrows)
        hits = [w for w in lat if w["expect"] == "HIT" and w["connections"] == 16 and w.get("near_duplicate", True)
                and not w.get("stack")]
        if hits:
            worst = max(w["p50_us"] for w in hits) / 1000
            L += ["", "Target: cache hit p50 ≤ 1 ms at 16 concurrent clients — "
                  + ("**met**" if worst <= 1.0 else f"**missed**: p50 up to {worst:.3f} ms") + "."]
        L += [""]
    return L


def verify_cost_section(res: dict) -> list[str]:
    """The in-process cost of the exact check of a near candidate, per length stratum."""
    L: list[str] = []
    vc = res.get("verify_cost")
    if vc:
        L += ["## What the exact check of a near candidate costs (in-process)", "",
              "`bench/cache_eval/verify_cost.py`, in this run's process (no Redis, no network): per edit base, each "
              "step run 25 times, the median kept, then the median over the stratum's bases. *own set*: the "
              "request's shingle set (mask a copy of the final turn, tokenize, hash, sort), computed once per "
              "lookup that has a candidate to check (estimate within "
              f"{VERIFY_MARGIN:.2f} of the threshold) and once per store; a lookup without one does not compute "
              "it. *decode* + *exact J*: per checked candidate. *estimate*: the MinHash estimate, all a "
              "candidate cost before. *record*: the near record in Redis (545 bytes before for every prompt).", ""]
        rows = [[r["stratum"], str(r["bases"]), f"{r['tokens']:.0f}", f"{r['own_set_us']:.1f}",
                 f"{r['decode_us']:.1f}", f"{r['exact_us']:.1f}",
                 f"{r['own_set_us'] + r['decode_us'] + r['exact_us']:.1f}", f"{r['estimate_us']:.1f}",
                 f"{r['encode_us']:.1f}", f"{r['record_bytes']:,.0f}"] for r in vc]
        L += table(["tokens", "bases", "median tokens", "own set µs", "decode µs / cand.", "exact J µs / cand.",
                     "one checked candidate µs", "estimate µs / cand. (before)", "encode µs (store)",
                     "record bytes"], rows)
        L += [""]
    return L
