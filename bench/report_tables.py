"""The null-model tables of bench/RESULTS.md (bench.report renders the page): headline,
ratios and targets, CPU and I/O per request, what bounds ZCCP, replies, tiny-model TTFT, profile."""

from __future__ import annotations

import statistics

ORDER = ["A", "B", "B-cache", "C", "D", "D-nocache"]
NAMES = {
    "A": "A nginx+cjson (ceiling)",
    "B": "B nginx→FastAPI/uvicorn",
    "B-cache": "B + exact Redis cache (redis-py asyncio, ZCCP's key)",
    "C": "C nginx→Flask/gunicorn",
    "D": "D ZCCP",
    "D-nocache": "D ZCCP, Cache-Control: no-cache, no-store",
    "D-cachehit": "D ZCCP, cache on (identical prompt: cache hits)",
}


def _rows(res: dict, variant: str, wl: str, conc: int) -> list[dict]:
    return [r for r in res["rows"] if r["variant"] == variant and r["workload"] == wl and r["conc"] == conc]


def _mean(rows: list[dict], key: str) -> float | None:
    return statistics.fmean(r[key] for r in rows) if rows else None


def _fmt(x: float | None, nd: int = 1) -> str:
    if x is None:
        return "–"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{nd}f}"


def _workloads(res: dict) -> list[str]:
    seen: list[str] = []
    for r in res["rows"]:
        if r["workload"] not in seen:
            seen.append(r["workload"])
    return seen


def _concs(res: dict) -> list[int]:
    return sorted({r["conc"] for r in res["rows"]})


def _variants(res: dict) -> list[str]:
    have = {r["variant"] for r in res["rows"]}
    return [v for v in ORDER if v in have]


def headline(res: dict) -> str:
    out = ["| workload | c | variant | req/s (run 1 / run 2) | mean req/s | p50 ms | p99 ms | errors |",
           "|---|---|---|---|---|---|---|---|"]
    for wl in _workloads(res):
        for c in _concs(res):
            for v in _variants(res):
                rows = _rows(res, v, wl, c)
                if not rows:
                    continue
                runs = " / ".join(_fmt(r["rps"]) for r in rows)
                out.append(f"| {wl} | {c} | {NAMES[v]} | {runs} | **{_fmt(_mean(rows, 'rps'))}** | "
                           f"{_fmt(_mean(rows, 'p50_ms'), 2)} | {_fmt(_mean(rows, 'p99_ms'), 2)} | "
                           f"{_errors(rows)} |")
    return "\n".join(out)


def _errors(rows: list[dict]) -> str:
    """The runs' errors, with every non-2xx status counted (runs since post.lua records them)."""
    statuses: dict[str, int] = {}
    for r in rows:
        for status, n in r.get("statuses", {}).items():
            statuses[status] = statuses.get(status, 0) + n
    detail = ", ".join(f"{s}: {n}" for s, n in sorted(statuses.items()))
    return f"{sum(r['errors'] for r in rows)}" + (f" ({detail})" if detail else "")


# Issue 11's targets: (row label, D's variant, workload, [(baseline, min D/baseline req/s)], max D p99 / B p99)
TARGET_ROWS = [
    ("1 KiB, every request an exact hit", "D", "1k", [("A", 0.6), ("B", 5.0), ("B-cache", 4.0)], 1 / 3),
    ("64 KiB, exact hits", "D", "64k", [("B", 3.0), ("B-cache", 2.0)], None),
    ("1 KiB MISS (cache bypassed)", "D-nocache", "1k", [("B", 1.3)], None),
    ("512 KiB MISS (cache bypassed)", "D-nocache", "512k", [("B", 1.3)], None),
    ("512 KiB with the cache on (hits)", "D", "512k", [("B", 2.0)], None),
    ("ShareGPT replay (real mix, cache on)", "D", "sharegpt", [("B", 1.5)], None),
]
NGINX_MISS_US = 60.0      # nginx CPU per 1 KiB MISS


