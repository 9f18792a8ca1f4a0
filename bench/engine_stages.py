"""The engine's per-request cost, stage by stage, without HTTP (issue 29): a null-model MISS
(no-cache, no-store) of an Anthropic body, driven through the engine's own functions in
process, each stage the least of --repeats runs of --n calls, in CPU time of the calling thread (the
machine is shared: wall-clock time would count other processes' turns; the minimum is the
least disturbed figure).

    PYTHONPATH=engine python -m bench.engine_stages [--sizes 1k,512k] [--n 2000] [--repeats 7] [--json F]

Stages (what one request pays on the engine's loop, in order):
  doorbell.read   one ring frame through the doorbell protocol's buffer_updated()
  decode          codec.decode (orjson over the slot's payload, a memoryview)
  parse           codec.parse (the body validated into a GenerationRequest)
  tokenize        the backend's PromptFormat.encode_into, into an int32 slot-sized array
  generate        generate_text with the null backend (the fixed reply)
  render          codec.render (the non-streamed response body)
  doorbell.write  encode_notice (one final notice)
  flow            RequestFlow(...).start(), start to finish (the stages above but the
                  doorbell, plus the flow's own objects, the outcome, the metrics and the
                  log line), with a recording writer in place of the slot's response ring
                  and the cache's BYPASS decision (D-nocache's path)
  engine          a real Engine (arena, cache enabled, D-nocache's config) from a decoded ring
                  to the final notice handed to the connection: Engine._on_ring (slot checks,
                  the job), Engine._start (the context, the ResponseWriter), the flow, the
                  answer written into the slot's response ring; the slot refilled as nginx
                  does (its header fields; the body copied once) before each ring. No socket:
                  the notice is kept by a recording transport

Run it for a baseline from another checkout with that checkout's engine first on
PYTHONPATH (bench/README.md); compare figures from one session, interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import torch

from bench.bodies import synthetic_body
from zccp.transport.abi import Flag, Op, State
from zccp.api import api_for, codec_for
from zccp.api.common import ParseLimits
from zccp.config import CacheConfig
from zccp.config import load_config
from zccp.transport.doorbell import Connection, Ring, _RingProtocol, encode_notice, encode_ring
from zccp.process.engine import Engine
from zccp.prep.flow import FlowDeps, RequestFlow
from zccp.observe.logs import RequestLog
from zccp.observe.metrics import EngineMetrics
from zccp.model.null import NullBackend
from zccp.model.prompt import Prompt
from zccp.prep.outcome import RequestContext
from zccp.config.runtime import resolve
from zccp.serving.text_assembly import generate_text

MODEL = "zccp-null"
SIZES = {"1k": 1024, "64k": 64 * 1024, "512k": 512 * 1024}
TOKENS = 589_824            # bench's slot token array (bench/README.md: 2304 KiB of int32)


def best_us(fn: Callable[[], object], n: int, repeats: int) -> float:
    """CPU µs per call (this thread's CPU time: on a shared machine wall-clock time counts
    the other processes' turns too): the least of `repeats` runs of n calls."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.thread_time_ns() - t0) / n / 1000)
    return best


class _Writer:
    """The slot's response ring, minus the ring: what the flow writes, kept."""

    started = False

    def set_meta(self, **fields: Any) -> bool:
        return True

    def answer(self, status: int, sse: bool, data: bytes) -> None:
        self.last = (status, data)


class _Cache:
    """Just enough ResponseCache for the flow's bypass decision (never looked up)."""

    def __init__(self) -> None:
        self.cfg = CacheConfig()


def _header(flags: int) -> Any:
    return SimpleNamespace(flags=flags, generation=1, tokens_len=0, deadline_ns=0)


def flow_runner(body: bytes, tokens: torch.Tensor, backend: NullBackend) -> Callable[[], object]:
    metrics = EngineMetrics()
    deps = FlowDeps(backend=backend, limits=ParseLimits(frozenset({MODEL}), 1 << 20, 4096),
                    input_view=lambda t: t, device_id=-1, metrics=metrics, model=None,  # type: ignore[arg-type]
                    cache=_Cache(), masks=object(),  # type: ignore[arg-type]
                    inline=True, spawn=lambda c: None, call_soon=lambda *a: None,
                    request_log=RequestLog(defer=lambda fn: fn()))
    view = SimpleNamespace(header=_header(Flag.NO_CACHE | Flag.NO_STORE), request=SimpleNamespace(openai_api=0),
                           meta=SimpleNamespace(cache_status=0), index=0)
    writer = _Writer()
    done: list[int] = []
    host = tokens.numpy()

    def one() -> None:
        ctx = RequestContext(view=view, generation=1, payload=memoryview(body), tokens=tokens,  # type: ignore[arg-type]
                             host_tokens=host, writer=writer, cancelled=lambda: False, context_id="", request_id="")  # type: ignore[arg-type]
        RequestFlow(ctx, deps, lambda: done.append(1)).start()

    one()
    status, data = writer.last
    assert status == 200 and b'"type":"message"' in data, data[:200]
    return one


class _Transport:
    """The doorbell connection's transport, minus the socket: the last notice kept."""

    last = b""

    def write(self, data: bytes) -> None:
        self.last = data

    def close(self) -> None:
        pass


class _Loop:
    """Connection's loop: its one-turn flush runs at once (one notice per request here)."""

    def call_soon(self, fn: Callable[..., object], *args: object) -> None:
        fn(*args)


def engine_runner(body: bytes, run_dir: Path) -> tuple[Callable[[], object], Callable[[], None]]:
    """(one request through a real Engine, its tear-down): bench.services.start_d's config."""
    import yaml
    run_dir.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}.{run_dir.name}"
    raw = {"server": {"listen": "127.0.0.1:1", "socket_path": f"{run_dir}/doorbell.sock"},
           "shared_memory": {"name": f"/zccp.stages.{tag}", "segment_count": 2, "segment_size_kb": 3072,
                             "tokens_kb": 2304, "response_kb": 64},
           "cache": {"enabled": True, "redis_url": "redis://127.0.0.1:1/0"},
           "model": {"backend": "null", "name": MODEL, "max_context": 1 << 20, "threads": 1},
           "limits": {"max_body_kb": 600, "request_timeout_ms": 60000},
           "logging": {"level": "warning"}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(raw))
    engine = Engine(resolve(load_config(run_dir / "config.yaml"), run_dir))
    engine.arena.publish(f"{run_dir}/doorbell.sock")
    transport = _Transport()
    conn = Connection(transport, _Loop())  # type: ignore[arg-type]
    view = engine.arena.slot(0)
    h = view.header
    start = view.base + engine.layout.payload_offset
    engine.arena.mapping()[start:start + len(body)] = body
    flags = int(Flag.NO_CACHE | Flag.NO_STORE)

    def one() -> None:
        # nginx's fill_slot, less the body copy and the SHA-256 (lua/zccp/core/transport.lua)
        gen = h.generation + 1
        h.generation = gen
        h.deadline_ns = time.time_ns() + 60_000_000_000
        h.payload_len = len(body)
        h.status = h.response_len = h.response_acked = h.tokens_len = 0
        h.flags = flags
        h.state = State.READY
        engine._on_ring(conn, Ring(Op.RING, 0, gen))
        h.state = State.FREE                       # nginx's release, after the relay

    one()
    notice = transport.last
    assert h.status == 200 and notice and engine.metrics.requests.get(api="anthropic", status="200") == 1, notice
    return one, engine.arena.close


