"""Serving tails under arriving prompts: the gap between two streamed chunks and the time to
first token at c streams, with a step's prefill sized from memory alone (a step budget larger
than any prompt: the behaviour before model.step_tokens, a chunk of over a thousand tokens on
a CPU) and with the per-step token budget (chunked prefill interleaved with decode).

A real stack (the tests' Stack: nginx + engine, cache off), the tiny model (or --backend hf: the
test checkpoint at --hidden/--layers). c asyncio streams send OpenAI chat requests back to back,
each a distinct prompt of --words random words, streamed, `ignore_eos` with --max-tokens, so every
answer is as long and new prompts keep arriving while the others decode. Per answer: TTFT =
request sent -> first chunk with text; gaps = between two consecutive chunks with text (what a
reader of the stream waits). The variants' stacks are up at once; their loads run
interleaved, --reps times, --seconds each; the table is the median of the reps.

    PYTHONPATH=engine python -m bench.chunked_prefill [--seconds 6] [--reps 3] [--budgets 0,128]

Writes bench/chunked_prefill.json and bench/chunked_prefill.svg (p50/p99 bars); the method
and the figures are in bench/chunked_prefill.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.harness import Stack

ONE_PASS = 1 << 20          # model.step_tokens larger than any prompt: the memory plan alone
WORDS = ("shared memory ring doorbell slot engine token prompt answer cache block chunk stream "
         "decode prefill budget model batch queue tenant window nginx worker lua socket").split()


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


async def one(client: httpx.AsyncClient, body: dict, out: dict) -> None:
    t0 = time.perf_counter()
    last = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            out["errors"] += 1
            await r.aread()
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            choices = json.loads(line[6:])["choices"]
            if not choices or not choices[0]["delta"].get("content"):
                continue
            now = time.perf_counter()
            if last is None:
                out["ttft"].append(now - t0)
            else:
                out["gaps"].append(now - last)
            last = now
            out["chunks"] += 1
    if last is None:
        out["errors"] += 1


async def load(base_url: str, model: str, conc: int, seconds: float, words: int, max_tokens: int,
               seed: int) -> dict[str, Any]:
    out: dict[str, Any] = {"ttft": [], "gaps": [], "chunks": 0, "errors": 0}
    rng = random.Random(seed)
    end = time.perf_counter() + seconds

    async def stream(i: int) -> None:
        n = 0
        async with httpx.AsyncClient(base_url=base_url, timeout=120,
                                     headers={"cache-control": "no-cache, no-store"}) as c:
            while time.perf_counter() < end:
                text = f"Request {seed}.{i}.{n}: " + " ".join(rng.choice(WORDS) for _ in range(words))
                n += 1
                await one(c, {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                              "ignore_eos": True, "messages": [{"role": "user", "content": text}]}, out)

    t0 = time.perf_counter()
    await asyncio.gather(*(stream(i) for i in range(conc)))
    out["wall_s"] = time.perf_counter() - t0
    return out


def summary(raw: dict[str, Any]) -> dict[str, Any]:
    ms = 1000.0
    return {"requests": len(raw["ttft"]), "errors": raw["errors"],
            "tokens_per_s": round(raw["chunks"] / raw["wall_s"], 1),
            **{f"gap_{k}_ms": round((pct(raw["gaps"], q) or 0) * ms, 2)
               for k, q in (("p50", 50), ("p99", 99), ("max", 100))},
            **{f"ttft_{k}_ms": round((pct(raw["ttft"], q) or 0) * ms, 1) for k, q in (("p50", 50), ("p99", 99))}}


def model_config(a: argparse.Namespace, budget: int) -> dict[str, Any]:
    m: dict[str, Any] = {"step_tokens": budget, "max_context": 4096, "threads": a.threads}
    if a.backend == "hf":
        from tests.support.hf_checkpoint import HF_MODEL, build_checkpoint
        ckpt = Path(tempfile.gettempdir()) / f"zccp-bench-ckpt-{a.hidden}x{a.layers}"
        if not (ckpt / "config.json").exists():
            build_checkpoint(ckpt, hidden=a.hidden, layers=a.layers, heads=8, kv_heads=4)
        m |= {"backend": "hf", "path": str(ckpt), "name": HF_MODEL}
    return m


def start(a: argparse.Namespace, budget: int, run_dir: Path) -> tuple[Stack, str]:
    m = model_config(a, budget)
    stack = Stack(run_dir, overrides={"model": m, "logging": {"level": "warning"},
                                      "limits": {"request_timeout_ms": 120000}})
    stack.start()
    name = m.get("name", "zccp-tiny")
    asyncio.run(load(stack.base_url, name, 2, 1.0, a.words, 8, 1000 + budget % 1000))       # warm
    return stack, name


def label(budget: int) -> str:
    return "memory chunk (before)" if budget == ONE_PASS else f"step_tokens {budget or 'default'}"


def svg(rows: list[dict[str, Any]], path: Path) -> None:
    """p50 and p99 of the chunk gap and of TTFT per variant, as grouped bars (no plotting
    library in the environment: a few SVG rectangles)."""
    panels = [("chunk gap (ms)", "gap"), ("TTFT (ms)", "ttft")]
    colors = ["#999999", "#55a868", "#4c72b0", "#dd8452"]
    w, h, pad = 360, 240, 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w * 2}" height="{h + 60}" font-family="sans-serif" '
             f'font-size="11">']
    for p, (title, key) in enumerate(panels):
        x0 = p * w
        top = max(r[f"{key}_p99_ms"] for r in rows) or 1
        parts.append(f'<text x="{x0 + w / 2}" y="16" text-anchor="middle" font-size="13">{title}</text>')
        for q, stat in enumerate(("p50", "p99")):
            gx = x0 + pad + q * (w - pad) / 2
            parts.append(f'<text x="{gx + (w - pad) / 4 - 10}" y="{h + 35}" text-anchor="middle">{stat}</text>')
            bw = (w - pad) / 2 / (len(rows) + 1)
            for i, r in enumerate(rows):
                v = r[f"{key}_{stat}_ms"]
                bh = (h - 30) * v / top
                x, y = gx + i * bw, h + 20 - bh
                parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw - 2:.1f}" height="{bh:.1f}" '
                             f'fill="{colors[i % len(colors)]}"/>')
                parts.append(f'<text x="{x + bw / 2 - 1:.1f}" y="{y - 3:.1f}" text-anchor="middle" '
                             f'font-size="9">{v:g}</text>')
    for i, r in enumerate(rows):
        parts.append(f'<rect x="{10 + i * 170}" y="{h + 45}" width="10" height="10" fill="{colors[i % len(colors)]}"/>'
                     f'<text x="{24 + i * 170}" y="{h + 54}">{r["variant"]}</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["tiny", "hf"], default="tiny")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--conc", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--words", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--budgets", default="0", help="step_tokens values beside one pass (0: the default)")
    ap.add_argument("--out", default=str(Path(__file__).with_suffix("")))
    a = ap.parse_args(argv)
    budgets = [ONE_PASS, *(int(b) for b in a.budgets.split(","))]
    runs: list[dict[str, Any]] = []
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="zccp-chunked-") as d:
        stacks: dict[int, tuple[Stack, str]] = {}
        try:
            for budget in budgets:          # all up at once; the idle ones cost nothing
                stacks[budget] = start(a, budget, Path(d) / f"b{budget}")
            for rep in range(a.reps):
                for budget in budgets if rep % 2 == 0 else budgets[::-1]:
                    stack, name = stacks[budget]
                    raw = asyncio.run(load(stack.base_url, name, a.conc, a.seconds, a.words, a.max_tokens, rep))
                    r = {"variant": label(budget), "step_tokens": budget, "rep": rep, **summary(raw)}
                    print(json.dumps(r), flush=True)
                    runs.append(r)
        finally:
            for stack, _ in stacks.values():
                stack.stop()
    rows = []
    for budget in budgets:
        mine = [r for r in runs if r["step_tokens"] == budget]
        rows.append({"variant": label(budget), **{k: round(statistics.median(r[k] for r in mine), 2)
                                                  for k in mine[0] if k.endswith("_ms") or k == "tokens_per_s"}})
    meta = {"args": vars(a), "loadavg_start": load0, "loadavg_end": os.getloadavg()[0],
            "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
    Path(a.out + ".json").write_text(json.dumps({"meta": meta, "runs": runs, "median": rows}, indent=1) + "\n")
    svg(rows, Path(a.out + ".svg"))
    print("| variant | tok/s | gap p50 ms | gap p99 ms | gap max ms | TTFT p50 ms | TTFT p99 ms |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['tokens_per_s']} | {r['gap_p50_ms']} | {r['gap_p99_ms']} | {r['gap_max_ms']} "
              f"| {r['ttft_p50_ms']} | {r['ttft_p99_ms']} |")
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
