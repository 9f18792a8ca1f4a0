"""The span process: `python -m zccp.trace_spans`, started by the engine when tracing is on
(zccp.trace_export). It reads the engine's request records from stdin (frames of a length
and a pickle: the engine's own pipe to its own child), builds each request's spans as the
OpenTelemetry SDK's ReadableSpan, and sends them with the SDK's OTLP/HTTP exporter in
batches of up to 512; on stdout it reports "exported N" or "failed N" per batch for the
engine's counter. Here, not in the engine, so that the SDK's span objects and its protobuf
encoding take no GIL from the engine's event loop (docs/observability.md).

The SDK's TracerProvider and BatchSpanProcessor are not used: the spans of a request are
known whole when its record arrives (no span is live here), the engine's bounded queue and
this process's batches do what the processor would, and the exporter is the SDK's.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from collections.abc import Callable
from random import getrandbits
from typing import IO, Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from zccp.trace_export import BATCH, FRAME

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
SAMPLED = TraceFlags(TraceFlags.SAMPLED)
ERROR = Status(StatusCode.ERROR)
MAX_FRAME = 64 << 20


def read_frame(inp: IO[bytes]) -> Any:
    """The next pickled frame, or None at the end of the pipe (the engine stopped or died)."""
    head = inp.read(FRAME.size)
    if len(head) < FRAME.size:
        return None
    (n,) = FRAME.unpack(head)
    if n > MAX_FRAME:
        raise ValueError(f"a frame of {n} bytes")
    data = inp.read(n)
    return pickle.loads(data) if len(data) == n else None


class SpanBuilder:
    """A record's spans (zccp.trace_export.RequestTrace.end writes it)."""

    def __init__(self, static: dict[str, Any]) -> None:
        attrs: dict[str, Any] = {}
        if not os.environ.get("OTEL_SERVICE_NAME") and "service.name" not in os.environ.get(
                "OTEL_RESOURCE_ATTRIBUTES", ""):
            attrs["service.name"] = "zccp"
        self.resource = Resource.create(attrs)     # made once: every span shares it
        self.scope = InstrumentationScope("zccp")
        self.model: str = static["model"]
        self.root_name = f"chat {self.model}"
        self.fixed: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": self.model,
                                      "server.address": static["server.address"]}
        if static.get("server.port") is not None:
            self.fixed["server.port"] = static["server.port"]
        if static.get("engine"):
            self.fixed["zccp.engine"] = static["engine"]

    def _span(self, out: list[ReadableSpan], name: str, tid: int, parent: SpanContext, start: int, end: int,
              attributes: dict[str, Any] | None = None) -> None:
        out.append(ReadableSpan(name, SpanContext(tid, getrandbits(64) or 1, False, SAMPLED), parent,
                                self.resource, attributes, start_time=start, end_time=end,
                                instrumentation_scope=self.scope))

    def spans(self, rec: tuple[Any, ...]) -> list[ReadableSpan]:
        (ids, flags, tid, root_id, (nginx_start, admit_us), wall0, perf0, (submitted, admitted, first, last),
         now, upstream, status, cache, slot, request_id, api, max_tokens, tenant, usage, response_id) = rec
        parent = None
        if ids is not None:
            sc = SpanContext(int.from_bytes(ids[0], "big"), int.from_bytes(ids[1], "big"), is_remote=True,
                             trace_flags=TraceFlags(flags & 0xFF))
            parent = sc if sc.is_valid else None
        tid = tid or (parent.trace_id if parent is not None else getrandbits(128) or 1)
        root = SpanContext(tid, root_id or getrandbits(64) or 1, False, SAMPLED)
        nginx_start = nginx_start or wall0
        out: list[ReadableSpan] = []
        span = self._span

        def ns(t: float) -> int:
            return wall0 + int((t - perf0) * 1e9)

        if admit_us:
            span(out, "zccp.nginx.admit", tid, root, nginx_start, nginx_start + admit_us * 1000)
        if submitted:
            span(out, "zccp.engine.prepare", tid, root, wall0, ns(submitted), {"zccp.cache.result": cache})
            if admitted:
                span(out, "zccp.queue", tid, root, ns(submitted), ns(admitted))
                if first:
                    span(out, "zccp.prefill", tid, root, ns(admitted), ns(first))
            if first:
                span(out, "zccp.decode", tid, root, ns(first), ns(last) if last else now)
        elif status == 200:
            span(out, "zccp.cache.replay", tid, root, wall0, now, {"zccp.cache.result": cache})
        if upstream is not None:
            up_id, up_model, up_start = upstream
            out.append(ReadableSpan(f"chat {up_model}", SpanContext(tid, up_id, False, SAMPLED), root,
                                    self.resource, {"gen_ai.operation.name": "chat", "gen_ai.request.model": up_model},
                                    kind=SpanKind.CLIENT, status=ERROR if status != 200 else Status(),
                                    start_time=up_start, end_time=now, instrumentation_scope=self.scope))
        attrs = dict(self.fixed)
        attrs.update({"http.response.status_code": status, "zccp.cache.result": cache, "zccp.slot": slot,
                      "zccp.request_id": request_id, "zccp.api": api})
        if max_tokens:
            attrs["gen_ai.request.max_tokens"] = max_tokens
        if tenant is not None:
            attrs["zccp.tenant"] = tenant.hex()     # a digest's first 8 bytes
        if usage is not None:
            attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"] = usage[0], usage[1]
            attrs["gen_ai.response.finish_reasons"] = (usage[2],)
        if response_id:
            attrs["gen_ai.response.id"] = response_id
        out.append(ReadableSpan(self.root_name, root, parent, self.resource, attrs, kind=SpanKind.SERVER,
                                status=ERROR if status >= 500 else Status(),
                                start_time=min(nginx_start, wall0), end_time=now,
                                instrumentation_scope=self.scope))
        return out


def export(exporter: OTLPSpanExporter, spans: list[ReadableSpan], report: Callable[[str, int], None]) -> None:
    for i in range(0, len(spans), BATCH):
        chunk = spans[i:i + BATCH]
        try:
            ok = exporter.export(chunk) is SpanExportResult.SUCCESS
        except Exception:      # an exporter bug loses this batch, not the process
            ok = False
        report("exported" if ok else "failed", len(chunk))


def main() -> None:
    # the engine's signals are the engine's: this process ends when its pipe does
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr            # nothing else may write into the counts

    def report(what: str, n: int) -> None:
        out.write(f"{what} {n}\n".encode())
        out.flush()

    static = read_frame(inp)
    if static is None:
        return
    builder = SpanBuilder(static)
    endpoint = static.get("endpoint") or (None if any(os.environ.get(v) for v in ENDPOINT_VARS)
                                          else "http://localhost:4318/v1/traces")
    exporter = OTLPSpanExporter(endpoint=endpoint, timeout=5)
    try:
        while (batch := read_frame(inp)) is not None:
            spans: list[ReadableSpan] = []
            for rec in batch:
                spans.extend(builder.spans(rec))
            export(exporter, spans, report)
    finally:
        exporter.shutdown()


if __name__ == "__main__":
    main()
