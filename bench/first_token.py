"""A lone request's first token, and the chunk gaps at c streams: ZCCP's hf backend against
the peer (`transformers serve --continuous-batching`) on the medium checkpoint, with a client
that timestamps every streamed chunk.

    PYTHONPATH=engine .venv/bin/python -m bench.first_token [--requests 20] [--rounds 2]
        [--conc 1] [--seconds 30] [--base-engine /path/to/other/tree/engine] [--step-tokens 64,32]
        [--out bench/first_token]

The checkpoint: bench.peer's (tests/support/hf_checkpoint.py at hidden 512, 6 layers, MLP 1376,
float32), made here; one torch thread for every server (OMP_NUM_THREADS=1, model.threads 1).
Variants, all up at once, their cells alternated (the order reversed every round):

- D: this tree's ZCCP (nginx + engine, cache off), model.backend hf;
- D-base (with --base-engine): the same stack running another tree's engine package;
- D-stN (with --step-tokens N,...): this tree with model.step_tokens N (the per-step token budget);
- P: `transformers serve --continuous-batching --device cpu` (bench.peer.start_peer).

c = 1 (the default): --requests requests per variant per round, one at a time, each a distinct
prompt of --prompt-tokens tokens with the chat template ("Request n:" and random words),
streamed, temperature 0, max_tokens --max-tokens, `Cache-Control: no-cache, no-store`.
c > 1: c streams send such requests back to back for --seconds (ZCCP with `ignore_eos`).

Every content chunk is timestamped. The first GENERATED token: the first chunk past an echo of
the prompt (a server that streams the prompt back first has its echo skipped: the longest
prefix of the streamed text that is the prompt's text). TTFT = request sent -> that chunk; a
gap = between two consecutive generated chunks of one answer. For ZCCP the engine's own
histograms (/metrics: TTFT, queue wait, prefill) are read before and after each cell: their
means say where the time before the first token goes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.chunked_prefill import pct
from bench.models import WORDS
from bench.peer import SHAPE, build, start_peer
from tests.support.hf_checkpoint import HF_MODEL
from tests.support.harness import Stack
from zccp.ops.stack import engine_service, nginx_service

NO_CACHE = {"Cache-Control": "no-cache, no-store"}
HISTS = ("gen_ai_server_time_to_first_token_seconds", "zccp_engine_queue_wait_seconds",
         "zccp_engine_prefill_seconds")


# --- prompts ---------------------------------------------------------------------------------

class Prompts:
    """Distinct prompts of about `tokens` tokens once the chat template is applied."""

    def __init__(self, ckpt: Path, tokens: int, seed: int) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
        self.tokens = tokens
        self.rng = random.Random(seed)
        self.n = 0
        self.template = self.length("")          # the template's own tokens, counted once

    def length(self, text: str) -> int:
        ids = self.tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=True)
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def next(self) -> str:
        """The words counted by the tokenizer alone (fast), beside the template's tokens."""
        self.n += 1
        words = [f"Request {self.n}:"]
        while self.template + len(self.tok.encode(" ".join(words), add_special_tokens=False)) < self.tokens:
            words.append(self.rng.choice(WORDS))
        return " ".join(words)


# --- the client ------------------------------------------------------------------------------

def echo_length(text: str, prompt: str) -> int:
    """How much of `text` is an echo of the prompt: its longest prefix that is a prefix of the
    prompt (0 unless it is at least 8 characters: a generated answer may start like it)."""
    n = 0
    for a, b in zip(text, prompt, strict=False):
        if a != b:
            break
        n += 1
    return n if n >= 8 else 0


def generated(chunks: list[tuple[float, str]], prompt: str) -> list[float]:
    """The times of the chunks that carry generated text (past the echo, if any)."""
    echo = echo_length("".join(t for _, t in chunks), prompt)
    out, pos = [], 0
    for t, text in chunks:
        pos += len(text)
        if pos > echo:
            out.append(t)
    return out


