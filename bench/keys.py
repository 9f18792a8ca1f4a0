"""Keys and limits on vs off (issue 18): what nginx's key check and limit reservation cost
on the hit path (the same 1 KiB body again and again: L1) and the miss path (no-cache,
no-store: every request goes to the engine's null model). Real nginx + engine + Redis (the
tests' Stack launcher), loopback, wrk (bench/wrk/post.lua).

    PYTHONPATH=engine python -m bench.keys [--seconds 3] [--conc 16]

Rows: auth off | keys (a key without limits: verified from the worker's cache, metered
after the answer) | keys+limits (a key with every limit set, high enough never to refuse:
also the admission script in Redis before the request). Writes bench/keys.md and bench/keys.json.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import procs
from tests.support.cache_requests import ENGINE_ENV
from tests.support.checkout import REPO, require_this_checkout
from tests.support.harness import Stack, remove_socket_dirs

NULL = {"backend": "null", "name": "zccp-tiny", "max_context": 200000}
LIMITS = ["--rpm", "10000000", "--itpm", "1000000000", "--otpm", "1000000000", "--concurrency", "100000",
          "--daily-tokens", "100000000000", "--monthly-tokens", "100000000000"]


def body_1k() -> str:
    filler = "The quick brown fox jumps over the lazy dog. "
    body = {"model": "zccp-tiny", "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": ""}]}
    base = len(json.dumps(body))
    body["messages"][0]["content"] = (filler * 40)[: 1024 - base]
    out = json.dumps(body)
    assert len(out) == 1024, len(out)
    return out


def make_key(s: Stack, limits: bool) -> str:
    out = subprocess.run([sys.executable, "-m", "zccp.ops.keys_cli", "create", "--tenant", "bench",
                          *(LIMITS if limits else []),
                          "--config", str(s.config_path), "--json"], capture_output=True, text=True,
                         timeout=60, env=ENGINE_ENV, check=True)
    return str(json.loads(out.stdout)["key"])


def run_one(s: Stack, body_file: Path, conc: int, seconds: float, nocache: bool, key: str | None) -> dict:
    args_tail = ["no-cache" if nocache else "-"] + ([key] if key else [])
    nginx_pid = s.nginx.proc.pid if s.nginx else 0
    before = procs.snapshot(nginx_pid)
    t0 = time.perf_counter()
    res = wrk_with(s.base_url, body_file, conc, seconds, args_tail)
    wall = time.perf_counter() - t0
    after = procs.snapshot(nginx_pid)
    n = max(1, res["requests"])
    cpu = procs.delta(before, after)["cpu_s"]
    return {"rps": res["requests"] / (res["duration_us"] / 1e6), "p50_ms": res["p50_us"] / 1000,
            "p99_ms": res["p99_us"] / 1000, "non2xx": res["err_status"], "requests": res["requests"],
            "nginx_cpu_us_per_req": cpu / n * 1e6, "wall_s": wall}


def wrk_with(url: str, body_file: Path, conc: int, seconds: float, tail: list[str]) -> dict:
    """Like bench.run.wrk, with post.lua's extra arguments (no-cache flag, API key)."""
    cmd = ["wrk", "-t", str(min(2, conc)), "-c", str(conc), "-d", f"{max(1, round(seconds))}s", "--timeout", "30s",
           "--latency", "-s", str(REPO / "bench" / "wrk" / "post.lua"), url + "/v1/messages", "--", str(body_file),
           *tail]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60).stdout
    m = re.search(r"^WRKJSON (\{.*\})$", out, re.M)
    if not m:
        raise RuntimeError(out)
    return dict(json.loads(m.group(1)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--conc", type=int, default=16)
    args = ap.parse_args()
    require_this_checkout()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        body_file = Path(tmp) / "body.jsonl"
        body_file.write_text(body_1k() + "\n")
        for mode in ("off", "keys", "keys+limits"):
            over = {"model": NULL, "shared_memory": {"segment_count": 64}}
            if mode != "off":
                over["auth"] = {"mode": "keys"}
            s = Stack(Path(tmp) / mode.replace("+", "_"), over, with_redis=True).start()
            try:
                key = make_key(s, mode == "keys+limits") if mode != "off" else None
                for path, nocache in (("hit", False), ("miss", True)):
                    run_one(s, body_file, args.conc, 1, nocache, key)       # warm-up (and the hit's first store)
                    r = run_one(s, body_file, args.conc, args.seconds, nocache, key)
                    rows.append({"auth": mode, "path": path, **r})
                    print(rows[-1], flush=True)
            finally:
                s.stop()
    remove_socket_dirs()
    (REPO / "bench" / "keys.json").write_text(json.dumps(rows, indent=1))
    by = {(r["auth"], r["path"]): r for r in rows}
    lines = ["# Keys and limits on vs off (bench/keys.py)", "",
             f"One stack (nginx 2 workers, engine with the null model, redis-server), loopback; wrk "
             f"-c {args.conc} -t 2 for {args.seconds:g} s per row after a 1 s warm-up; one 1 KiB Anthropic body. "
             "hit: the same body every time (nginx's L1 answers); miss: `Cache-Control: no-cache, no-store` "
             "(every request goes to the engine). keys+limits: `auth.mode: keys`, a key with every limit set (never "
             "refused): per request the key is verified from the worker's cache, one Redis script admits and "
             "reserves, one settles and meters (a timer after the answer); keys without limits: the check "
             "and the metering script only. nginx CPU: its processes' user+system "
             "time over the run / requests. The machine is shared (2 cores, other sessions' tests running): "
             "read the numbers as indicative, one run each.", "",
             "| auth | path | req/s | p50 ms | p99 ms | non-2xx | nginx CPU µs/req |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['auth']} | {r['path']} | {r['rps']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                     f"{r['non2xx']} | {r['nginx_cpu_us_per_req']:.1f} |")
    lines.append("")
    for path in ("hit", "miss"):
        off = by[("off", path)]
        for mode in ("keys", "keys+limits"):
            on = by[(mode, path)]
            lines.append(f"* {path}, {mode}: {on['rps'] / off['rps'] * 100:.0f}% of off's req/s; nginx CPU "
                         f"+{on['nginx_cpu_us_per_req'] - off['nginx_cpu_us_per_req']:.1f} µs per request.")
    (REPO / "bench" / "keys.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
