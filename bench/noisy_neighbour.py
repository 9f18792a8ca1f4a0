"""Noisy neighbour (issue 28): a victim tenant's short-request latency alone, then with one
hostile tenant sending each of the issue's hostile patterns (items 1-5) and a plain flood
at 10x the victim's share, through real nginx and the engine with the tiny model.

The victim is one client sending short greedy requests back to back (its share: one
request in flight); each hostile pattern runs on its own clients, as fast as they are
answered, under another API key (cache.tenant_source: api_key, so another tenant). Target
(the issue's): the victim's p99 within 1.5x of alone on every row, and 0 victim errors.

    PYTHONPATH=engine python -m bench.noisy_neighbour [--seconds 20]

Writes bench/noisy_neighbour.json (--json: elsewhere) and prints the table kept in
bench/noisy_neighbour.md (about 3 minutes at 20 s a row). CPU per request: the engine's and
nginx's CPU seconds (every thread and worker, /proc) while the victim ran, over every request
answered then (victim's and hostile's): the cost a request adds, which a loaded machine's
wall-clock latency alone does not show.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.support.checkout import REPO, require_this_checkout
from zccp.model.tokenizer import EOS
from tests.support.harness import Stack
from tests.support.leftovers import remove_socket_dirs

CHAT = "/v1/chat/completions"
VICTIM = {"model": "zccp-tiny", "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}
BASE = {"model": "zccp-tiny", "max_tokens": 32, "messages": [{"role": "user", "content": "Tell me a story"}]}


def slow_schema(salt: int) -> dict[str, Any]:
    """~10 KB, within the 64 KiB / depth-64 bounds, that llguidance takes about a CPU-second to
    compile (allOf of two anyOfs of 60 objects: 3,600 merged objects); salt: a new one each time."""
    return {"type": "object", "allOf": [{"anyOf": [{"properties": {f"a{j}_{q}": {"const": salt + i * 100 + q}
                                                                   for q in range(3)}} for i in range(60)]}
                                        for j in range(2)]}


def _schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


def _stops(count: int, i: int) -> list[str]:
    """count stop strings of 256 bytes (the bound) that never match: scanned on every token."""
    return [(f"{i}-{t}-" * 64)[:256] for t in range(count)]


MESSAGES = "/v1/messages"
# clients that close each request 50 ms after sending it (whole answers of up to 1,000
# tokens): each would hold a slot and a batch row to its end if nginx did not see them go
LEAVERS = "clients that leave (each request closed after 50 ms)"
LEAVE_S = {LEAVERS: 0.05}

# name -> (hostile clients, path, body maker (a counter in, the body out)); each at the bound
# the engine now enforces (docs/isolation.md): what is still allowed is what can still hurt
PATTERNS: dict[str, tuple[int, str, Callable[[int], dict[str, Any]]]] = {
    "1. temperature 1e-300": (2, CHAT, lambda i: {**BASE, "temperature": 1e-300}),
    "1. json_schema const \"é\" (no token allowed)": (2, CHAT, lambda i: {
        **BASE, "temperature": 0.8, "response_format": _schema({"const": "é"})}),
    "2. logit_bias, 300 entries (the bound)": (1, CHAT, lambda i: {**BASE, "logit_bias": {
        str(t): 1 for t in range(300)}}),
    "3. json_schema of 10 KB, ~1 CPU-s to compile (new each time)": (1, CHAT, lambda i: {
        **BASE, "max_tokens": 4, "response_format": _schema(slow_schema(i * 1000))}),
    "4. stop_sequences: 16 x 256 bytes (the bound)": (1, MESSAGES, lambda i: {
        **BASE, "stop_sequences": _stops(16, i)}),
    "5. n=64": (1, CHAT, lambda i: {**BASE, "n": 64}),
    "plain flood, 10x the victim's share": (10, CHAT, lambda i: {**BASE, "max_tokens": 8}),
    # two tenants (the workers alternate keys), 16 clients each, answers of 1,500 tokens
    # (EOS banned): together they would fill the batch and keep it filled
    "two colluding tenants, 16 clients each, 1,500 tokens": (32, CHAT, lambda i: {
        **BASE, "max_tokens": 1500, "logit_bias": {str(EOS): -100}}),
    LEAVERS: (8, CHAT, lambda i: {**BASE, "max_tokens": 1000}),
}
HOSTILE_TENANTS = {"two colluding tenants, 16 clients each, 1,500 tokens": 2}    # other rows: one


def _victim(url: str, seconds: float) -> tuple[list[float], dict[int, int]]:
    lat: list[float] = []
    codes: dict[int, int] = {}
    end = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=120, headers={"authorization": "Bearer sk-victim"}) as c:
        while time.monotonic() < end:
            t0 = time.perf_counter()
            r = c.post(CHAT, json=VICTIM)
            lat.append(time.perf_counter() - t0)
            codes[r.status_code] = codes.get(r.status_code, 0) + 1
    return lat, codes


def _hostile(url: str, path: str, make: Callable[[int], dict[str, Any]], stop: threading.Event,
             codes: dict[int, int], lock: threading.Lock, worker: int, tenants: int = 1,
             leave_s: float | None = None) -> None:
    """tenants: the workers alternate that many keys; leave_s: the client closes each request
    after this long (its status counted as 0)."""
    i = worker * 1_000_000
    key = "sk-hostile" if tenants == 1 else f"sk-hostile-{worker % tenants}"
    headers = {"authorization": f"Bearer {key}", "x-api-key": key, "anthropic-version": "2023-06-01"}
    timeout = httpx.Timeout(120, read=leave_s) if leave_s else 120
    with httpx.Client(base_url=url, timeout=timeout, headers=headers) as c:
        while not stop.is_set():
            i += 1
            try:
                status = c.post(path, content=json.dumps(make(i))).status_code
            except httpx.HTTPError:
                status = 0
            with lock:
                codes[status] = codes.get(status, 0) + 1


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")


def _cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system, every thread) of these processes and their children."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo, seen = 0, list(pids), set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
            todo += [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
    return total / tick


def run_row(url: str, seconds: float, pids: dict[str, list[int]], clients: int = 0, path: str = CHAT,
            make: Callable[[int], dict[str, Any]] | None = None, tenants: int = 1,
            leave_s: float | None = None) -> dict[str, Any]:
    stop, lock = threading.Event(), threading.Lock()
    hostile: dict[int, int] = {}
    threads = [threading.Thread(target=_hostile, args=(url, path, make, stop, hostile, lock, w, tenants, leave_s),
                                daemon=True)
               for w in range(clients)] if make else []
    for t in threads:
        t.start()
    if threads:
        time.sleep(1.0)                    # the hostile load is running before the victim's first request
    cpu0 = {k: _cpu_s(v) for k, v in pids.items()}
    load0 = os.getloadavg()[0]
    lat, codes = _victim(url, seconds)
    cpu = {k: _cpu_s(v) - cpu0[k] for k, v in pids.items()}
    load1 = os.getloadavg()[0]
    stop.set()
    for t in threads:
        t.join(150)
    errors = sum(n for c, n in codes.items() if c != 200)
    answered = len(lat) + sum(hostile.values())
    return {"requests": len(lat), "p50_ms": _pct(lat, 0.5), "p99_ms": _pct(lat, 0.99),
            "mean_ms": statistics.fmean(lat) * 1000 if lat else float("nan"), "victim_errors": errors,
            "victim_codes": codes, "hostile_codes": hostile, "load": [load0, load1],
            # every answered request (victim's and hostile's, the hostile ones counted at the end)
            "cpu_us_per_request": {k: v * 1e6 / max(answered, 1) for k, v in cpu.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--json", default=str(Path(REPO) / "bench" / "noisy_neighbour.json"),
                    help="where the rows go (the table is printed; bench/noisy_neighbour.md holds the runs kept)")
    ap.add_argument("--only", action="append", default=[],
                    help="run only the hostile rows whose name contains this (repeatable); alone always runs")
    ap.add_argument("--slots", type=int, default=128,
                    help="nginx's slots (shared_memory.segment_count); fewer than max_batch + max_queue (80) "
                         "lets requests nobody waits for fill them (the row \"clients that leave\")")
    args = ap.parse_args()
    require_this_checkout()
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # the default 128 slots (the test harness's 8 would turn a 10-client flood into nginx's 429s)
        s = Stack(Path(tmp) / "s", {"model": {"max_batch": 16, "max_queue": 64},
                                    "shared_memory": {"segment_count": args.slots},
                                    "limits": {"request_timeout_ms": 60000}}).start()
        try:
            assert s.engine is not None and s.nginx is not None
            pids = {"engine": [s.engine.pid or 0], "nginx": [s.nginx.pid or 0]}
            rows["alone"] = run_row(s.base_url, args.seconds, pids)
            for name, (clients, path, make) in PATTERNS.items():
                if args.only and not any(o in name for o in args.only):
                    continue
                rows[name] = run_row(s.base_url, args.seconds, pids, clients, path, make,
                                     HOSTILE_TENANTS.get(name, 1), LEAVE_S.get(name))
                print(name, rows[name]["p50_ms"], rows[name]["p99_ms"], rows[name]["victim_errors"], flush=True)
        finally:
            s.stop()
            remove_socket_dirs()
    Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(table(rows)))


def table(rows: dict[str, dict[str, Any]]) -> list[str]:
    alone = rows["alone"]["p99_ms"]
    lines = ["| hostile tenant sends | victim requests | p50 ms | p99 ms | p99 / alone | victim errors "
             "| hostile answers | engine CPU µs / request | nginx CPU µs / request | load (1 min) |",
             "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for name, r in rows.items():
        ratio = r["p99_ms"] / alone if alone else float("nan")
        verdict = "" if name == "alone" else (" ✓" if ratio <= 1.5 and not r["victim_errors"] else " ✗")
        hostile = ", ".join(f"{c}: {n}" for c, n in sorted(r["hostile_codes"].items())) or "—"
        cpu = r["cpu_us_per_request"]
        lines.append(f"| {name} | {r['requests']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {ratio:.2f}{verdict} "
                     f"| {r['victim_errors']} | {hostile} | {cpu['engine']:.0f} | {cpu['nginx']:.0f} "
                     f"| {r['load'][0]:.1f}–{r['load'][1]:.1f} |")
    return lines


if __name__ == "__main__":
    main()