def ratios(res: dict) -> tuple[str, list[str]]:
    """The targets table: every row at every concurrency, each ratio with its verdict."""
    out = ["| row | c | D req/s | ratios (D / baseline req/s) | D p99 / B p99 | verdict |",
           "|---|---|---|---|---|---|"]
    verdicts: list[str] = []
    for label, dv, wl, mins, p99_max in TARGET_ROWS:
        for c in _concs(res):
            d = _rows(res, dv, wl, c)
            if not d:
                continue
            dr = _mean(d, "rps")
            cells, checks = [], []
            for base, want in mins:
                rows = _rows(res, base, wl, c)
                if not rows:
                    cells.append(f"{base}: –")
                    continue
                x = dr / _mean(rows, "rps")
                cells.append(f"{base}: {x:.2f}× (≥ {want:g})")
                checks.append(f"D/{base} ≥ {want:g}: " + ("met" if x >= want else f"MISSED ({x:.2f}×)"))
            b = _rows(res, "B", wl, c)
            p99r = _mean(d, "p99_ms") / _mean(b, "p99_ms") if b else None
            if p99_max is not None and p99r is not None:
                checks.append("p99 ≤ B/3: " + ("met" if p99r <= p99_max else f"MISSED ({p99r:.2f} of B's)"))
            if dv == "D-nocache" and wl == "1k":
                us = [r["procs"]["nginx"]["cpu_s_per_req"] * 1e6 for r in d if "nginx" in r.get("procs", {})]
                if us:
                    m = statistics.fmean(us)
                    cells.append(f"nginx CPU {m:.0f} µs/req (≤ {NGINX_MISS_US:g})")
                    checks.append(f"nginx ≤ {NGINX_MISS_US:g} µs: "
                                  + ("met" if m <= NGINX_MISS_US else f"MISSED ({m:.0f} µs)"))
            verdicts.extend(f"{label}, c={c}: {x}" for x in checks)
            verdict = "all met" if checks and all(x.endswith("met") for x in checks) else "missed" if checks else "–"
            out.append(f"| {label} | {c} | {_fmt(dr)} | {'; '.join(cells)} | {_fmt(p99r, 2)} | {verdict} |")
    return "\n".join(out), verdicts


def cpu_table(res: dict) -> str:
    roles = ["nginx", "engine", "backend", "redis", "wrk"]
    out = ["| workload | c | variant | req/s | " + " | ".join(f"{r} µs/req (cores)" for r in roles) +
           " | total µs/req | other load (cores) |", "|---|---|---|---|" + "---|" * (len(roles) + 2)]
    for wl in _workloads(res):
        for c in _concs(res):
            for v in _variants(res):
                rows = _rows(res, v, wl, c)
                if not rows:
                    continue
                cells, total = [], 0.0
                for role in roles:
                    vals = [r["procs"][role] for r in rows if role in r["procs"]]
                    if not vals:
                        cells.append("–")
                        continue
                    us = statistics.fmean(x["cpu_s_per_req"] for x in vals) * 1e6
                    util = statistics.fmean(x["cpu_util"] for x in vals)
                    total += us
                    cells.append(f"{us:,.0f} ({util:.2f})")
                other = [r["other_cores"] for r in rows if "other_cores" in r]
                other_s = " / ".join(f"{x:.2f}" for x in other) if other else "n/a"
                out.append(f"| {wl} | {c} | {v} | {_fmt(_mean(rows, 'rps'))} | " + " | ".join(cells) +
                           f" | {total:,.0f} | {other_s} |")
    return "\n".join(out)


def io_table(res: dict) -> str:
    out = ["| workload | variant | nginx read B/req | nginx write B/req | app/engine read B/req | "
           "app/engine write B/req |", "|---|---|---|---|---|---|"]
    concs = _concs(res)
    c = concs[-1] if concs else None
    for wl in _workloads(res):
        for v in _variants(res):
            rows = _rows(res, v, wl, c)
            if not rows:
                continue
            def g(role: str, k: str, rows: list = rows) -> str:
                vals = [r["procs"][role][k] for r in rows if role in r["procs"] and k in r["procs"][role]]
                return f"{statistics.fmean(vals):,.0f}" if vals else "–"
            app = "engine" if v.startswith("D") else "backend"
            out.append(f"| {wl} | {v} | {g('nginx', 'rchar_per_req')} | {g('nginx', 'wchar_per_req')} | "
                       f"{g(app, 'rchar_per_req')} | {g(app, 'wchar_per_req')} |")
    return "\n".join(out)


def bounds(res: dict) -> str:
    """Which process is saturated in each D row (from the CPU accounting)."""
    cores = res["machine"].get("cores") or 2
    out = []
    for wl in _workloads(res):
        for c in _concs(res):
            rows = _rows(res, "D", wl, c)
            if not rows:
                continue
            util = {role: statistics.fmean(r["procs"][role]["cpu_util"] for r in rows if role in r["procs"])
                    for role in ("nginx", "engine", "redis", "wrk")}
            total = sum(util.values())
            if util["engine"] >= 0.85:
                why = f"the engine (one Python thread) is saturated at {util['engine']:.2f} cores"
            elif total >= 0.9 * cores:
                why = f"the machine: all processes together use {total:.2f} of {cores} cores"
            else:
                why = f"nothing saturated ({total:.2f} of {cores} cores busy): latency / hand-offs"
            out.append(f"- **{wl}, c={c}**: {why} (nginx {util['nginx']:.2f}, engine {util['engine']:.2f}, "
                       f"redis {util['redis']:.2f}, wrk {util['wrk']:.2f} cores).")
    return "\n".join(out)


