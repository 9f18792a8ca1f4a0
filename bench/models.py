"""Real models behind ZCCP: batched decoding and prefix reuse, against the alternatives.

    python -m bench.models            # ~15 min on 2 cores -> bench/models_results.json, then
                                      # bench/RESULTS.md (its model section) and models.png
    python -m bench.models --quick    # smoke run

1. Streaming time to first token and tokens/s at several concurrencies, one session:
   - tiny (the built-in model): D = ZCCP with the batch scheduler (this tree); D-rr = ZCCP at
     ROUND_ROBIN_REF, the last commit with the round-robin model thread (exported with
     `git archive` and run from a temporary directory); B = nginx -> FastAPI/uvicorn.
   - hf: a checkpoint built with tests/support/hf_checkpoint.py (Llama, hidden 512, 4 layers, random
     weights, byte-level BPE); D at model.threads 1 and 2, and at 1 without the prefix cache
     (every request repeats one body, so with it D prefills only the last block); B the
     same backend behind FastAPI,
     one generate() per request in uvicorn's thread pool (what a FastAPI app around a model
     does), 2 workers x 1 torch thread.
   Client: bench/ttft.py (httpx asyncio), c connections for --duration s each.
2. Prefix reuse: the third turn of a conversation whose system prompt is ~2,000 tokens, on
   the hf backend, with the prefix cache on and off (model.prefix_cache_mb 0); each trial
   a new system prompt, so the first turn is always cold; TTFT of turn 3 and the prompt
   tokens the engine reused (usage.cache_read_input_tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench import ttft
from bench.bodies import synthetic_body
from bench.run import LIMITS, commit_info, log, machine_info
from bench.services import REPO, start_b, start_d

ROUND_ROBIN_REF = "56ec494"        # the last commit whose model thread interleaved requests round-robin
TINY = dict(LIMITS, backend="tiny", model_name="zccp-tiny", max_context=8192,
            segment_size_kb=1024, tokens_kb=256, max_body_kb=512)
HF_SHAPE = dict(hidden=512, layers=4, heads=8, kv_heads=4, intermediate=1376)


def hf_limits(path: Path, threads: int, **extra: object) -> dict:
    return dict(LIMITS, backend="hf", model_name="zccp-hf-bench", max_context=8192, segment_size_kb=1024,
                tokens_kb=256, max_body_kb=512, threads=threads, model_extra={"path": str(path), **extra})


def build_hf(out: Path) -> Path:
    from tests.support.hf_checkpoint import build_checkpoint

    return build_checkpoint(out, **HF_SHAPE)


# --- 1. throughput and TTFT ------------------------------------------------------------

def measure_variant(v, body: bytes, concs: list[int], duration: float, model: str, variant: str,
                    nocache: bool, repeats: int) -> list[dict]:
    rows = []
    extra = {"Cache-Control": "no-cache, no-store"} if nocache else None
    ttft.measure(v.url, body, True, 1, min(2.0, duration), extra)           # warm-up
    for c in concs:
        for rep in range(repeats):
            r = ttft.measure(v.url, body, True, c, duration, extra)
            r.update(model=model, variant=variant, rep=rep + 1)
            rows.append(r)
            log(f"{model} {variant} c={c}: {r['tokens_per_s']:.0f} tok/s, ttft p50 {r['ttft_p50_ms']:.0f} ms, "
                f"{r['requests']} requests, {r['errors']} errors")
    return rows


_RR_CHILD = """
import json, sys
from pathlib import Path
from bench import ttft
from bench.run import TINY
from bench.services import start_d
body, concs, duration, run_dir = sys.argv[1].encode(), json.loads(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4])
repeats = int(sys.argv[5])
v = start_d(run_dir, TINY, 64)
try:
    extra = {"Cache-Control": "no-cache, no-store"}
    ttft.measure(v.url, body, True, 1, min(2.0, duration), extra)
    rows = [dict(ttft.measure(v.url, body, True, c, duration, extra), rep=r + 1) for c in concs for r in range(repeats)]
    print("RRJSON " + json.dumps(rows), flush=True)
finally:
    v.stop()
