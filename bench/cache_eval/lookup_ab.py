"""python -m bench.cache_eval.lookup_ab [--baseline REF] [--rounds N] [--lookups N]

The engine's own time for one NEAR lookup, before (REF, default `main`: the estimate
alone) and after the exact check (this checkout): `ResponseCache.lookup` in a child
process per tree, against one local redis-server, for the NEAR variant (a trailing
newline) of a stored ~40-token and a ~1000-token ShareGPT prompt (the latency bodies of
bench/cache_eval). Each lookup gets fresh keys, so the request's own shingle set is
computed every time. No nginx, no HTTP: the time the engine's event loop spends, Redis
round trip included. The two trees alternate ROUNDS times; the median of each child's
lookups (the first 100 dropped) is printed, and the median over rounds kept.
Writes bench/cache_eval/lookup_ab.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.checkout import require_this_checkout

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

_CHILD = r"""
import asyncio, dataclasses, statistics, sys, time
import orjson
from zccp.cache.answer import CachedAnswer
from zccp.cache.fingerprint import compute
from zccp.cache.keys import CacheKeys
from zccp.cache.mask_store import load_masks
from zccp.cache.scope import place
from zccp.cache.store import ResponseCache
from zccp.config import CacheConfig
from zccp.observe.metrics import EngineMetrics

url, text, n = sys.argv[1], open(sys.argv[2]).read(), int(sys.argv[3])
masks = load_masks()
checked = any(f.name == "turn" for f in dataclasses.fields(CacheKeys))


def keys(raw):
    fp = compute("anthropic", raw, masks)
    kw = {}
    if checked:
        try:    # the meaning check (issue 22), else the shingle check before it
            from zccp.cache.near import TurnUnits as Turn
        except ImportError:
            from zccp.cache.near import TurnShingles as Turn
        kw["turn"] = Turn(orjson.loads(raw), masks)
    return CacheKeys(fp.exact_key, fp.prefix_key, fp.bands, fp.signature, fp.masked, None,
                     place(fp.prefix_key, None, fp.masked, "tenant"), **kw)


async def main():
    c = ResponseCache(CacheConfig(redis_url=url, timeout_ms=5000), EngineMetrics())
    await c.redis.flushdb()
    body = lambda t: orjson.dumps({"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": t}]})
    await c.store(keys(body(text)), CachedAnswer("hello", "end_turn", None, 1, (5,), time.time()))
    near = body(text + "\n")
    ts = []
    for _ in range(n + 100):
        k = keys(near)
        t0 = time.perf_counter_ns()
        r = await c.lookup(k, memoryview(near))
        ts.append(time.perf_counter_ns() - t0)
        assert r.status == "NEAR", r
    print(statistics.median(ts[100:]) / 1000)
    await c.close()

asyncio.run(main())
"""


def main(argv: list[str] | None = None) -> int:
    require_this_checkout()
    from bench.cache_eval.prompts import build_pool

    ap = argparse.ArgumentParser(prog="python -m bench.cache_eval.lookup_ab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="main")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lookups", type=int, default=500)
    ap.add_argument("--out", type=Path, default=HERE / "lookup_ab.json")
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="zccp-lookup-ab-"))
    commit = subprocess.run(["git", "rev-parse", a.baseline], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    archive = subprocess.run(["git", "archive", commit, "engine", "lua", "nginx", "shm_abi"], cwd=ROOT,
                             capture_output=True,
                             check=True).stdout
    (work / "before").mkdir()
    subprocess.run(["tar", "-x", "-C", str(work / "before")], input=archive, check=True)
    trees = {"before": work / "before", "after": ROOT}
    pool = build_pool(300, 10, 10, 4, n_chats=10)
    by_len = sorted(pool.edit, key=lambda b: b.ntok)
    bodies = {"short": min(by_len, key=lambda b: abs(b.ntok - 40)),
              "1k_tokens": min(by_len, key=lambda b: abs(b.ntok - 1000))}
    sock = work / "redis.sock"
    redis = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", str(sock), "--save", "",
                              "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        url = f"unix://{sock}?db=0"
        runs: dict[tuple[str, str], list[float]] = {}
        for r in range(a.rounds):
            for name, b in bodies.items():
                f = work / f"{name}.txt"
                f.write_text(b.text)
                order = list(trees.items()) if r % 2 == 0 else list(reversed(trees.items()))
                for which, tree in order:
                    out = subprocess.run([sys.executable, "-c", _CHILD, url, str(f), str(a.lookups)],
                                         env={"PYTHONPATH": str(tree / "engine"), "PATH": "/usr/bin:/bin"},
                                         capture_output=True, text=True, cwd=tree)
                    if out.returncode != 0:
                        raise RuntimeError(f"{which}: {out.stderr[-2000:]}")
                    us = float(out.stdout.strip())
                    runs.setdefault((name, which), []).append(us)
                    print(f"{name:9s} {which:6s} round {r + 1}: lookup median {us:.1f} us", flush=True)
    finally:
        redis.terminate()
        redis.wait()
    rows = [{"body": name, "prompt_tokens": bodies[name].ntok, "tree": which,
             "lookup_us_median": round(statistics.median(v), 1), "rounds_us": [round(x, 1) for x in v]}
            for (name, which), v in runs.items()]
    a.out.write_text(json.dumps({"baseline": a.baseline, "baseline_commit": commit, "lookups": a.lookups,
                                 "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "rows": rows}, indent=1) + "\n")
    for row in rows:
        print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
