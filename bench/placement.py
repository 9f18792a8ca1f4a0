"""Placement auto against none, same run: a cache-hit load (wrk, c = 16) while the tiny
model decodes 8 streams of misses; the hits' p50/p99 and rate, and the streams' tokens/s.

    PYTHONPATH=engine:. python -m bench.placement [--seconds 10]

Each mode gets its own stack (redis, the engine, nginx; placement: none, then auto);
results in bench/placement.json, the table in bench/placement.md.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx

from tests.support.harness import REPO, Stack
from tests.support.leftovers import remove_socket_dirs

HIT = {"model": "zccp-tiny", "max_tokens": 16, "temperature": 0, "messages": [{"role": "user", "content": "hit me"}]}
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    assert m, text
    return float(m.group(1)) * _UNITS[m.group(2)]


def wrk(url: str, seconds: int, out_dir: Path) -> dict[str, float]:
    script = out_dir / "hit.lua"
    script.write_text('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                      f"wrk.body = {json.dumps(json.dumps(HIT))}\n")
    r = subprocess.run(["wrk", "-t2", "-c16", f"-d{seconds}s", "--latency", "-s", str(script), url],
                       capture_output=True, text=True, timeout=seconds + 30)
    lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)$", r.stdout, re.M))
    rate = re.search(r"Requests/sec:\s+([\d.]+)", r.stdout)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", r.stdout)
    assert lat and rate, r.stdout + r.stderr
    return {"p50_ms": _ms(lat["50"]), "p99_ms": _ms(lat["99"]), "rps": float(rate.group(1)),
            "non_2xx": int(non2xx.group(1)) if non2xx else 0}


def decode(url: str, stop: threading.Event, tokens: list[int], i: int) -> None:
    n = 0
    with httpx.Client(timeout=120) as c:
        while not stop.is_set():
            n += 1
            body = {"model": "zccp-tiny", "max_tokens": 256, "temperature": 0,
                    "messages": [{"role": "user", "content": f"stream {i} {n} tell me everything"}]}
            r = c.post(url, json=body, headers={"Cache-Control": "no-store"})
            if r.status_code == 200:
                tokens.append(r.json()["usage"]["completion_tokens"])


def run_mode(mode: str, seconds: int) -> dict[str, object]:
    d = Path(tempfile.mkdtemp(prefix=f"zccp-placement-{mode}-"))
    s = Stack(d, {"placement": mode, "shared_memory": {"segment_count": 32},
                  "model": {"backend": "tiny", "max_batch": 8}, "logging": {"level": "warning"}},
              with_redis=True).start()
    try:
        url = s.url("/v1/chat/completions")
        for _ in range(3):   # stored, then kept by nginx's L1
            assert httpx.post(url, json=HIT, timeout=30).status_code == 200
        stop, tokens = threading.Event(), [[] for _ in range(8)]
        streams = [threading.Thread(target=decode, args=(url, stop, tokens[i], i), daemon=True) for i in range(8)]
        for t in streams:
            t.start()
        time.sleep(2)                        # the 8 rows decoding
        before = sum(map(sum, tokens))
        t0 = time.monotonic()
        hits = wrk(url, seconds, d)
        tok_s = (sum(map(sum, tokens)) - before) / (time.monotonic() - t0)
        stop.set()
        for t in streams:
            t.join(130)
        return {"mode": mode, **hits, "decode_tokens_per_s": round(tok_s, 1)}
    finally:
        s.stop()
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "placement.json")
    a = ap.parse_args()
    try:
        rows = [run_mode(m, a.seconds) for m in ("none", "auto")]
    finally:
        remove_socket_dirs()
    for r in rows:
        print(f"{r['mode']:5} hits p50 {r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms {r['rps']:.0f}/s "
              f"(non-2xx {r['non_2xx']}); decode {r['decode_tokens_per_s']} tokens/s")
    a.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
