"""The fault suite's faults (bench.faults.suite runs them): each injects one fault into a
FaultStack while its Traffic runs, and says what it did."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import time
from dataclasses import dataclass, field

import httpx

from bench.faults.harness import (
    DEADLINE_MS,
    SLOTS,
    SNDBUF_KB,
    STALL_MS,
    STALL_TOKENS,
    FaultStack,
    Outcome,
    Traffic,
    _body,
    one_request,
)
from zccp.ops.admin_client import admin_request
from zccp.ops.stack import reload_masks, redis_service

@dataclass
class FaultResult:
    name: str
    what: str
    injections: list[float] = field(default_factory=list)      # monotonic times
    t0: float = 0.0
    t1: float = 0.0
    extra: dict = field(default_factory=dict)
    own: list[Outcome] = field(default_factory=list)           # the fault's own clients' requests


def f_kill(s: FaultStack, t: Traffic, args) -> FaultResult:
    r = FaultResult("engine SIGKILL", f"SIGKILL of the engine x{args.kills} at random moments (1-2.5 s "
                    "after it serves again), streams in flight included")
    rng = random.Random(7)
    for _ in range(args.kills):
        time.sleep(rng.uniform(1.0, 2.5))
        pid = s.engine.pid
        r.injections.append(time.monotonic())
        os.kill(pid, signal.SIGKILL)
        end = time.monotonic() + 30
        while (s.engine.pid == pid or (s.health() or {}).get("engine_pid") != s.engine.pid) and time.monotonic() < end:
            time.sleep(0.05)
    time.sleep(1.0)
    return r


def f_stop(s: FaultStack, t: Traffic, args) -> FaultResult:
    r = FaultResult("engine SIGSTOP 5 s", f"SIGSTOP of the engine for 5 s, then SIGCONT (deadline {DEADLINE_MS} ms)")
    time.sleep(0.5)
    r.injections.append(time.monotonic())
    os.kill(s.engine.pid, signal.SIGSTOP)
    time.sleep(5)
    os.kill(s.engine.pid, signal.SIGCONT)
    time.sleep(3)
    return r


def f_redis(s: FaultStack, t: Traffic, args) -> FaultResult:
    r = FaultResult("Redis SIGKILL + restart", "SIGKILL of redis-server x5, restarted 1 s later, 3 s apart")
    for _ in range(5):
        time.sleep(2)
        r.injections.append(time.monotonic())
        s.redis.kill()
        time.sleep(1)
        s.redis = redis_service(s.cfg.cache.redis_url, s.run, s.cfg.cache.redis_maxmemory_mb,
                                s.cfg.cache.redis_maxmemory_policy)
    time.sleep(2)
    return r


BROKEN = '    { name = "broken_edit", pattern = [[(unclosed]], replacement = "x" },\n'


def f_reload(s: FaultStack, t: Traffic, args) -> FaultResult:
    r = FaultResult("nginx reload x10", "`nginx -s reload` (zccp-stack reload) x10, the 5th and 6th with a "
                    "broken pattern added to the mask file, then the file restored")
    good = s.masks.read_text()
    refused = []
    for n in range(10):
        time.sleep(0.7)
        if n == 4:
            s.masks.write_text(good.replace("return {\n", "return {\n" + BROKEN, 1))
        if n == 6:
            s.masks.write_text(good)
        r.injections.append(time.monotonic())
        m = reload_masks(s.cfg, s.run)
        refused.append(list(m.errors))
    r.extra["refused per reload"] = [len(e) for e in refused]
    time.sleep(1)
    return r


def f_exhaust(s: FaultStack, t: Traffic, args) -> FaultResult:
    r = FaultResult("slot exhaustion", f"{2 * SLOTS} more clients ({2 * SLOTS} on {SLOTS} slots) sending "
                    "long streams for 8 s, then gone")
    hogs = Traffic(s.url, 2 * SLOTS, seed=3)

    async def hog_main() -> None:
        async with httpx.AsyncClient(base_url=s.url, timeout=DEADLINE_MS / 1000 + 10,
                                     limits=httpx.Limits(max_connections=4 * SLOTS)) as c:
            end = time.monotonic() + 8

            async def one(i: int) -> None:
                rng = random.Random(i)
                while time.monotonic() < end:
                    o = await one_request(c, "anthropic", _body("anthropic", 1024, True, False, rng, max_tokens=300),
                                          True, normal=False)
                    hogs.outcomes.append(o)
            await asyncio.gather(*(one(i) for i in range(2 * SLOTS)))

    r.injections.append(time.monotonic())
    asyncio.run(hog_main())
    r.extra["after"] = time.monotonic()
    r.own = hogs.outcomes
    r.extra["429 with Retry-After (all clients)"] = sum(1 for o in hogs.outcomes + t.outcomes if o.status == "429")
    time.sleep(2)
    return r


def f_slow(s: FaultStack, t: Traffic, args) -> FaultResult:
    r = FaultResult("slow-loris + slow uploads", "500 connections sending a header byte every 2 s and 50 "
                    "uploads of a 64 KiB body at 1 KiB/s, for 10 s, while normal traffic runs")
    host, port = s.cfg.server.listen.rsplit(":", 1)
    socks: list[socket.socket] = []
    r.injections.append(time.monotonic())
    for k in range(550):
        so = socket.create_connection((host, int(port)), timeout=5)
        if k < 500:
            so.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\n")
        else:
            so.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: 65536\r\n\r\n")
        so.setblocking(False)
        socks.append(so)
    end = time.monotonic() + 10
    n = 0
    while time.monotonic() < end:
        for k, so in enumerate(socks):
            try:
                if k < 500 and n % 2 == 0:
                    so.send(b"X")
                elif k >= 500:
                    so.send(b" " * 1024)
            except OSError:
                pass
        n += 1
        time.sleep(1)
    for so in socks:
        so.close()
    r.extra["slow connections"] = len(socks)
    time.sleep(1)
    return r


def f_disconnect(s: FaultStack, t: Traffic, args) -> FaultResult:
    r = FaultResult("1,000 mid-stream disconnects", "1,000 clients (50 at a time) that read the first bytes of "
                    "a stream and close the connection")
    own: list[Outcome] = []

    async def main() -> None:
        async with httpx.AsyncClient(base_url=s.url, timeout=DEADLINE_MS / 1000 + 10) as c:
            sem = asyncio.Semaphore(50)

            async def one(i: int) -> None:
                async with sem:
                    api = "anthropic" if i % 2 else "openai"
                    # a fresh connection per client, closed mid-stream
                    # until it gets a stream to walk away from (a 429 is retried, as Retry-After says)
                    while True:
                        async with httpx.AsyncClient(base_url=s.url, timeout=DEADLINE_MS / 1000 + 10) as cc:
                            o = await one_request(cc, api, _body(api, 1024, True, False, random.Random(i),
                                                                 max_tokens=200), True, normal=False,
                                                  abort_after_first_chunk=True)
                        own.append(o)
                        if o.status != "429":
                            break
                        await asyncio.sleep(0.1)
            await asyncio.gather(*(one(i) for i in range(1000)))
            del c

    r.injections.append(time.monotonic())
    asyncio.run(main())
    r.own = own
    time.sleep(1)
    return r


def _stalled_connection(s: FaultStack, i: int) -> socket.socket:
    """A client that asks for a long stream (STALL_TOKENS) on a 2 KiB receive buffer and never
    reads: the connection stays open, the stream stops moving."""
    host, port = s.cfg.server.listen.rsplit(":", 1)
    so = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    so.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    so.connect((host, int(port)))
    api = "anthropic" if i % 2 else "openai"
    body = _body(api, 1024, True, False, random.Random(i), max_tokens=STALL_TOKENS)
    path = "/v1/messages" if api == "anthropic" else "/v1/chat/completions"
    so.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return so


def _closed_by_server(socks: list[socket.socket], guard_s: float = 10.0) -> int:
    """How many of socks the server has closed (read to EOF; guard_s in all), then close them all."""
    closed = 0
    end = time.monotonic() + guard_s
    for so in socks:
        try:
            so.settimeout(max(0.01, end - time.monotonic()))
            while so.recv(65536):
                pass
            closed += 1
        except OSError:
            pass
        so.close()
    return closed


def streams_ended(s: FaultStack, reason: str) -> int:
    """nginx's zccp_nginx_streams_ended_total for `reason`, both APIs."""
    try:
        status, raw = admin_request(s.cfg, "GET", "/metrics")   # the admin listener's
    except OSError:
        return -1
    text = raw.decode("utf-8", "replace") if status == 200 else ""
    return sum(int(float(line.split()[-1])) for line in text.splitlines()
               if line.startswith("zccp_nginx_streams_ended_total{") and f'reason="{reason}"' in line)


