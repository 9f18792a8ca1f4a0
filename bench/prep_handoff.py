"""Prep processes beside a model (issue 47 item 2, zccp.process.handoff): the tiny model's
engine with 1 process (T1) and with 2 (T2: a prep process that hands its misses to the
model's process), nginx's L1 off so that every hit reaches the engine. Rounds interleaved,
T1 and T2 seconds apart; each figure the median over rounds.

  misses      wrk c=16, one 1 KiB body, cache bypassed, 8 tokens, not streamed: req/s, p99, the
              engine's processes' CPU (cores)
  hits        wrk c=16 over 32 stored bodies (exact hits): req/s, p99, engine cores
  hits+decode the same hits while 4 streams decode 400 tokens each (ignore_eos, an httpx client
              in a thread): hits/s, hit p99, and the streams' tokens/s
  stream c=1  one stream of 256 tokens (httpx): tokens/s, the gap between two chunks p50/p99
  stream c=8  eight at once: tokens/s in all, chunk gap p50/p99

    python -m bench.prep_handoff [--seconds 5] [--rounds 3] [--json bench/prep_handoff.json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.bodies import synthetic_body
from bench.run import TINY, log, measured_run
from bench.services import Variant, start_d

NO_CACHE = {"cache-control": "no-store, no-cache"}
_ids = itertools.count()


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def _body(text: str, max_tokens: int, stream: bool = False, ignore_eos: bool = False) -> dict:
    b = {"model": TINY["model_name"], "max_tokens": max_tokens, "temperature": 0, "stream": stream,
         "messages": [{"role": "user", "content": text}]}
    if ignore_eos:
        b["ignore_eos"] = True
    return b


async def _post(c: httpx.AsyncClient, body: dict, headers: dict | None = None) -> float:
    t0 = time.perf_counter()
    r = await c.post("/v1/chat/completions", json=body, headers=headers or {})
    if r.status_code != 200:
        raise RuntimeError(f"{r.status_code}: {r.text[:200]}")
    return time.perf_counter() - t0


async def _stream(c: httpx.AsyncClient, body: dict, gaps: list[float]) -> int:
    """One stream; the gaps between its content chunks into gaps; its tokens."""
    last, n = None, 0
    async with c.stream("POST", "/v1/chat/completions", json=body, headers=NO_CACHE) as r:
        if r.status_code != 200:
            raise RuntimeError(f"stream {r.status_code}")
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"content"' in line:
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                last, n = now, n + 1
    return n


def _wrk_row(v: Variant, body_file: Path, seconds: float, nocache: bool) -> dict:
    r = measured_run(v, body_file, 16, seconds, nocache=nocache)
    if r["errors"]:
        raise RuntimeError(f"{r['errors']} errors {r['statuses']}: {r['wrk_tail']}")
    engine = r["procs"].get("engine", {})
    return {"rps": r["rps"], "p99_ms": r["p99_ms"], "engine_cores": engine.get("cpu_util", 0.0),
            "other_cores": r["other_cores"]}


def _store(url: str, body_file: Path) -> None:
    with httpx.Client(base_url=url, timeout=60) as c:
        for line in body_file.read_text().splitlines():
            r = c.post("/v1/messages", content=line, headers={"content-type": "application/json"})
            if r.status_code != 200:
                raise RuntimeError(f"{r.status_code}: {r.text[:200]}")
    time.sleep(0.3)


def _decoders(url: str, end: float, streams: int, tokens: list[int]) -> None:
    async def decoder(c: httpx.AsyncClient) -> None:
        while time.perf_counter() < end:
            tokens[0] += await _stream(c, _body(f"long {next(_ids)}", 400, True, True), [])

    async def run() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            await asyncio.gather(*(decoder(c) for _ in range(streams)))

    asyncio.run(run())


def hits_beside_decode(v: Variant, body_file: Path, seconds: float, streams: int = 4) -> dict:
    tokens = [0]
    t0 = time.perf_counter()
    th = threading.Thread(target=_decoders, args=(v.url, t0 + seconds + 0.5, streams, tokens))
    th.start()
    time.sleep(0.5)                          # the streams are decoding before the hits start
    row = _wrk_row(v, body_file, seconds, False)
    th.join()
    row["stream_tok_per_s"] = tokens[0] / (time.perf_counter() - t0)
    return row


async def streams(url: str, conc: int, tokens: int = 256) -> dict:
    gaps: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        t0 = time.perf_counter()
        n = await asyncio.gather(*(_stream(c, _body(f"s {next(_ids)}", tokens, True, True), gaps)
                                   for _ in range(conc)))
        wall = time.perf_counter() - t0
    return {"tok_per_s": sum(n) / wall, "gap_p50_ms": _pct(gaps, 50) * 1e3, "gap_p99_ms": _pct(gaps, 99) * 1e3}


def rows(miss: Path, hit: Path) -> dict:
    return {
        "misses": lambda v, s: _wrk_row(v, miss, s, True),
        "hits": lambda v, s: _wrk_row(v, hit, s, False),
        "hits+decode": lambda v, s: hits_beside_decode(v, hit, s),
        "stream c=1": lambda v, s: asyncio.run(streams(v.url, 1)),
        "stream c=8": lambda v, s: asyncio.run(streams(v.url, 8)),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="bench/prep_handoff.json")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="zccp-handoff-"))
    lim = dict(TINY, cache_extra={"l1": {"enabled": False}})
    miss, hit = tmp / "miss.jsonl", tmp / "hits.jsonl"
    model = TINY["model_name"]
    miss.write_text(synthetic_body(1024, model, max_tokens=8) + "\n")
    hit.write_text("".join(json.dumps({"model": model, "max_tokens": 8, "temperature": 0, "messages": [
        {"role": "user", "content": f"a stored question {i} " * 8}]}) + "\n" for i in range(32)))
    table = rows(miss, hit)
    variants: dict[str, Variant] = {}
    try:
        for n in (1, 2):
            variants[f"T{n}"] = start_d(tmp / f"T{n}", dict(lim, engine_processes=n), 32)
            _store(variants[f"T{n}"].url, hit)
        runs: dict[str, dict[str, list[dict]]] = {row: {k: [] for k in variants} for row in table}
        load = [os.getloadavg()[0]]
        for rnd in range(args.rounds):
            for row, fn in table.items():
                order = list(variants) if rnd % 2 == 0 else list(reversed(variants))
                for k in order:
                    variants[k].wait_drained()
                    got = fn(variants[k], args.seconds)
                    runs[row][k].append(got)
                    log(f"round {rnd + 1} {row} {k}: " + ", ".join(f"{m} {v:.1f}" for m, v in got.items()))
            load.append(os.getloadavg()[0])
    finally:
        for v in variants.values():
            v.stop()
    summary = {row: {k: {m: statistics.median(r[m] for r in rs) for m in rs[0]} for k, rs in by.items()}
               for row, by in runs.items()}
    out = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": len(os.sched_getaffinity(0)),
           "seconds": args.seconds, "rounds": args.rounds, "load1": load, "summary": summary, "runs": runs}
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    for row, by in summary.items():
        log(f"{row}: " + " | ".join(f"{k} " + ", ".join(f"{m} {v:.1f}" for m, v in ms.items()) for k, ms in by.items()))


if __name__ == "__main__":
    main()