"""


def round_robin(body: bytes, concs: list[int], duration: float, run_dir: Path, repeats: int) -> list[dict]:
    """The same tiny measurement on ROUND_ROBIN_REF's code, run from an exported tree."""
    src = Path(tempfile.mkdtemp(prefix="zccp-rr-"))
    archive = subprocess.run(["git", "archive", ROUND_ROBIN_REF], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{src / 'engine'}")
    out = subprocess.run([sys.executable, "-c", _RR_CHILD, body.decode(), json.dumps(concs), str(duration),
                          str(run_dir), str(repeats)], cwd=src, env=env, capture_output=True, text=True, timeout=3000)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RRJSON ")), None)
    if line is None:
        raise RuntimeError(f"round-robin run failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    rows = json.loads(line[7:])
    for r in rows:
        r.update(model="tiny", variant="D-rr")
        log(f"tiny D-rr c={r['conc']}: {r['tokens_per_s']:.0f} tok/s, ttft p50 {r['ttft_p50_ms']:.0f} ms")
    return rows


# --- 2. prefix reuse ---------------------------------------------------------------------

WORDS = ("prefix cache block token batch stream decode slot shared memory engine nginx request model answer "
         "system prompt context reuse chunk plan queue").split()


def _system_prompt(seed: int, tokens: int, tok) -> str:
    """Random words from WORDS until the checkpoint's tokenizer counts `tokens`."""
    import random

    rng = random.Random(seed)
    words: list[str] = []
    while len(tok.encode(" ".join(words), add_special_tokens=False)) < tokens:
        words += [rng.choice(WORDS) for _ in range(50)]
    return " ".join(words)


def _turn(client: httpx.Client, model: str, system: str | list[dict], messages: list[dict],
          max_tokens: int = 16) -> tuple[float, str, dict]:
    """One streamed turn, the model answering (no-cache): (TTFT s, the answer text, usage)."""
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True, "system": system,
            "messages": messages}
    t0 = time.perf_counter()
    first, text, usage = None, [], {}
    with client.stream("POST", "/v1/messages", json=body, headers={"Cache-Control": "no-cache, no-store"}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            ev = json.loads(line[6:])
            if ev["type"] == "message_start":
                usage = ev["message"]["usage"]
            elif ev["type"] == "content_block_delta" and ev["delta"].get("type") == "text_delta":
                first = first or time.perf_counter()
                text.append(ev["delta"]["text"])
    return (first or time.perf_counter()) - t0, "".join(text) or "ok", usage


def prefix_trials(v, trials: int, tokens: int, seed0: int, ckpt: Path) -> list[dict]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
    rows = []
    with httpx.Client(base_url=v.url, timeout=300) as client:
        for t in range(trials):
            system = _system_prompt(seed0 + t, tokens, tok)
            msgs: list[dict] = []
            for turn in range(3):
                msgs.append({"role": "user", "content": f"Question {turn + 1} of trial {t}: what does the cache keep?"})
                took, answer, usage = _turn(client, "zccp-hf-bench", system, msgs)
                msgs.append({"role": "assistant", "content": answer.strip() or "ok"})
            prompt = usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)
            rows.append({"trial": t, "ttft_s": took, "prompt_tokens": prompt,
                         "reused_tokens": usage.get("cache_read_input_tokens", 0)})
    return rows


# --- main ----------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.models")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--repeats", type=int, default=2, help="measured runs per cell, back to back")
    ap.add_argument("--concs", default="1,4,8,16,32")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--system-tokens", type=int, default=2000, help="tokens of the prefix test's system prompt")
    ap.add_argument("--out", default=str(REPO / "bench" / "models_results.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.duration, args.concs, args.trials, args.repeats = 2.0, "1,8", 2, 1
    concs = [int(c) for c in args.concs.split(",")]
    started = time.time()
    run_dir = Path(tempfile.mkdtemp(prefix="zccp-models-"))
    code = commit_info()
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()
    if git.returncode == 0:     # commit_info reads .git as a directory; a worktree's .git is a file
        code["commit"] = git.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    res: dict = {"settings": vars(args) | {"round_robin_ref": ROUND_ROBIN_REF, "hf_shape": HF_SHAPE},
                 "machine": machine_info(), "code": code, "started": started, "rows": [], "prefix": {}}
    out = Path(args.out)

    def save() -> None:
        res["took_s"] = time.time() - started
        out.write_text(json.dumps(res, indent=1))

    tiny_body = synthetic_body(1024, "zccp-tiny", max_tokens=args.max_tokens, seed=1, stream=True).encode()
    log("tiny: D (batch scheduler)")
    v = start_d(run_dir / "tiny-D", dict(TINY), 64)
    try:
        res["rows"] += measure_variant(v, tiny_body, concs, args.duration, "tiny", "D", True, args.repeats)
    finally:
        v.stop()
    save()
    log(f"tiny: D-rr ({ROUND_ROBIN_REF}, round-robin)")
    res["rows"] += round_robin(tiny_body, concs, args.duration, run_dir / "tiny-rr", args.repeats)
    save()
    log("tiny: B")
    v = start_b(run_dir / "tiny-B", TINY, 2)
    try:
        res["rows"] += measure_variant(v, tiny_body, concs, args.duration, "tiny", "B", False, args.repeats)
    finally:
        v.stop()
    save()

    ckpt = build_hf(run_dir / "hf-checkpoint")
    hf_body = synthetic_body(1024, "zccp-hf-bench", max_tokens=args.max_tokens, seed=1, stream=True).encode()
    # Every request of a run sends the same body, so with the prefix cache on (D-t1, D-t2) only its
    # last block is prefilled after the first; D-t1-noprefix measures batching alone.
    for name, threads, extra in (("D-t1", 1, {}), ("D-t2", 2, {}), ("D-t1-noprefix", 1, {"prefix_cache_mb": 0})):
        log(f"hf: {name}")
        v = start_d(run_dir / f"hf-{name}", hf_limits(ckpt, threads, **extra), 64)
        try:
            res["rows"] += measure_variant(v, hf_body, concs, args.duration, "hf", name, True, args.repeats)
        finally:
            v.stop()
        save()
    log("hf: B")
    v = start_b(run_dir / "hf-B", hf_limits(ckpt, 1), 2)
    try:
        res["rows"] += measure_variant(v, hf_body, concs, args.duration, "hf", "B", False, args.repeats)
    finally:
        v.stop()
    save()

    for name, extra in (("reuse", {}), ("no-reuse", {"prefix_cache_mb": 0})):
        log(f"prefix: {name}")
        v = start_d(run_dir / f"prefix-{name}", hf_limits(ckpt, 2, **extra), 8)
        try:
            res["prefix"][name] = prefix_trials(v, args.trials, args.system_tokens, 100, ckpt)
            ttfts = [r["ttft_s"] for r in res["prefix"][name]]
            log(f"prefix {name}: third-turn TTFT p50 {statistics.median(ttfts) * 1000:.0f} ms, "
                f"prompt {res['prefix'][name][0]['prompt_tokens']} tokens, "
                f"reused {res['prefix'][name][0]['reused_tokens']}")
        finally:
            v.stop()
        save()

    from bench import report

    report.write_models(res, out.parent)
    log(f"done in {time.time() - started:.0f} s: {out}")


if __name__ == "__main__":
    main()
