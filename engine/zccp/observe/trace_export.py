"""Request traces, the engine's side (imported only when tracing is on: zccp.observe.tracing).

A traced request costs the event loop a few attribute reads and one tuple: `RequestTrace`
keeps the request's times as plain numbers, and its `end` appends one record to a bounded
list (full: the record is dropped and its spans counted, never waited for). The event loop
marshals the list in batches to the span process (zccp.observe.trace_spans, a child of the engine;
zccp.observe.trace_pipe: no second Python thread),
which encodes the spans as OTLP protobuf and sends them with the OpenTelemetry SDK's
OTLP/HTTP exporter: encoding never runs in the engine's process, so it holds no GIL against
the event loop (docs/observability.md says why, bench/tracing.md what it costs). The span
process reports what it exported or lost on its stdout, counted as zccp_engine_trace_spans_total.

The tree of one request (built by zccp.observe.trace_spans; docs/observability.md):
  chat <model>                 SERVER, from nginx's start to the engine's end; GenAI attributes
    zccp.nginx.admit           nginx's own time before the slot: body, plugins, fingerprint, claim
    zccp.engine.prepare        parse, tokenize, the cache decision (a miss: until the model takes it)
    zccp.cache.replay          a cache hit written into the slot (instead of the four below)
    zccp.queue                 waiting for the decode batch
    zccp.prefill               admission to the first token
    zccp.decode                first token to last token
    chat <upstream model>      CLIENT: the upstream call (model.backend: upstream)
"""

from __future__ import annotations

import logging
import marshal
import os
import pickle
import struct
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from random import getrandbits, random
from typing import TYPE_CHECKING, Any

from zccp.transport.abi import L1_SPAN_SIZE, REQUEST_ID_MAX, TRACESTATE_MAX, Flag, ffi
from zccp.config.sections import TracingConfig
from zccp.observe.trace_pipe import SpanPipe

if TYPE_CHECKING:
    from zccp.observe.metrics import EngineMetrics
    from zccp.prep.outcome import Outcome
    from zccp.shared_types import GenerationResult

log = logging.getLogger("zccp.tracing")

TRACEPARENT_SENT = 0x100      # request.trace_flags: nginx read a valid traceparent (zccp_abi.h)
FRAME = struct.Struct("<I")   # each batch to the span process: its length, then its marshal (or pickle)
PICKLED = 1 << 31             # the length's top bit: a pickle (a value marshal cannot write)


def frame(obj: Any) -> bytes:
    """A batch for the span process: marshal (plain tuples of str, bytes, int, float, None: half
    pickle's time on the event loop), pickle when a value is of another type (an int subclass)."""
    try:
        data, pickled = marshal.dumps(obj), 0
    except ValueError:
        data, pickled = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), PICKLED
    return FRAME.pack(len(data) | pickled) + data
SHUTDOWN_S = 6.0              # the engine's stop waits so long for the last spans
BATCH = 512                   # records per batch (the SDK's BatchSpanProcessor exports 512 spans)
_TENANT = int(Flag.TENANT)
L1 = "l1"                     # an L1 hit's record (the first field; a request's is its ids or None)
_L1 = struct.Struct("=16s8sIIQIII")   # struct zccp_l1_span up to request_id (zccp_abi.h)
CHILDREN = ("zccp.nginx.admit", "zccp.engine.prepare", "zccp.cache.replay", "zccp.queue", "zccp.prefill",
            "zccp.decode")


def span_count(rec: tuple[Any, ...]) -> int:
    """The spans a record makes (zccp.observe.trace_spans): the root, nginx's, prepare or replay, the
    queue once admitted, prefill and decode once a token came, the upstream call; an L1 hit's one."""
    if rec[0] == L1:
        return 1
    _, admitted, first, _ = rec[7]
    return 3 + bool(admitted) + 2 * bool(first) + (rec[9] is not None)


