"""Time to first token and tokens/s for the tiny model, streaming and not.

A small asyncio client (httpx): `conc` workers send the same body back to back
for `duration` seconds. Streaming: TTFT = request sent -> first content_block_delta
event; per-request decode rate = (output_tokens - 1) / (last byte - first delta).
Non-streaming: latency to the full JSON. Aggregate tokens/s = output tokens of all
completed requests / wall time.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


async def _worker(client: httpx.AsyncClient, url: str, body: bytes, stream: bool, end: float, out: dict,
                  extra: dict | None = None) -> None:
    headers = {"content-type": "application/json", **(extra or {})}
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        try:
            if stream:
                first = None
                tokens = 0
                async with client.stream("POST", url, content=body, headers=headers) as r:
                    if r.status_code != 200:
                        out["errors"] += 1
                        await r.aread()
                        continue
                    async for line in r.aiter_lines():
                        if first is None and line.startswith("event: content_block_delta"):
                            first = time.perf_counter()
                        elif line.startswith("data: ") and '"message_delta"' in line:
                            tokens = json.loads(line[6:])["usage"]["output_tokens"]
                t1 = time.perf_counter()
                if first is None:
                    out["errors"] += 1
                    continue
                out["ttft"].append(first - t0)
                out["latency"].append(t1 - t0)
                out["tokens"] += tokens
                if tokens > 1 and t1 > first:
                    out["decode_tps"].append((tokens - 1) / (t1 - first))
            else:
                r = await client.post(url, content=body, headers=headers)
                t1 = time.perf_counter()
                if r.status_code != 200:
                    out["errors"] += 1
                    continue
                out["latency"].append(t1 - t0)
                out["tokens"] += r.json()["usage"]["output_tokens"]
        except httpx.HTTPError:
            out["errors"] += 1


async def _run(url: str, body: bytes, stream: bool, conc: int, duration: float, extra: dict | None = None) -> dict:
    out = {"ttft": [], "latency": [], "decode_tps": [], "tokens": 0, "errors": 0}
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        t0 = time.perf_counter()
        end = t0 + duration
        await asyncio.gather(*(_worker(client, url, body, stream, end, out, extra) for _ in range(conc)))
        wall = time.perf_counter() - t0
    n = len(out["latency"])
    return {
        "stream": stream, "conc": conc, "requests": n, "errors": out["errors"], "wall_s": wall,
        "req_per_s": n / wall, "tokens_per_s": out["tokens"] / wall,
        "tokens_per_req": out["tokens"] / n if n else None,
        "ttft_p50_ms": (_pct(out["ttft"], 50) or 0) * 1000 if stream else None,
        "ttft_p99_ms": (_pct(out["ttft"], 99) or 0) * 1000 if stream else None,
        "latency_p50_ms": (_pct(out["latency"], 50) or 0) * 1000,
        "latency_p99_ms": (_pct(out["latency"], 99) or 0) * 1000,
        "decode_tps_p50": _pct(out["decode_tps"], 50) if stream else None,
    }


def measure(base_url: str, body: bytes, stream: bool, conc: int, duration: float, extra: dict | None = None) -> dict:
    return asyncio.run(_run(base_url + "/v1/messages", body, stream, conc, duration, extra))