async def timed(client: httpx.AsyncClient, url: str, body: dict, prompt: str) -> dict[str, Any]:
    """One streamed request: every content chunk's time since the request was sent."""
    chunks: list[tuple[float, str]] = []
    usage: dict[str, Any] = {}
    t0 = time.perf_counter()
    async with client.stream("POST", url, json=body, headers=NO_CACHE) as r:
        if r.status_code != 200:
            await r.aread()
            raise RuntimeError(f"{r.status_code}: {r.text[:200]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            ev = json.loads(line[6:])
            usage = ev.get("usage") or usage
            for c in ev.get("choices") or ():
                text = (c.get("delta") or {}).get("content")
                if text:
                    chunks.append((time.perf_counter() - t0, text))
    times = generated(chunks, prompt)
    return {"ttft": times[0] if times else None, "first_chunk": chunks[0][0] if chunks else None,
            "gaps": [b - a for a, b in zip(times, times[1:], strict=False)], "echoed": len(chunks) - len(times),
            "completion_tokens": usage.get("completion_tokens"), "prompt_tokens": usage.get("prompt_tokens")}


def request_body(model: str, text: str, max_tokens: int, ignore_eos: bool) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True
    return body


async def cell(v: dict, prompts: Prompts, a: argparse.Namespace) -> dict[str, Any]:
    """One variant's share of a round: --requests lone requests (c = 1), or c streams for --seconds."""
    rows: list[dict[str, Any]] = []
    errors = 0
    end = time.perf_counter() + a.seconds
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=a.conc)) as client:
        async def stream(_: int) -> None:
            nonlocal errors
            n = 0
            while (n < a.requests) if a.conc == 1 else (time.perf_counter() < end):
                n += 1
                text = prompts.next()
                body = request_body(v["model"], text, a.max_tokens, v["ignore_eos"] and a.conc > 1)
                try:
                    rows.append(await timed(client, v["url"], body, text))
                except (httpx.HTTPError, RuntimeError) as exc:
                    errors += 1
                    print(f"  {v['name']}: {exc}", flush=True)

        t0 = time.perf_counter()
        await asyncio.gather(*(stream(i) for i in range(a.conc)))
        wall = time.perf_counter() - t0
    ttft = [r["ttft"] for r in rows if r["ttft"] is not None]
    gaps = [g for r in rows for g in r["gaps"]]
    tokens = sum(r["completion_tokens"] or 0 for r in rows)
    ms = 1000.0
    return {"requests": len(rows), "errors": errors, "echoed_chunks": sum(r["echoed"] for r in rows),
            "prompt_tokens": statistics.median([r["prompt_tokens"] or 0 for r in rows]) if rows else None,
            "tokens_per_s": round(tokens / wall, 1),
            "ttft_p50_ms": round((pct(ttft, 50) or 0) * ms, 1), "ttft_p99_ms": round((pct(ttft, 99) or 0) * ms, 1),
            "ttft_min_ms": round(min(ttft, default=0) * ms, 1),
            "first_chunk_p50_ms": round((pct([r["first_chunk"] for r in rows if r["first_chunk"]], 50) or 0) * ms, 1),
            "gap_p50_ms": round((pct(gaps, 50) or 0) * ms, 2), "gap_p99_ms": round((pct(gaps, 99) or 0) * ms, 2),
            "gap_max_ms": round((pct(gaps, 100) or 0) * ms, 2)}


# --- the engine's own histograms -------------------------------------------------------------

def histograms(stack: Stack) -> dict[str, tuple[float, float]]:
    """(sum, count) of each of HISTS on the engine's /metrics."""
    with stack.admin_client(timeout=10) as c:
        text = c.get("/metrics").text
    out: dict[str, tuple[float, float]] = {}
    for name in HISTS:
        s = re.search(rf"^{name}_sum{{[^}}]*}} (\S+)", text, re.M)
        n = re.search(rf"^{name}_count{{[^}}]*}} (\S+)", text, re.M)
        out[name] = (float(s.group(1)) if s else 0.0, float(n.group(1)) if n else 0.0)
    return out