def l1_records(payload: memoryview | bytes) -> list[tuple[Any, ...]]:
    """The records of struct zccp_l1_span in a payload, each field bounded (untrusted: a
    partial record at the end is ignored, a request id cut to its length and bound)."""
    size = L1_SPAN_SIZE
    data = bytes(payload[: len(payload) - len(payload) % size])
    out = []
    for off in range(0, len(data), size):
        tid, sid, flags, status, start, dur, api, rid_len = _L1.unpack_from(data, off)
        rid = data[off + _L1.size: off + _L1.size + min(rid_len, REQUEST_ID_MAX)].decode("ascii", "replace")
        out.append((L1, tid if flags & TRACEPARENT_SENT else None, sid, flags & 0x1FF,
                    status if status < 1000 else 0, start, min(dur, 3_600_000_000),
                    "openai" if api == 1 else "anthropic", rid if rid.isprintable() else ""))
    return out


def _sampler_from_env() -> tuple[float, bool]:
    """(ratio, parent-based) of OTEL_TRACES_SAMPLER/_ARG, read with the SDK's own parser."""
    from opentelemetry.sdk.trace import sampling

    s: Any = sampling._get_from_env_or_default()
    parent_based = isinstance(s, sampling.ParentBased)
    root = s._root if parent_based else s
    if isinstance(root, sampling.TraceIdRatioBased):
        return float(root.rate), parent_based
    if root is sampling.ALWAYS_OFF or isinstance(root, sampling.StaticSampler) and \
            root.get_description() == "AlwaysOffSampler":
        return 0.0, parent_based
    return 1.0, parent_based


def schedule_delay() -> float:
    """OTEL_BSP_SCHEDULE_DELAY (ms), the SDK's batch delay, honoured for the pipe's batches."""
    try:
        return max(1, min(int(os.environ.get("OTEL_BSP_SCHEDULE_DELAY", "5000")), 60_000)) / 1000
    except ValueError:
        return 5.0