def _stalled(s: FaultStack, r: FaultResult, n: int, hold_s: float, during=None) -> None:
    """n stalled readers held for hold_s (during(): another fault meanwhile), then counted."""
    before = streams_ended(s, "stalled")
    socks = [_stalled_connection(s, i) for i in range(n)]
    if during is not None:
        during()
    time.sleep(max(0.0, hold_s))
    r.extra.update({"stalled connections": n, "streams nginx ended as stalled": streams_ended(s, "stalled") - before,
                    "connections the server closed (the others got a whole answer, a 429 or an error that fit "
                    "their buffers, and stay open as keepalive connections)": _closed_by_server(socks)})


def f_stalled_1x(s: FaultStack, t: Traffic, args) -> FaultResult:
    r = FaultResult(f"stalled readers x{SLOTS} + reloads",
                    f"{SLOTS} clients (1x the slots) that ask for a {STALL_TOKENS}-token stream on a 2 KiB receive "
                    f"buffer and never read, held 8 s, with `nginx -s reload` x3 meanwhile "
                    f"(limits.stream_stall_timeout_ms {STALL_MS}, server.send_buffer_kb {SNDBUF_KB})")
    r.injections.append(time.monotonic())

    def reloads() -> None:
        for _ in range(3):
            time.sleep(1.0)
            r.injections.append(time.monotonic())
            reload_masks(s.cfg, s.run)

    _stalled(s, r, SLOTS, 5.0, reloads)
    return r