def measure(size: str, n: int, repeats: int, run_dir: Path) -> dict[str, float]:
    body = synthetic_body(SIZES[size], MODEL).encode()
    n = max(20, n if SIZES[size] <= 4096 else n // 50)
    codec = codec_for(api_for(False, 0))
    limits = ParseLimits(frozenset({MODEL}), 1 << 20, 4096)
    backend = NullBackend(name=MODEL, max_context=1 << 20)
    tokens = torch.zeros(TOKENS, dtype=torch.int32)
    mv = memoryview(body)
    doc = codec.decode(mv)
    req = codec.parse(doc, limits)
    fmt = backend.prompt
    prompt_len = fmt.encode_into(Prompt(req, lambda: codec.chat_input(doc)), tokens)
    ids = tokens[:prompt_len]
    result = [ev for ev in generate_text(backend, ids, req.sampling, lambda: False)][-1]

    server = SimpleNamespace(_on_ring=lambda c, r: None, _on_ping=lambda c: None, _conns=set(),
                             _on_close=lambda c: None)
    proto = _RingProtocol(server)  # type: ignore[arg-type]
    proto.conn = Connection(_Transport(), _Loop())  # type: ignore[arg-type]   # nothing is answered here
    frame = encode_ring(1, 3, 7)

    def doorbell_read() -> None:
        buf = proto.get_buffer(-1)
        buf[: len(frame)] = frame
        proto.buffer_updated(len(frame))

    stages: dict[str, Callable[[], object]] = {
        "doorbell.read": doorbell_read,
        "decode": lambda: codec.decode(mv),
        "parse": lambda: codec.parse(doc, limits),
        "tokenize": lambda: fmt.encode_into(Prompt(req, lambda: codec.chat_input(doc)), tokens),
        "generate": lambda: [ev for ev in generate_text(backend, ids, req.sampling, lambda: False)],
        "render": lambda: codec.render(req, result, "msg_0123456789", 1700000000),
        "doorbell.write": lambda: encode_notice(2, 3, 7, 321, 1, 200),
        "flow": flow_runner(body, tokens, backend),
    }
    engine_one, close = engine_runner(body, run_dir / size)
    stages["engine"] = engine_one
    try:
        out = {name: round(best_us(fn, n, repeats), 2) for name, fn in stages.items()}
    finally:
        close()
    out["sum of stages"] = round(sum(v for k, v in out.items() if k not in ("flow", "engine")), 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1k,512k")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", type=Path, help="write {size: {stage: µs}} here")
    ap.add_argument("--label", default="", help="printed with the table (e.g. the commit)")
    args = ap.parse_args()
    import zccp
    print(f"zccp from {Path(zccp.__file__).parent} {args.label}")
    import tempfile
    with tempfile.TemporaryDirectory(prefix="zccp-stages-") as tmp:
        res = {s: measure(s, args.n, args.repeats, Path(tmp)) for s in args.sizes.split(",")}
    names = list(next(iter(res.values())))
    print(f"{'stage (µs, best of ' + str(args.repeats) + ')':<28}" + "".join(f"{s:>12}" for s in res))
    for name in names:
        print(f"{name:<28}" + "".join(f"{res[s][name]:>12.2f}" for s in res))
    if args.json:
        args.json.write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2))
    else:
        print(json.dumps(res))


if __name__ == "__main__":
    main()
