"""A key limited to N output tokens a minute, 64 concurrent clients over two stacks sharing
one Redis (issue 18's target): the output tokens served in each calendar minute must stay
≤ N + the reservations in flight across the minute's start (max_tokens is reserved at
admission, from each worker's lease of the window's budget, zccp.plugins.limits.lease; an answer admitted
in one window may end in the next).

    PYTHONPATH=engine python -m bench.keys_burst [--seconds 300] [--limit 2000] [--clients 64]

Writes bench/keys_burst.md and bench/keys_burst.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import redis as redis_py

from tests.support.cache_requests import ENGINE_ENV
from tests.support.checkout import REPO, require_this_checkout
from tests.support.harness import Stack
from tests.support.leftovers import remove_socket_dirs

NULL = {"backend": "null", "name": "zccp-tiny", "max_context": 200000}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--limit", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()
    require_this_checkout()
    with tempfile.TemporaryDirectory() as tmp:
        a = Stack(Path(tmp) / "a", {"model": NULL, "auth": {"mode": "keys"},
                                    "shared_memory": {"segment_count": 96}}, with_redis=True).start()
        b = Stack(Path(tmp) / "b", {"model": NULL, "auth": {"mode": "keys"}, "shared_memory": {"segment_count": 96},
                                    "cache": {"enabled": True, "redis_url": a.cfg.cache.redis_url}}).start()
        try:
            out = subprocess.run([sys.executable, "-m", "zccp.ops.keys_cli", "create", "--tenant", "burst", "--otpm",
                                  str(args.limit), "--config", str(a.config_path), "--json"], capture_output=True,
                                 text=True, timeout=60, env=ENGINE_ENV, check=True)
            key = json.loads(out.stdout)["key"]
            served: Counter[int] = Counter()
            crossing: Counter[int] = Counter()    # minute -> max_tokens of answers begun before it, ended in it
            codes: Counter[int] = Counter()
            shared = redis_py.Redis.from_url(a.cfg.cache.redis_url)

            def scripts() -> int:
                st = shared.info("commandstats")
                return sum(int(st.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))

            scripts_before = scripts()
            lock = threading.Lock()
            stop = time.time() + args.seconds

            def client(i: int) -> None:
                s = (a, b)[i % 2]
                n = 0
                with httpx.Client(base_url=s.base_url, timeout=30) as c:
                    while time.time() < stop:
                        body = {"model": "zccp-tiny", "max_tokens": args.max_tokens, "temperature": 0,
                                "messages": [{"role": "user", "content": f"client {i} question {n}"}]}
                        n += 1
                        began = int(time.time() // 60)
                        r = c.post("/v1/messages", json=body, headers={"x-api-key": key,
                                                                       "cache-control": "no-store"})
                        minute = int(time.time() // 60)
                        with lock:
                            codes[r.status_code] += 1
                            if r.status_code == 200:
                                served[minute] += r.json()["usage"]["output_tokens"]
                                if began != minute:
                                    crossing[minute] += args.max_tokens
                        if r.status_code == 429:
                            time.sleep(min(1.0, float(r.headers.get("retry-after", "1"))))

            threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            time.sleep(0.5)
            script_calls = scripts() - scripts_before
        finally:
            a.stop()
            b.stop()
    remove_socket_dirs()
    rows = {"limit": args.limit, "clients": args.clients, "seconds": args.seconds, "max_tokens": args.max_tokens,
            "served_per_minute": {str(k): v for k, v in sorted(served.items())},
            "in_flight_into_minute": {str(k): v for k, v in sorted(crossing.items())}, "statuses": dict(codes),
            "redis_scripts": script_calls}
    (REPO / "bench" / "keys_burst.json").write_text(json.dumps(rows, indent=1))
    over = [k for k, v in served.items() if v > args.limit + crossing[k]]
    worst = max(served.values()) if served else 0
    answered = sum(codes.values())
    lines = ["# A token limit under a burst, two stacks sharing Redis (bench/keys_burst.py)", "",
             f"A key with `otpm` {args.limit}; {args.clients} concurrent clients (half on each stack, null model, "
             f"max_tokens {args.max_tokens}, no-store so every request is a model run) for {args.seconds:g} s; "
             "a 429 client waits its retry-after (≤ 1 s). Admissions are spent from each nginx worker's lease "
             "of the window's budget (plugins/limits/lease). Output tokens served, by the calendar minute the answer "
             "ended in; in flight: the max_tokens reserved by answers begun in the minute before (admitted "
             "in that window) and ended in this one; the bound is the limit + those (the first and last "
             "minutes are partial):", "",
             "| minute | output tokens served | in flight into it | limit | bound | within |",
             "|---|---|---|---|---|---|"]
    for k, v in sorted(served.items()):
        lines.append(f"| {time.strftime('%H:%M', time.gmtime(k * 60))} | {v} | {crossing[k]} | {args.limit} | "
                     f"{args.limit + crossing[k]} | {'yes' if v <= args.limit + crossing[k] else 'NO'} |")
    lines += ["", f"Statuses: {dict(codes)}. Worst minute: {worst} served (limit {args.limit}); minutes over "
              f"the bound: {len(over)}. Redis scripts (leases, concurrency, batched settlements) run by both "
              f"stacks: {script_calls} for {answered} requests ({script_calls / max(1, answered):.2f} a request)."]
    (REPO / "bench" / "keys_burst.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