def same_bytes(res: dict) -> str:
    probes = res.get("probes") or {}
    out = []
    for wl in _workloads(res):
        replies = {v: p[wl] for v, p in probes.items() if wl in p}
        statuses = ", ".join(f"{v}: {p['status']}" for v, p in replies.items())
        bcd = {v: p["reply"] for v, p in replies.items() if v in ("B", "B-cache", "C", "D", "D-nocache")}
        same = len(set(bcd.values())) <= 1
        cache = ", ".join(f"{v}: {p['cache']}" for v, p in replies.items() if p.get("cache"))
        out.append(f"- {wl}: status {statuses}; B/C/D replies identical except `id`: "
                   f"**{'yes' if same else 'NO'}**" + (f"; X-ZCCP-Cache {cache}" if cache else ""))
    return "\n".join(out)


def copies_section(res: dict) -> str:
    sizes = res.get("body_bytes") or {}
    rlen = None
    for p in (res.get("probes") or {}).values():
        for x in p.values():
            if x.get("status") == 200 and x.get("bytes"):
                rlen = x["bytes"]
                break
        if rlen:
            break
    rlen = rlen or 300
    rows = ["| body N | D: bytes copied nginx↔engine | B/C: bytes moved nginx↔app (socket, both ways) | "
            "B/C: user-space copies of the body in the app before parsing |", "|---|---|---|---|"]
    for wl, n in sizes.items():
        if not n:
            continue
        d = n + 2 * rlen
        b = 2 * n + 2 * rlen
        rows.append(f"| {wl} ({n:,} B) | {d:,} (N into the slot + R out of the ring ×2 sides) + 48 B doorbell | "
                    f"{2 * (n + rlen):,} + headers (N and R each cross the kernel twice: write + read) | "
                    f"≥ {n:,} (receive buffer → bytes object) |")
        del d, b
    return "\n".join(rows), rlen


def tiny_table(res: dict) -> str:
    tiny = res.get("tiny") or []
    if not tiny:
        return "(not run)"
    out = ["| variant | stream | c | req/s | tokens/s | tokens/req | TTFT p50 ms | TTFT p99 ms | latency p50 ms | "
           "latency p99 ms | decode tok/s per stream (p50) | errors |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["variant"], r["stream"], r["conc"]) for r in tiny}, key=lambda k: (k[1], k[2], k[0]))
    for v, s, c in keys:
        rows = [r for r in tiny if (r["variant"], r["stream"], r["conc"]) == (v, s, c)]

        def m(k: str, nd: int = 1, rows: list = rows) -> str:
            vals = [r[k] for r in rows if r.get(k) is not None]
            return _fmt(statistics.fmean(vals), nd) if vals else "–"
        out.append(f"| {NAMES.get(v, v)} | {'yes' if s else 'no'} | {c} | {m('req_per_s')} | {m('tokens_per_s', 0)} | "
                   f"{m('tokens_per_req')} | {m('ttft_p50_ms', 2)} | {m('ttft_p99_ms', 2)} | "
                   f"{m('latency_p50_ms', 2)} | "
                   f"{m('latency_p99_ms', 2)} | {m('decode_tps_p50', 0)} | {sum(r['errors'] for r in rows)} |")
    return "\n".join(out)


def profile_section(res: dict) -> str:
    prof = res.get("profile")
    if not prof:
        return "(not run)"
    if "skipped" in prof:
        return prof["skipped"]
    out = [f"Profiled with `Cache-Control: no-cache, no-store` (the engine's own path: hits are answered by "
           f"nginx's L1){'; ' + res['profile_note'] if res.get('profile_note') else ''}.\n"]
    for wl, p in prof.items():
        if "error" in p:
            out.append(f"- {wl}: py-spy failed: {p['error']}")
            continue
        out.append(f"**{wl} body, c={p['conc']}** ({p['samples']} samples, all engine threads; idle event-loop "
                   f"time shows up as `select`/`poll`):\n")
        out.append("| self % | function |\n|---|---|")
        out.extend(f"| {pct} | `{f}` |" for f, pct in p["self"])
        out.append("\n| inclusive % | function |\n|---|---|")
        out.extend(f"| {pct} | `{f}` |" for f, pct in p["inclusive"])
        out.append("")
    return "\n".join(out)
