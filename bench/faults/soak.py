"""The soak: the fault suite's mixed traffic, with cancellations, for a long time.

    python -m bench.faults.soak [--seconds 600] [--clients 64] [--cancel 0.1] [--stalled 0.05]

Same stack as the fault suite (bench/faults/harness.py: null model streaming a token every 5 ms, cache on), with
96 slots for the 64 clients.
c clients send the mixed traffic; a fraction (--cancel) of the requests are streams the
client abandons after the first bytes, another (--stalled) readers that ask for a long stream
and stall (connected, never reading) for 8 s. Every 10 s: the resident memory (VmRSS) of each nginx
worker, the engine and redis, the 2xx throughput, the answers that were neither 2xx nor
API-shaped, the engine's open sockets and the arena's size. At the end: slots claimed after
settling, memory growth from the end of the warm-up to the end. Writes bench/faults/soak.json,
bench/faults/soak.png and the soak section of bench/faults/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from bench.faults.harness import (
    OUT,
    REPORT,
    STALL_TOKENS,
    FaultStack,
    Outcome,
    Traffic,
    _body,
    one_request,
)
from bench.faults.injections import streams_ended
from tests.support.checkout import REPO, require_this_checkout

SOAK_JSON = REPO / "bench" / "faults" / "soak.json"
SOAK_PNG = REPO / "bench" / "faults" / "soak.png"


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def sockets(pid: int) -> int:
    n = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            n += os.readlink(fd).startswith("socket:")
        except OSError:
            pass
    return n


def workers(master: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout.split()
    return sorted(int(p) for p in out)


STALL_HOLD_S = 8.0     # how long a stalled reader keeps its connection without reading


async def stalled_request(url: str, api: str, rng: random.Random) -> Outcome:
    """A client that asks for a long stream on a 2 KiB receive buffer and never reads, for
    STALL_HOLD_S; "stalled" whatever happens (its own answer is not the point: the others' are)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    loop = asyncio.get_running_loop()
    sent = time.monotonic()
    so = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    so.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    so.setblocking(False)
    try:
        await loop.sock_connect(so, (host, int(port)))
        body = _body(api, 1024, True, False, rng, max_tokens=STALL_TOKENS)
        path = "/v1/messages" if api == "anthropic" else "/v1/chat/completions"
        await loop.sock_sendall(so, f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                    f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await asyncio.sleep(STALL_HOLD_S)
    except OSError:
        pass
    finally:
        so.close()
    return Outcome(sent, time.monotonic(), "stalled", "stalled-reader", True)


class CancellingTraffic(Traffic):
    """The mixed traffic, where a fraction of the requests are streams abandoned mid-way and
    a fraction are readers that stall (connected, not reading)."""

    def __init__(self, url: str, clients: int, cancel: float, stalled: float = 0.0) -> None:
        super().__init__(url, clients, seed=11)
        self.cancel = cancel
        self.stalled = stalled

    async def _client(self, c: httpx.AsyncClient, i: int) -> None:
        rng = random.Random(self._rng.random())
        while not self._stop.is_set():
            api = rng.choice(["anthropic", "openai"])
            p = rng.random()
            if p < self.stalled:
                out = await stalled_request(self.url, api, rng)
            elif p < self.stalled + self.cancel:
                async with httpx.AsyncClient(base_url=self.url, timeout=30) as own:
                    out = await one_request(own, api, _body(api, 1024, True, False, rng, max_tokens=200), True,
                                            normal=True, abort_after_first_chunk=True)
            else:
                stream = rng.random() < 0.5
                out = await one_request(c, api, _body(api, rng.choice([1024, 65536]), stream, rng.random() < 0.5,
                                                      rng), stream, normal=True)
            self.outcomes.append(out)
            if out.cls not in ("2xx", "aborted", "stalled"):
                await asyncio.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--cancel", type=float, default=0.1)
    ap.add_argument("--stalled", type=float, default=0.05, help="fraction of requests by readers that stall")
    ap.add_argument("--redis-mb", type=int, default=32,
                    help="Redis maxmemory (MiB): small enough that the soak reaches it, to show it holds")
    ap.add_argument("--slots", type=int, default=96, help="slots (at least the clients: no 429 by design)")
    ap.add_argument("--interval", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=60, help="seconds before the memory baseline")
    args = ap.parse_args()
    require_this_checkout()
    s = FaultStack(OUT / "soak", slots=args.slots, redis_mb=args.redis_mb)
    samples: list[dict] = []
    shm = Path("/dev/shm") / s.cfg.shared_memory.name.lstrip("/")
    try:
        s.serving()
        t = CancellingTraffic(s.url, args.clients, args.cancel, args.stalled)
        start = time.monotonic()
        t.start()
        last = start
        while time.monotonic() - start < args.seconds:
            time.sleep(args.interval)
            now = time.monotonic()
            window = [o for o in list(t.outcomes) if last <= o.done < now]
            master = s.nginx.pid
            w = workers(master)
            samples.append({
                "t": round(now - start, 1),
                "rss_kb": {"engine": rss_kb(s.engine.pid), "redis": rss_kb(s.redis.pid),
                           **{f"nginx worker {k + 1}": rss_kb(p) for k, p in enumerate(w)}},
                "rps_2xx": sum(1 for o in window if o.cls == "2xx") / (now - last),
                "aborted": sum(1 for o in window if o.cls == "aborted"),
                "api_errors": dict(Counter(o.status for o in window if o.cls == "api")),
                "other": dict(Counter(o.status for o in window if o.cls == "other")),
                "engine_sockets": sockets(s.engine.pid), "arena_bytes": shm.stat().st_size,
                "engine_pid": s.engine.pid,
            })
            last = now
            print(f"{samples[-1]['t']:6.0f} s  {samples[-1]['rps_2xx']:7.1f} 2xx/s  rss {samples[-1]['rss_kb']}  "
                  f"other {samples[-1]['other']}  api {samples[-1]['api_errors']}", flush=True)
        t.stop()
        after = s.settle()
        ended_stalled = streams_ended(s, "stalled")
    finally:
        s.stop()
    every: list[Outcome] = t.outcomes
    warm = [x for x in samples if x["t"] >= args.warmup] or samples
    growth = {}
    for name in samples[-1]["rss_kb"]:
        first = warm[0]["rss_kb"].get(name)
        end = samples[-1]["rss_kb"].get(name)
        if first:
            growth[name] = round(100 * (end - first) / first, 1)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    result = {
        "commit": commit, "argv": sys.argv[1:], "seconds": args.seconds, "clients": args.clients,
        "cancel": args.cancel, "stalled": args.stalled, "redis_maxmemory_mb": args.redis_mb,
        "samples": samples, "requests": len(every),
        "ok": sum(1 for o in every if o.cls == "2xx"), "aborted": sum(1 for o in every if o.cls == "aborted"),
        "stalled_readers": sum(1 for o in every if o.cls == "stalled"), "streams_ended_stalled": ended_stalled,
        "api_errors": dict(Counter(o.status for o in every if o.cls == "api")),
        "other": dict(Counter(o.status for o in every if o.cls == "other")),
        "slots_claimed_after": after.get("slots_claimed"), "slots_busy_after": after.get("slots_busy"),
        "rss_growth_pct_after_warmup": growth,
        "engine_sockets": sorted({x["engine_sockets"] for x in samples}),
        "arena_bytes": sorted({x["arena_bytes"] for x in samples}),
        "engine_restarted": len({x["engine_pid"] for x in samples}) > 1,
    }
    SOAK_JSON.write_text(json.dumps(result, indent=1))
    if not plot(result):
        SOAK_PNG.unlink(missing_ok=True)   # an older run's plot would pass for this one's
    report(result)
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))


