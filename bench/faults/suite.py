"""The fault suite: each fault injected while mixed traffic runs, what every request got.

One command, bounded in time and requests, loopback only:

    python -m bench.faults.suite [--only kill,stop,...] [--kills 20] [--clients 32]

Starts its own stack in bench/out/faults/ (redis + engine + nginx, the null model streaming
a token every 5 ms, the cache on, 48 slots, a 3 s request deadline) and supervises the engine
as zccp-stack does (restart on exit; here with a backoff capped at 1 s so that 20 kills fit in
two minutes: bench/faults/engine_restart.md measures zccp-stack's own path). Mixed traffic
(`Traffic`): c=32 clients, 1 KiB and 64 KiB bodies, streams and not, cache hits (8 prompts
that repeat) and misses (unique), both APIs. For each fault: 4 s of traffic without it (the
baseline p99), the fault, then the traffic stops and the stack settles. Its null reply is
~1,600 bytes (a stream of up to 600 tokens within the deadline), each client connection's kernel
send buffer 16 KiB (server.send_buffer_kb) and the stall limit 1.5 s, so that a client that
stops reading stalls a relay as it would on a real network (on loopback the kernel would
otherwise buffer megabytes): the stalled-reader faults (issue 20).

Every answer is classified: 2xx (a complete JSON answer, or a stream that ends properly);
API-shaped error (a JSON error of the API called, 429/503 with Retry-After, or a stream
that ends with the API's error event); anything else (a non-API body, a reset, a stream cut
without an error event, no answer within deadline + 10 s): must be 0. Results go to
bench/faults/results.json and the tables in bench/faults/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from tests.support.checkout import REPO, require_this_checkout
from zccp.config import load_config
from zccp.ops.admin_client import admin_request
from zccp.paths import lua_file
from zccp.runtime import resolve
from zccp.ops.stack import (
    Backoff,
    Supervisor,
    engine_service,
    free_port,
    nginx_service,
    redis_service,
    reload_masks,
)

OUT = REPO / "bench" / "out" / "faults"
RESULTS_JSON = REPO / "bench" / "faults" / "results.json"
REPORT = REPO / "bench" / "faults" / "RESULTS.md"
SLOTS = 48
DEADLINE_MS = 3000
HIT_PROMPTS = 8
# Stalled readers (issue 20): a reply long enough that a stream outgrows a connection's kernel
# send buffer (fixed at SNDBUF_KB: on loopback autotuning would grow it to megabytes), and a
# stall limit inside the deadline.
REPLY = "The null model's reply, long enough to stream for the whole request deadline. " * 20
STALL_TOKENS = 1500
STALL_MS = 1500
SNDBUF_KB = 16


# --- the traffic -----------------------------------------------------------------------------

@dataclass
class Outcome:
    sent: float
    done: float
    cls: str            # "2xx", "api", "other"
    status: str         # "200", "429", "200+sse-error", "reset", ...
    normal: bool        # the mixed traffic (not a fault's own clients)


def _body(api: str, size: int, stream: bool, hit: bool, rng: random.Random, max_tokens: int = 32) -> bytes:
    prompt = f"prompt {rng.randrange(HIT_PROMPTS)}" if hit else f"unique {uuid.uuid4().hex}"
    pad = max(0, size - 200 - len(prompt))
    text = prompt + " " + "lorem ipsum " * (pad // 12)
    doc = {"model": "zccp-tiny", "max_tokens": max_tokens, "temperature": 0, "stream": stream,
           "messages": [{"role": "user", "content": text}]}
    return json.dumps(doc).encode()


def classify(api: str, stream: bool, status: int, headers: httpx.Headers, data: bytes) -> tuple[str, str]:
    """(class, status label) of one complete answer."""
    if status == 200 and stream:
        if (b"event: message_stop" in data) if api == "anthropic" else (b"data: [DONE]" in data):
            return "2xx", "200"
        if (b"event: error" in data) if api == "anthropic" else (b'data: {"error"' in data):
            return "api", "200+sse-error"
        return "other", "200-cut-stream"
    try:
        doc = json.loads(data)
    except ValueError:
        return "other", f"{status}-not-json"
    if status == 200:
        ok = doc.get("type") == "message" if api == "anthropic" else doc.get("object") == "chat.completion"
        return ("2xx", "200") if ok else ("other", "200-bad-body")
    shaped = (doc.get("type") == "error" and "type" in doc.get("error", {})) if api == "anthropic" else \
        isinstance(doc.get("error"), dict) and "message" in doc["error"]
    if not shaped:
        return "other", f"{status}-not-api"
    if status in (429, 503) and "retry-after" not in headers:
        return "other", f"{status}-no-retry-after"
    return "api", str(status)


class Traffic:
    """c clients in one asyncio loop of its own thread; each sends one request after the other."""

    def __init__(self, url: str, clients: int, seed: int = 0) -> None:
        self.url = url
        self.clients = clients
        self.outcomes: list[Outcome] = []
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._extra: list = []

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    async def _main(self) -> None:
        limits = httpx.Limits(max_connections=self.clients * 4, max_keepalive_connections=self.clients * 4)
        async with httpx.AsyncClient(base_url=self.url, timeout=DEADLINE_MS / 1000 + 10, limits=limits) as c:
            await asyncio.gather(*(self._client(c, i) for i in range(self.clients)))

    async def _client(self, c: httpx.AsyncClient, i: int) -> None:
        rng = random.Random(self._rng.random())
        while not self._stop.is_set():
            api = rng.choice(["anthropic", "openai"])
            stream = rng.random() < 0.5
            body = _body(api, rng.choice([1024, 65536]), stream, rng.random() < 0.5, rng)
            out = await one_request(c, api, body, stream, normal=True)
            self.outcomes.append(out)
            if out.cls != "2xx":
                await asyncio.sleep(0.05)      # a client honouring Retry-After, only faster

    def window(self, t0: float, t1: float, normal_only: bool = True) -> list[Outcome]:
        return [o for o in list(self.outcomes) if t0 <= o.sent < t1 and (o.normal or not normal_only)]


async def one_request(c: httpx.AsyncClient, api: str, body: bytes, stream: bool, normal: bool,
                      abort_after_first_chunk: bool = False) -> Outcome:
    path = "/v1/messages" if api == "anthropic" else "/v1/chat/completions"
    sent = time.monotonic()
    for attempt in (1, 2):
        answered = False
        try:
            async with c.stream("POST", path, content=body, headers={"content-type": "application/json"}) as r:
                answered = True
                if abort_after_first_chunk and r.status_code == 200:
                    async for _ in r.aiter_raw():
                        break                       # the client goes away mid-stream
                    return Outcome(sent, time.monotonic(), "aborted", "client-abort", normal)
                data = await r.aread()
            cls, label = classify(api, stream, r.status_code, r.headers, data)
        except httpx.TimeoutException:
            cls, label = "other", "hang"
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            if not answered and attempt == 1:
                # The connection closed before any byte of an answer: nginx closing an idle
                # keepalive connection (a reload's old worker) just as the request went out.
                # The official SDKs retry exactly this (max_retries); so does this client, once,
                # and the retries are counted apart.
                RETRIED[label_of(exc)] += 1
                continue
            cls, label = "other", type(exc).__name__ + ("" if answered else "-before-answer")
        except httpx.HTTPError as exc:
            cls, label = "other", type(exc).__name__
        return Outcome(sent, time.monotonic(), cls, label, normal)
    raise AssertionError("unreachable")


RETRIED: Counter = Counter()       # connection closed before any answer, retried once


def label_of(exc: Exception) -> str:
    return type(exc).__name__


# --- the stack ---------------------------------------------------------------------------------

class FaultStack:
    def __init__(self, run: Path, slots: int = SLOTS, redis_mb: int | None = None) -> None:
        if run.exists():
            shutil.rmtree(run)
        run.mkdir(parents=True)
        self.run = run
        tag = uuid.uuid4().hex[:8]
        self.masks = run / "mask_patterns.lua"
        shutil.copy(lua_file("mask_patterns.lua"), self.masks)
        raw = yaml.safe_load((REPO / "config.yaml").read_text())
        raw["server"].update(listen=f"127.0.0.1:{free_port()}", socket_path=f"/tmp/zccp-faults-{tag}/doorbell.sock",
                             send_buffer_kb=SNDBUF_KB)
        raw["shared_memory"].update(name=f"/zccp.faults.{tag}", segment_count=slots)
        raw["cache"].update(enabled=True, redis_url=f"redis://127.0.0.1:{free_port()}/0", mask_patterns=str(self.masks))
        if redis_mb is not None:
            raw["cache"]["redis_maxmemory_mb"] = redis_mb
        raw["model"].update(backend="null", null_token_delay_ms=5, max_context=131072, null_reply=REPLY)
        raw["limits"].update(request_timeout_ms=DEADLINE_MS, stream_stall_timeout_ms=STALL_MS)
        raw.setdefault("logging", {})["level"] = "warning"
        self.config_path = run / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(raw))
        self.cfg = resolve(load_config(self.config_path), run)
        self.url = f"http://{self.cfg.server.listen}"
        self.redis = redis_service(self.cfg.cache.redis_url, run, self.cfg.cache.redis_maxmemory_mb,
                                   self.cfg.cache.redis_maxmemory_policy)
        self.engine = engine_service(self.config_path, self.cfg, run, {"OMP_NUM_THREADS": "1"})
        self.nginx, _ = nginx_service(self.cfg, run)
        self._stopping = threading.Event()
        # the engine's restarts: the suite's own supervisor, in the main thread's lifetime
        self.supervisor = Supervisor(self.cfg, self.engine, [], Backoff(first_s=0.2, max_s=1.0, stable_s=10.0))
        self._sup = threading.Thread(target=self.supervisor.run, args=(self._stopping.is_set,), daemon=True)
        self._sup.start()

    def health(self) -> dict | None:
        try:
            r = httpx.get(self.url + "/health", timeout=2)
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def settle(self, timeout: float = 20.0) -> dict:
        """Until no slot is claimed or busy (or timeout): the last /health seen."""
        end = time.monotonic() + timeout
        h: dict = {}
        while time.monotonic() < end:
            h = self.health() or {}
            if h.get("slots_claimed") == 0 and h.get("slots_busy") == 0:
                return h
            time.sleep(0.1)
        return h

    def serving(self, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while self.health() is None:
            if time.monotonic() > end:
                raise RuntimeError("the stack is not healthy")
            time.sleep(0.1)

    def stop(self) -> None:
        self._stopping.set()
        self._sup.join(5)
        for svc in (self.nginx, self.engine, self.redis):
            svc.stop()
        shutil.rmtree(Path(self.cfg.server.socket_path).parent, ignore_errors=True)


# --- the faults ----------------------------------------------------------------------------------

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


def p99(xs: list[Outcome]) -> float | None:
    lat = sorted((o.done - o.sent) * 1000 for o in xs if o.cls == "2xx")
    if len(lat) < 2:
        return None
    return statistics.quantiles(lat, n=100)[98]


def recovery(t: Traffic, injections: list[float], fault_end: float) -> float:
    """Max over injections: the time from the injection (or the fault's end, for faults that
    last) to the first 2xx completed for a request sent after it."""
    worst = 0.0
    points = injections + [fault_end]
    for at in points:
        ok = [o.done for o in t.outcomes if o.normal and o.sent >= at and o.cls == "2xx"]
        worst = max(worst, (min(ok) - at) if ok else float("inf"))
    return worst


def run_fault(name: str, s: FaultStack, args) -> dict:
    RETRIED.clear()
    t = Traffic(s.url, args.clients, seed=hash(name) & 0xFFFF)
    s.serving()
    s.settle()
    t.start()
    time.sleep(4)
    base_t1 = time.monotonic()
    res = FAULTS[name](s, t, args)
    res.t0, res.t1 = base_t1, time.monotonic()
    time.sleep(2)                                    # traffic after the fault: served again
    t.stop()
    after = s.settle()
    normal = t.window(base_t1, time.monotonic())
    baseline = t.window(0, base_t1)
    every = normal + res.own
    statuses = Counter(o.status for o in every if o.cls == "api")
    others = Counter(o.status for o in every if o.cls == "other")
    out = {
        "fault": res.name, "what": res.what, "sent": len(every),
        "sent_normal": len(normal), "sent_fault_clients": len(res.own),
        "ok": sum(1 for o in every if o.cls == "2xx"),
        "api_errors": sum(statuses.values()), "api_statuses": dict(statuses),
        "other": sum(others.values()), "other_kinds": dict(others),
        "client_aborts": sum(1 for o in every if o.cls == "aborted"),
        "slots_claimed_after": after.get("slots_claimed"), "slots_busy_after": after.get("slots_busy"),
        "recovery_s": recovery(t, res.injections, res.extra.pop("after", res.t1) if name == "exhaust" else res.t1),
        "p99_ms_during": p99(t.window(base_t1, res.t1)), "p99_ms_without": p99(baseline),
        "injections": len(res.injections), "extra": res.extra,
        "engine_restarts": s.supervisor.restarts,
        "retried_before_answer": dict(RETRIED),
    }
    print(f"{res.name}: sent {out['sent']}, 2xx {out['ok']}, api {dict(statuses)}, OTHER {dict(others)}, "
          f"claimed after {out['slots_claimed_after']}, recovery {out['recovery_s']:.2f} s, "
          f"p99 {out['p99_ms_during']} vs {out['p99_ms_without']} ms", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(FAULTS), help=f"subset of {','.join(FAULTS)}")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--report", action="store_true", help="only re-render RESULTS.md from results.json")
    args = ap.parse_args()
    require_this_checkout()
    if args.report:
        write_report(json.loads(RESULTS_JSON.read_text()))
        return
    started = time.monotonic()
    s = FaultStack(OUT)
    rows = []
    try:
        warm = Traffic(s.url, args.clients, seed=1)      # not measured: caches, first requests
        warm.start()
        time.sleep(5)
        warm.stop()
        for name in args.only.split(","):
            rows.append(run_fault(name.strip(), s, args))
    finally:
        s.stop()
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    rows = _with_earlier_rows(rows, commit + ("+dirty" if dirty else ""))
    result = {"commit": commit + ("+dirty" if dirty else ""), "argv": sys.argv[1:], "rows": rows,
              "seconds": round(time.monotonic() - started),
              "machine": f"{platform.node()}, {os.cpu_count()} cores, {platform.platform()}",
              "clients": args.clients, "slots": SLOTS, "deadline_ms": DEADLINE_MS}
    RESULTS_JSON.write_text(json.dumps(result, indent=1, default=str))
    write_report(result)


def _with_earlier_rows(rows: list[dict], commit: str) -> list[dict]:
    """A run of some faults (--only) replaces their rows; the other faults' rows of the last
    results stay, each marked with the commit it was measured at."""
    for x in rows:
        x["commit"] = commit
    if not RESULTS_JSON.exists():
        return rows
    earlier = json.loads(RESULTS_JSON.read_text())
    mine = {x["fault"] for x in rows}
    kept = [dict(x, commit=x.get("commit", earlier["commit"])) for x in earlier["rows"] if x["fault"] not in mine]
    return kept + rows


def _fmt(v, nd: int = 0) -> str:
    if v is None:
        return "–"
    if v == float("inf"):
        return "never"
    return f"{v:.{nd}f}"


def write_report(r: dict) -> None:
    rows = []
    for x in r["rows"]:
        st = ", ".join(f"{k}: {v}" for k, v in sorted(x["api_statuses"].items())) or "–"
        oth = f"**{x['other']}**" + (f" ({', '.join(f'{k}: {v}' for k, v in x['other_kinds'].items())})"
                                      if x["other"] else "")
        rows.append(f"| {x['fault']} ({x.get('commit', r['commit'])}) | "
                    f"{x['sent']} ({x['sent_fault_clients']} by the fault's clients) | {x['ok']} | "
                    f"{x['api_errors']} ({st}) | {oth} | **{x['slots_claimed_after']}** | {_fmt(x['recovery_s'], 2)} | "
                    f"{_fmt(x['p99_ms_during'])} / {_fmt(x['p99_ms_without'])} |")
    notes = "\n".join(f"- **{x['fault']}**: {x['what']}." + (f" {x['extra']}" if x["extra"] else "")
                      + (f" Client aborts (by design): {x['client_aborts']}." if x["client_aborts"] else "")
                      + (f" Connections closed before any answer, retried once as the SDKs do (then counted "
                         f"by their final answer): {x['retried_before_answer']}."
                         if x.get("retried_before_answer") else "")
                      for x in r["rows"])
    table = f"""<!-- faults -->
Last run at commit {r['commit']} (each row names the commit it was measured at); \
`python -m bench.faults.suite {' '.join(r['argv'])}` ({r['seconds']} s); {r['machine']};
{r['clients']} clients of mixed traffic, {r['slots']} slots, request deadline {r['deadline_ms']} ms, null model
(a token every 5 ms), cache on.

| fault | requests sent | 2xx | API-shaped errors (statuses) | anything else (must be 0) | \
slots claimed after settling (must be 0) | time until served again (s) | \
p99 of normal 2xx during / without the fault (ms) |
|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

{notes}
<!-- /faults -->"""
    empty = "# Faults, soak and hostile input\n\n<!-- faults -->\n<!-- /faults -->\n"
    text = REPORT.read_text() if REPORT.exists() else empty
    a, b = "<!-- faults -->", "<!-- /faults -->"
    REPORT.write_text(text[: text.index(a)] + table + text[text.index(b) + len(b):])


if __name__ == "__main__":
    main()