def f_stalled_2x(s: FaultStack, t: Traffic, args) -> FaultResult:
    r = FaultResult(f"stalled readers x{2 * SLOTS} + engine SIGKILL",
                    f"{2 * SLOTS} stalled readers (2x the slots; as above) held 8 s, the engine SIGKILLed once "
                    "meanwhile")
    r.injections.append(time.monotonic())

    def kill() -> None:   # once the first stalled readers have been ended (stall limit 1.5 s)
        time.sleep(4.0)
        r.injections.append(time.monotonic())
        os.kill(s.engine.pid, signal.SIGKILL)

    _stalled(s, r, 2 * SLOTS, 4.0, kill)
    return r


def f_trickle(s: FaultStack, t: Traffic, args) -> FaultResult:
    r = FaultResult("readers of 1 byte/s", "20 clients that ask for a long stream and read it one byte a "
                    "second, for 10 s")
    before = streams_ended(s, "stalled")
    socks = [_stalled_connection(s, 1000 + i) for i in range(20)]
    r.injections.append(time.monotonic())
    got = 0
    for _ in range(10):
        time.sleep(1.0)
        for so in socks:
            so.setblocking(False)
            try:
                got += len(so.recv(1))
            except OSError:
                pass
    r.extra.update({"bytes read by them": got, "streams nginx ended as stalled": streams_ended(s, "stalled") - before,
                    "connections the server closed": _closed_by_server(socks)})
    return r


FAULTS = {"kill": f_kill, "stop": f_stop, "redis": f_redis, "reload": f_reload, "exhaust": f_exhaust,
          "slow": f_slow, "disconnect": f_disconnect, "stalled1x": f_stalled_1x, "stalled2x": f_stalled_2x,
          "trickle": f_trickle}
