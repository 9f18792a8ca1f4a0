"""ZCCP's hf backend against a peer: Hugging Face's own server (`transformers serve
--continuous-batching`) and the FastAPI baseline (B), on one medium checkpoint, the same
machine, the same client; then the prompt-caching (cache_control) second-call TTFT.

    PYTHONPATH=engine .venv/bin/python -m bench.peer [--per-stream 2] [--concs 1,8,16] [--threads 1] [--reps 2]
        -> bench/peer.json (bench/peer.md and bench/RESULTS.md are written by hand from it)

1. Throughput and TTFT. The checkpoint: tests/support/hf_checkpoint.py at hidden 512, 6 layers
   (8 heads, 4 KV heads, MLP 1376, byte-level BPE of 600 ids, random weights, float32), made here.
   - P: `transformers serve --continuous-batching --device cpu <checkpoint>` (its own uvicorn,
     paged attention), OMP_NUM_THREADS = --threads; OpenAI chat completions, streamed.
   - D: ZCCP (nginx + engine + Redis, model.backend hf, model.threads = --threads); the same
     OpenAI requests (stream_options.include_usage), Cache-Control: no-cache, no-store.
   - B: the same hf backend behind FastAPI/uvicorn (bench/apps/fastapi_app.py, one generate()
     per request in the thread pool, 2 workers x 1 torch thread) behind nginx; it speaks the
     Messages API only, so it gets the same prompts as Anthropic requests.
   All three are up at once and the cells interleave (repetition, concurrency, variant), --reps
   times. Client: httpx asyncio, c concurrent streams of --per-stream requests each (at least 8
   requests per cell), back to back, every request a distinct
   prompt (a counter and random words: no shared prefix beyond the chat template's first
   tokens), max_tokens 32, temperature 0. TTFT = request sent -> first chunk with text;
   tokens/s = completion tokens of the finished requests (the usage each server reports) /
   wall time.
2. cache_control: on D, a ~2,000-token system prompt marked with cache_control, a new one per
   trial; call 1 (cold) and call 2 (same system, another question), streamed, TTFT of each and
   the usage fields of each.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.models import WORDS, _system_prompt, _turn, hf_limits
from bench.run import commit_info, log, machine_info
from bench.services import start_b, start_d
from zccp.ops.stack import free_port

SHAPE = dict(hidden=512, layers=6, heads=8, kv_heads=4, intermediate=1376)
MAX_TOKENS = 32
OUT = Path(__file__).resolve().parent / "peer.json"


def build(out: Path) -> Path:
    from tests.support.hf_checkpoint import build_checkpoint

    return build_checkpoint(out, **SHAPE)


# --- the client ----------------------------------------------------------------------------

def _prompt(rng: random.Random, n: int) -> str:
    return f"Request {n}: " + " ".join(rng.choice(WORDS) for _ in range(40))


def _body(api: str, model: str, text: str) -> dict:
    msgs = [{"role": "user", "content": text}]
    if api == "openai":
        return {"model": model, "messages": msgs, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
    return {"model": model, "messages": msgs, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}


async def _one(client: httpx.AsyncClient, api: str, url: str, body: dict) -> tuple[float | None, int]:
    """(TTFT s or None, completion tokens) of one streamed request."""
    t0 = time.perf_counter()
    first, tokens = None, 0
    headers = {"Cache-Control": "no-cache, no-store"}
    async with client.stream("POST", url, json=body, headers=headers) as r:
        if r.status_code != 200:
            await r.aread()
            raise RuntimeError(f"{r.status_code}: {r.text[:200]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if api == "openai":
                if first is None and any((c.get("delta") or {}).get("content") for c in ev.get("choices") or ()):
                    first = time.perf_counter()
                if ev.get("usage"):
                    tokens = ev["usage"]["completion_tokens"]
            else:
                if first is None and ev["type"] == "content_block_delta":
                    first = time.perf_counter()
                elif ev["type"] == "message_delta":
                    tokens = ev["usage"]["output_tokens"]
    return (None if first is None else first - t0), tokens


async def _load(api: str, url: str, model: str, conc: int, per_stream: int, seed: int) -> dict:
    """conc streams, each sending per_stream requests back to back (a fixed amount of work,
    so a slow server is measured on whole requests, not on the few that end in a window)."""
    rng = random.Random(seed)
    counter = iter(range(10**9))
    ttfts: list[float] = []
    out = {"tokens": 0, "requests": 0, "errors": 0, "no_text": 0}
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t0 = time.perf_counter()

        async def worker() -> None:
            for _ in range(per_stream):
                body = _body(api, model, _prompt(rng, next(counter)))
                try:
                    ttft, tokens = await _one(client, api, url, body)
                except (httpx.HTTPError, RuntimeError) as exc:
                    out["errors"] += 1
                    log(f"  error: {exc}")
                    continue
                out["requests"] += 1
                out["tokens"] += tokens
                if ttft is None:
                    out["no_text"] += 1
                else:
                    ttfts.append(ttft)

        await asyncio.gather(*(worker() for _ in range(conc)))
        wall = time.perf_counter() - t0
    return {"conc": conc, "per_stream": per_stream, "wall_s": wall, **out, "tokens_per_s": out["tokens"] / wall,
            "ttft_p50_ms": statistics.median(ttfts) * 1000 if ttfts else None,
            "ttft_p90_ms": statistics.quantiles(ttfts, n=10)[-1] * 1000 if len(ttfts) >= 10 else None}


def per_stream(conc: int, base: int) -> int:
    """Requests each stream sends: more at low concurrency, so every cell has >= 8 requests."""
    return max(base, -(-8 // conc))


def measure(name: str, api: str, url: str, model: str, conc: int, base: int, rep: int) -> dict:
    r = asyncio.run(_load(api, url, model, conc, per_stream(conc, base), 1000 * rep + conc))
    r.update(variant=name, rep=rep)
    log(f"{name} c={conc} rep {rep}: {r['tokens_per_s']:.1f} tok/s, ttft p50 {r['ttft_p50_ms'] or 0:.0f} ms, "
        f"{r['requests']} requests in {r['wall_s']:.1f} s, {r['errors']} errors")
    return r


# --- the variants ----------------------------------------------------------------------------

def start_peer(ckpt: Path, threads: int, log_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [str(Path(sys.executable).parent / "transformers"), "serve", "--continuous-batching", "--device", "cpu",
           "--host", "127.0.0.1", "--port", str(port), str(ckpt)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    proc = subprocess.Popen(cmd, stdout=log_path.open("wb"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 120
    while time.monotonic() < end:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"transformers serve exited: {log_path.read_text()[-2000:]}")
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("transformers serve did not come up")


def cache_control_trials(url: str, model: str, ckpt: Path, trials: int, tokens: int) -> list[dict]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
    rows = []
    with httpx.Client(base_url=url, timeout=300) as client:
        for t in range(trials):
            system = [{"type": "text", "text": _system_prompt(7000 + t, tokens, tok),
                       "cache_control": {"type": "ephemeral"}}]
            row: dict = {"trial": t}
            for call, question in enumerate(("What does the pipeline keep?", "Which block is pinned?")):
                ttft, _, usage = _turn(client, model, system, [{"role": "user", "content": question}], max_tokens=8)
                row[f"ttft_{call + 1}_ms"] = ttft * 1000
                row[f"usage_{call + 1}"] = usage
            row["speedup"] = row["ttft_1_ms"] / row["ttft_2_ms"]
            log(f"cache_control trial {t}: {row['ttft_1_ms']:.0f} ms -> {row['ttft_2_ms']:.0f} ms "
                f"({row['speedup']:.1f}x); call 1 {row['usage_1']}, call 2 {row['usage_2']}")
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.peer")
    ap.add_argument("--per-stream", type=int, default=2)
    ap.add_argument("--concs", default="1,8,16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variants", default="D,P,B")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--cc-trials", type=int, default=3)
    args = ap.parse_args(argv)
    concs = [int(c) for c in args.concs.split(",")]
    t_start = time.time()
    results: dict = {"commit": commit_info(), "machine": machine_info(), "shape": SHAPE, "max_tokens": MAX_TOKENS,
                     "per_stream": args.per_stream, "threads": args.threads, "rows": []}
    names = args.variants.split(",")
    with tempfile.TemporaryDirectory(prefix="zccp-peer-") as tmp, contextlib.ExitStack() as stack:
        run = Path(tmp)
        ckpt = build(run / "ckpt")
        lim = hf_limits(ckpt, args.threads)
        # every variant up at once; the cells interleave (rep, c, variant) so load drift on this
        # shared machine spreads over all of them
        targets: dict[str, tuple[str, str, str]] = {}
        if "P" in names:
            proc, url = start_peer(ckpt, args.threads, run / "serve.log")
            stack.callback(lambda: (proc.terminate(), proc.wait(20)))
            targets["P"] = ("openai", url + "/v1/chat/completions", str(ckpt))
        if "D" in names:
            d = start_d(run / "d", lim, 32)
            stack.callback(d.stop)
            targets["D"] = ("openai", d.url + "/v1/chat/completions", "zccp-hf-bench")
        if "B" in names:
            b = start_b(run / "b", dict(lim, threads=1), 2)
            stack.callback(b.stop)
            targets["B"] = ("anthropic", b.url + "/v1/messages", "zccp-hf-bench")
        for name in names:
            asyncio.run(_load(*targets[name], 2, 1, 999))                 # warm-up: allocations, first forward
        for rep in range(1, args.reps + 1):
            for c in concs:
                for name in names:
                    results["rows"].append(measure(name, *targets[name], c, args.per_stream, rep))
                    OUT.write_text(json.dumps(results, indent=1))
        if "D" in names and args.cc_trials:
            results["cache_control"] = cache_control_trials(d.url, "zccp-hf-bench", ckpt, args.cc_trials, 2000)
    results["total_s"] = time.time() - t_start
    OUT.write_text(json.dumps(results, indent=1))
    log(f"done in {results['total_s']:.0f} s -> {OUT}")


if __name__ == "__main__":
    main()