def plot(r: dict) -> bool:
    """soak.png; False (and no plot) without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no soak.png", file=sys.stderr)
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [x["t"] for x in r["samples"]]
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for name in r["samples"][-1]["rss_kb"]:
        a1.plot(xs, [x["rss_kb"].get(name, 0) / 1024 for x in r["samples"]], marker=".", label=name)
    a1.set_ylabel("resident memory (MiB)")
    a1.legend(fontsize=8)
    a1.set_title(f"soak at {r['commit']}: c={r['clients']}, {r['cancel']:.0%} cancelled streams, {r['seconds']:.0f} s")
    a2.plot(xs, [x["rps_2xx"] for x in r["samples"]], marker=".", color="tab:green")
    a2.set_ylabel("2xx per second")
    a2.set_xlabel("seconds")
    a2.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(SOAK_PNG, dpi=90)
    return True


def report(r: dict) -> None:
    growth = ", ".join(f"{k} {v:+.1f}%" for k, v in r["rss_growth_pct_after_warmup"].items())
    other = sum(r["other"].values())
    text = f"""<!-- soak -->
Commit {r['commit']}; `python -m bench.faults.soak {' '.join(r['argv'])}`: **{r['seconds']:.0f} s** at c={r['clients']},
{r['cancel']:.0%} of the requests streams the client abandons after the first bytes, \
{r.get('stalled', 0):.0%} readers that ask for a long stream and stall (connected, never reading, \
{STALL_HOLD_S:.0f} s), the rest the suite's mixed traffic; sampled every 10 s; Redis `maxmemory` \
{r.get('redis_maxmemory_mb', '–')} MiB (`allkeys-lru`). Streams nginx ended as stalled: \
{r.get('streams_ended_stalled', '–')}.

| requests | 2xx | cancelled by the client | stalled readers | API-shaped errors | anything else (must be 0) | \
slots claimed after (must be 0) | engine sockets (min–max) | arena bytes | RSS growth after warm-up |
|---|---|---|---|---|---|---|---|---|---|
| {r['requests']} | {r['ok']} | {r['aborted']} | {r.get('stalled_readers', 0)} | \
{sum(r['api_errors'].values())} {r['api_errors'] or ''} | **{other}** {r['other'] or ''} | \
**{r['slots_claimed_after']}** | \
{r['engine_sockets'][0]}–{r['engine_sockets'][-1]} | {', '.join(str(a) for a in r['arena_bytes'])} | {growth} |

{"![soak](soak.png)" if SOAK_PNG.exists() else "(no plot: matplotlib was not installed; the samples are in soak.json)"}
<!-- /soak -->"""
    body = REPORT.read_text()
    a, b = "<!-- soak -->", "<!-- /soak -->"
    if a not in body:
        body += "\n## Soak\n\n" + a + "\n" + b + "\n"
    REPORT.write_text(body[: body.index(a)] + text + body[body.index(b) + len(b):])


if __name__ == "__main__":
    threading.excepthook = lambda a: print("thread failed:", a.exc_value, file=sys.stderr)
    main()