class RequestTracer:
    def __init__(self, cfg: TracingConfig, metrics: EngineMetrics, model: str, engine: str,
                 server_address: str) -> None:
        # the config's ratio, parent-based; OTEL_TRACES_SAMPLER wins as the SDK's environment does
        self._ratio, self._parent_based = (_sampler_from_env() if os.environ.get("OTEL_TRACES_SAMPLER")
                                           else (cfg.sample_ratio, True))
        self._max = cfg.max_queue
        self._dropped = metrics.trace_spans.series(result="dropped")
        self._counted = {"exported": metrics.trace_spans.series(result="exported"),
                         "failed": metrics.trace_spans.series(result="failed"),
                         "invalid": metrics.trace_spans.series(result="invalid")}   # records, not spans
        self._records: deque[tuple[Any, ...]] = deque()   # appended by the requests, taken by the pipe
        host, _, port = server_address.rpartition(":")
        static = {"model": model, "engine": engine, "server.address": host.strip("[]") or server_address,
                  "server.port": int(port) if port.isdigit() else None, "endpoint": cfg.endpoint}
        env = dict(os.environ)
        pkg_root = str(Path(__file__).resolve().parents[2])   # zccp importable in the child as here
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH", "")) if p)
        self._proc = subprocess.Popen([sys.executable, "-m", "zccp.observe.trace_spans"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, env=env, close_fds=True)
        assert self._proc.stdin is not None
        self._proc.stdin.write(frame(static))
        self._proc.stdin.flush()
        self._pipe = SpanPipe(self._proc, self._records, BATCH, schedule_delay(), frame, self._count, self._drop)

    def _count(self, what: str, n: int) -> None:
        series = self._counted.get(what)
        if series is not None:
            series.inc(n)

    def _drop(self, batch: list[tuple[Any, ...]]) -> None:
        self._dropped.inc(sum(span_count(r) for r in batch))

    def begin(self, outcome: Outcome) -> RequestTrace | None:
        """The request's trace, or None when it is not sampled: a client's traceparent decides
        (its sampled flag, parent-based sampling), else the ratio."""
        req = outcome.ctx.view.request
        flags = int(req.trace_flags)
        if flags & TRACEPARENT_SENT and self._parent_based:
            if not flags & 1:
                return None
        elif self._ratio < 1.0 and random() >= self._ratio:
            return None
        return RequestTrace(self, outcome, req, flags)

    @property
    def ratio(self) -> float:
        return self._ratio

    def take_l1(self, payload: memoryview) -> None:
        """nginx's L1 hits (a ZCCP_KIND_SPANS payload) into the queue."""
        for rec in l1_records(payload):
            self.record(rec)

    def record(self, rec: tuple[Any, ...]) -> None:
        """One request's record for the span process (from the event loop: no I/O, no wait)."""
        records = self._records
        n = len(records)
        if n >= self._max:
            self._dropped.inc(span_count(rec))
            return
        records.append(rec)
        if n + 1 == BATCH:
            self._pipe.kick()

    def shutdown(self) -> None:
        """Send what is queued and let the span process export it, for SHUTDOWN_S at most (a
        collector that is down retries each batch up to its timeout: what is left is lost)."""
        end = time.monotonic() + SHUTDOWN_S
        self._pipe.close(SHUTDOWN_S / 2)
        try:
            self._proc.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _tracestate(outcome: Outcome, req: Any) -> str:
    """The client's tracestate nginx wrote after the body (zccp_abi.h), checked as untrusted:
    within its bounds, visible ASCII; "" when not."""
    n = int(req.tracestate_len)
    h = outcome.ctx.view.header
    payload = outcome.ctx.payload
    if n > TRACESTATE_MAX or len(payload) + n > int(h.payload_cap) or not len(payload):
        return ""
    raw = bytes(ffi.buffer(ffi.from_buffer(payload) + len(payload), n))
    text = raw.decode("ascii", "replace")
    return text if text.isprintable() and "\ufffd" not in text else ""


class RequestTrace:
    """One request's times as plain numbers; the spans are made by the span process."""

    __slots__ = ("_t", "_wall0", "_perf0", "_flags", "_ids", "_nginx", "root_id", "trace_id",
                 "_upstream", "_ended", "tracestate")

    def __init__(self, tracer: RequestTracer, outcome: Outcome, req: Any, flags: int) -> None:
        self._t = tracer
        self._wall0 = time.time_ns()
        self._perf0 = outcome.started
        self._flags = flags
        # the client's trace id and span id, as nginx wrote them (raw bytes: decoded by the span process)
        self._ids = (bytes(ffi.buffer(req.trace_id, 16)), bytes(ffi.buffer(req.parent_span_id, 8))) \
            if flags & TRACEPARENT_SENT else None
        self._nginx = (int(req.nginx_start_ns), int(req.nginx_admit_us))
        self.tracestate = _tracestate(outcome, req) if flags & TRACEPARENT_SENT and req.tracestate_len else ""
        self.root_id = 0            # made here only when a child of the root leaves the process
        self.trace_id = 0
        self._upstream: tuple[int, str, int] | None = None
        self._ended = False

    def ids(self) -> tuple[int, int]:
        """The trace id and the root span's id, made here when something outside the span
        process names them (an upstream's traceparent, a histogram's exemplar)."""
        if not self.trace_id:
            ids = self._ids
            tid = int.from_bytes(ids[0], "big") if ids else 0
            self.trace_id = tid or getrandbits(128) or 1
            self.root_id = getrandbits(64) or 1
        return self.trace_id, self.root_id

    def upstream_headers(self, model: str) -> dict[str, str]:
        """The upstream call's span begins; the traceparent to send with it."""
        self.ids()
        span_id = getrandbits(64) or 1
        self._upstream = (span_id, model, time.time_ns())
        headers = {"traceparent": f"00-{self.trace_id:032x}-{span_id:016x}-01"}
        if self.tracestate:
            headers["tracestate"] = self.tracestate     # the client's, kept as W3C asks
        return headers

    def end(self, o: Outcome, status: int, result: GenerationResult | None) -> None:
        """The request's record, at its one ending (a second, e.g. abandoned after answered, adds none)."""
        if self._ended:
            return
        self._ended = True
        view = o.ctx.view
        meta = view.meta
        # plain values only (cdata ints are ints): names and hex are the span process's work
        self._t.record((self._ids, self._flags, self.trace_id, self.root_id, self._nginx, self._wall0, self._perf0,
                        (o.submitted, o.admitted, o.first_token, o.last_token), time.time_ns(), self._upstream,
                        status, meta.cache_status, view.index, o.ctx.request_id, o.codec.name, meta.max_tokens,
                        bytes(ffi.buffer(view.request.tenant, 8)) if view.header.flags & _TENANT else None,
                        (result.input_tokens, result.output_tokens, result.stop_reason) if result is not None
                        else None, o.response_id, self.tracestate))
