"""Identical requests in flight (issue 11.6): N concurrent copies of one new prompt to the
tiny model, with coalescing on (cache.coalesce_wait_ms default) and off (0), against one
request alone. Real nginx + engine + Redis (the tests' Stack launcher), loopback.

    python -m bench.coalesce [--n 64] [--max-tokens 64]

Writes bench/coalesce.md and bench/coalesce.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from tests.support.checkout import REPO, require_this_checkout
from tests.support.harness import Stack
from tests.support.leftovers import remove_socket_dirs


def _post(c: httpx.Client, body: dict, headers: dict | None = None) -> tuple[float, int, str]:
    t = time.perf_counter()
    r = c.post("/v1/messages", json=body, headers=headers)
    return time.perf_counter() - t, r.status_code, r.headers.get("x-zccp-cache", "")


def _body(prompt: str, max_tokens: int) -> dict:
    return {"model": "zccp-tiny", "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": prompt}]}


def _metric(s: Stack, name: str) -> float:
    total = 0.0
    for line in s.admin_client().get("/metrics").text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


# A prompt the tiny model (greedy) answers with max_tokens tokens, no early end of turn;
# each row runs on its own stack and Redis, so it is new to each.
PROMPT = "Write a long story about the sea, the ships and the harbour town."


def measure(wait_ms: int | None, n: int, max_tokens: int, root: Path) -> dict:
    cache = {"ttl_s": 600} | ({} if wait_ms is None else {"coalesce_wait_ms": wait_ms})
    s = Stack(root / f"wait{wait_ms}", {"shared_memory": {"segment_count": max(96, n + 8)},
                                         "limits": {"request_timeout_ms": 120000}, "cache": cache},
              with_redis=True).start()
    try:
        body = _body(PROMPT, max_tokens)
        bypass = {"cache-control": "no-cache, no-store"}    # the same work, alone, nothing stored
        with httpx.Client(base_url=s.base_url, timeout=120) as c:
            single_tokens = c.post("/v1/messages", json=body, headers=bypass).json()["usage"]["output_tokens"]
            single = [_post(c, body, bypass)[0] for _ in range(5)]
        tokens0 = _metric(s, "zccp_engine_decode_steps_total")
        with cf.ThreadPoolExecutor(n) as pool, httpx.Client(base_url=s.base_url, timeout=120,
                                                             limits=httpx.Limits(max_connections=n)) as c:
            t0 = time.perf_counter()
            res = list(pool.map(lambda _: _post(c, body), range(n)))
            wall = time.perf_counter() - t0
        lat = sorted(r[0] for r in res)
        time.sleep(0.5)     # the access log lines of the burst: nginx's own time per request
        posts = [json.loads(ln) for ln in s.log("nginx-access.log").splitlines() if '"POST"' in ln][-n:]
        srv = sorted(float(p["duration_ms"]) for p in posts)
        return {
            "coalesce_wait_ms": s.cfg.cache.coalesce_wait_ms, "n": n, "max_tokens": max_tokens,
            "single_ms": statistics.median(single) * 1000,
            "p50_ms": lat[len(lat) // 2] * 1000, "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
            "max_ms": lat[-1] * 1000, "wall_s": wall,
            "nginx_p50_ms": srv[len(srv) // 2], "nginx_p99_ms": srv[min(len(srv) - 1, int(len(srv) * 0.99))],
            "single_tokens": single_tokens,
            "statuses": {str(k): sum(1 for r in res if r[1] == k) for k in sorted({r[1] for r in res})},
            "generations": sum(1 for r in res if r[2] == "MISS"),
            "decode_steps": _metric(s, "zccp_engine_decode_steps_total") - tokens0,
            "coalesced": _metric(s, 'zccp_engine_coalesced_total{outcome="answered"}'),
        }
    finally:
        s.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args()
    require_this_checkout()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            rows = [measure(None, args.n, args.max_tokens, Path(tmp)), measure(0, args.n, args.max_tokens, Path(tmp))]
        finally:
            remove_socket_dirs()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    (REPO / "bench" / "coalesce.json").write_text(json.dumps({"commit": commit, "rows": rows}, indent=2) + "\n")
    lines = [
        "# Identical requests in flight (coalescing)", "",
        f"`python -m bench.coalesce --n {args.n} --max-tokens {args.max_tokens}` at {commit}: {args.n} concurrent "
        "copies of one new prompt (Anthropic, not streamed, temperature 0, the tiny model on the CPU, "
        "2 cores), real nginx + engine + Redis; `single` = median of 5 requests of the same body alone "
        "(`Cache-Control: no-cache, no-store`). Generations = answers "
        "with `X-ZCCP-Cache: MISS`. Target (issue 11): 1 generation, p99 <= 1.2x single.", "",
        "| coalesce_wait_ms | generations | decode steps | tokens per answer | single ms | p50 ms | p99 ms "
        "| p99 / single "
        "| nginx p50 ms | nginx p99 ms | statuses |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['coalesce_wait_ms']} | {r['generations']} | {r['decode_steps']:.0f} | "
                     f"{r['single_tokens']} | "
                     f"{r['single_ms']:.0f} | "
                     f"{r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['p99_ms'] / r['single_ms']:.2f} | "
                     f"{r['nginx_p50_ms']:.0f} | {r['nginx_p99_ms']:.0f} | {r['statuses']} |")
    (REPO / "bench" / "coalesce.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
