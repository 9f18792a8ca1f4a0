"""python -m bench.cache_eval.near_ab [--baseline REF] [--rounds N] [--seconds S]

What the exact check of a near candidate costs a NEAR answer end to end: the gateway of
REF (default `main`, before the check) and this checkout, both running at once on fresh
Redis servers, each answering the same NEAR body (a stored ShareGPT prompt plus a
trailing newline: every request takes the near path, and with the check computes the
request's own shingle set). wrk runs alternate between the two stacks, ROUNDS times per
body, so that the shared machine's load falls on both alike; the medians are kept.
Writes bench/cache_eval/near_ab.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.cache_eval.run import HERE, LATENCY_MAX_TOKENS, OVERRIDES, _wrk, log
from bench.cache_eval.baseline import BaselineStack
from bench.cache_eval.client import Client
from bench.cache_eval.pairs import anth, dumps
from bench.cache_eval.prompts import build_pool
from tests.support.harness import Stack


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cache_eval.near_ab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="main")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=HERE / "near_ab.json")
    a = ap.parse_args(argv)
    pool = build_pool(300, 10, 10, 4, n_chats=10)
    by_len = sorted(pool.edit, key=lambda b: b.ntok)
    picks = {"short": min(by_len, key=lambda b: abs(b.ntok - 40)),
             "1k_tokens": min(by_len, key=lambda b: abs(b.ntok - 1000))}
    workdir = Path(tempfile.mkdtemp(prefix="zccp-near-ab-"))
    before = BaselineStack(a.baseline, workdir, OVERRIDES).start()
    after = Stack(workdir / "stack", OVERRIDES, with_redis=True).start()
    stacks = {"before": before.base_url, "after": after.base_url}
    rows = []
    try:
        files = {}
        for name, b in picks.items():
            body, near = dumps(anth(b.text, LATENCY_MAX_TOKENS)), dumps(anth(b.text + "\n", LATENCY_MAX_TOKENS))
            f = workdir / f"near_{name}.json"
            f.write_bytes(near)
            files[name] = (f, b.ntok, len(near))
            for url in stacks.values():
                c = Client(url)
                try:
                    c.send("anthropic", body)
                    for _ in range(50):
                        if c.send("anthropic", body).cache == "HIT":
                            break
                        time.sleep(0.01)
                    assert c.send("anthropic", near).cache == "NEAR"
                finally:
                    c.close()
        for name, (f, ntok, size) in files.items():
            runs: dict[str, list[dict]] = {"before": [], "after": []}
            for r in range(a.rounds):
                for which, url in (stacks.items() if r % 2 == 0 else reversed(list(stacks.items()))):
                    w = _wrk(url + "/v1/messages", f, a.seconds)
                    runs[which].append(w)
                    log(f"  {name:9s} {which:6s} round {r + 1}: {w['rps']:7.0f} req/s  p50 {w['p50_us'] / 1000:.3f} ms")
            for which, ws in runs.items():
                rows.append({"body": name, "prompt_tokens": ntok, "body_bytes": size, "stack": which,
                             "rps": statistics.median(w["rps"] for w in ws),
                             "p50_ms": statistics.median(w["p50_us"] for w in ws) / 1000,
                             "p99_ms": statistics.median(w["p99_us"] for w in ws) / 1000,
                             "errors": sum(w["errors"] for w in ws), "runs": [round(w["rps"]) for w in ws]})
    finally:
        after.stop()
        before.stop()
    res = {"baseline": a.baseline, "baseline_commit": before.commit, "rounds": a.rounds, "seconds": a.seconds,
           "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "rows": rows}
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    for r in rows:
        log(f"{r['body']:9s} {r['stack']:6s} {r['rps']:7.0f} req/s  p50 {r['p50_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms "
            f"runs {r['runs']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
