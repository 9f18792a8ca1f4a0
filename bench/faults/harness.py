"""The fault suite's stack and traffic (bench.faults.suite, bench.faults.soak): its settings, the
mixed traffic with every answer classified, and the stack (redis + engine + nginx) under the suite's
own supervisor."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from tests.support.checkout import REPO
from zccp.config import load_config
from zccp.config.paths import lua_file
from zccp.config.runtime import resolve
from zccp.ops.supervisor import Supervisor
from zccp.ops.stack import (
    engine_service,
    free_port,
    nginx_service,
    redis_service,
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
        self.supervisor = Supervisor(self.cfg, [(self.engine, self.cfg.server.socket_path or "")], [])
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