def engine_means(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Each histogram's mean over the cell, in ms."""
    out = {}
    for name in HISTS:
        ds, dn = after[name][0] - before[name][0], after[name][1] - before[name][1]
        out[name.removeprefix("zccp_engine_").removeprefix("gen_ai_server_") + "_mean_ms"] = \
            round(ds / dn * 1000, 2) if dn else None
    return out


# --- the variants ----------------------------------------------------------------------------

def start_zccp(run_dir: Path, ckpt: Path, engine_tree: str | None, overrides: dict,
               model_extra: dict | None = None) -> Stack:
    """This tree's stack (nginx + engine, cache off, one torch thread); the engine package from
    `engine_tree` when given; model_extra: more of the model section (model.step_tokens)."""
    model = {"backend": "hf", "path": str(ckpt), "name": HF_MODEL, "max_context": 8192, "threads": 1,
             **(model_extra or {})}
    stack = Stack(run_dir, overrides={"model": model, "logging": {"level": "warning"},
                                      "limits": {"max_body_kb": 512, "request_timeout_ms": 120000},
                                      "shared_memory": {"segment_count": 32}, **overrides})
    env = {"OMP_NUM_THREADS": "1", **({"PYTHONPATH": engine_tree} if engine_tree else {})}
    stack.engine = engine_service(stack.config_path, stack.cfg, stack.run_dir, env)
    stack.nginx, _ = nginx_service(stack.cfg, stack.run_dir)
    stack.wait_healthy(60)
    return stack


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conc", type=int, default=1)
    ap.add_argument("--requests", type=int, default=10, help="per variant per round (c = 1)")
    ap.add_argument("--seconds", type=float, default=30, help="per variant per round (c > 1)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--variants", default="D,P")
    ap.add_argument("--base-engine", default=None, help="another tree's engine/ for D-base")
    ap.add_argument("--step-tokens", default="", help="comma-separated model.step_tokens values: a D-stN "
                                                       "variant each (this tree, that per-step token budget)")
    ap.add_argument("--out", default=str(Path(__file__).with_suffix("")))
    a = ap.parse_args(argv)
    steps = {f"D-st{n}": int(n) for n in a.step_tokens.split(",") if n}
    names = a.variants.split(",") + (["D-base"] if a.base_engine else []) + list(steps)
    runs: list[dict[str, Any]] = []
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="zccp-first-") as tmp, contextlib.ExitStack() as stack:
        run = Path(tmp)
        ckpt = build(run / "ckpt")
        prompts = Prompts(ckpt, a.prompt_tokens, 47)
        vs: dict[str, dict] = {}
        for name in names:
            if name == "P":
                proc, url = start_peer(ckpt, 1, run / "serve.log")
                stack.callback(lambda p=proc: (p.terminate(), p.wait(20)))
                vs[name] = {"name": name, "url": url + "/v1/chat/completions", "model": str(ckpt),
                            "ignore_eos": False, "stack": None}
            else:
                s = start_zccp(run / name, ckpt, a.base_engine if name == "D-base" else None, {},
                               {"step_tokens": steps[name]} if name in steps else None)
                stack.callback(s.stop)
                vs[name] = {"name": name, "url": s.base_url + "/v1/chat/completions", "model": HF_MODEL,
                            "ignore_eos": True, "stack": s}
        for v in vs.values():                                   # warm-up: first forwards, allocations
            asyncio.run(cell(v, prompts, argparse.Namespace(**{**vars(a), "requests": 3, "conc": 1})))
        for rnd in range(a.rounds):
            for name in names if rnd % 2 == 0 else names[::-1]:
                v = vs[name]
                before = histograms(v["stack"]) if v["stack"] else None
                r = {"variant": name, "round": rnd, "conc": a.conc, **asyncio.run(cell(v, prompts, a)),
                     "loadavg": os.getloadavg()[0]}
                if before is not None:
                    r.update(engine_means(before, histograms(v["stack"])))
                print(json.dumps(r), flush=True)
                runs.append(r)
    rows = []
    for name in names:
        mine = [r for r in runs if r["variant"] == name]
        rows.append({"variant": name, **{k: statistics.median(r[k] for r in mine)
                                         for k in mine[0] if k.endswith("_ms") and mine[0][k] is not None
                                         or k == "tokens_per_s"}})
    meta = {"args": vars(a), "shape": SHAPE, "loadavg_start": load0, "loadavg_end": os.getloadavg(),
            "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
    Path(a.out + ".json").write_text(json.dumps({"meta": meta, "runs": runs, "median": rows}, indent=1) + "\n")
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
