"""Request spans over OTLP/HTTP with the OpenTelemetry SDK (imported only when tracing is
on: zccp.tracing). Spans are made when a request ends, from the times its Outcome kept
(one span live per request, the root, so that an upstream call can be its child): the
event loop does no export and no I/O; BatchSpanProcessor's thread sends, its queue is
bounded, and a span that does not fit is dropped and counted, never waited for.

The tree of one request (docs/observability.md):
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

import time
from collections.abc import Sequence
from random import random
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.propagate import get_global_textmap
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)

from zccp.abi import CACHE_NAMES, Flag, ffi
from zccp.config_sections import TracingConfig

if TYPE_CHECKING:
    from zccp.metrics import EngineMetrics
    from zccp.outcome import Outcome
    from zccp.shared_types import GenerationResult

TRACEPARENT_SENT = 0x100      # request.trace_flags: nginx read a valid traceparent (zccp_abi.h)


class CountingExporter(SpanExporter):
    """The OTLP exporter, counting the spans it sent and those a failed export lost."""

    def __init__(self, inner: SpanExporter, metrics: EngineMetrics) -> None:
        self._inner = inner
        self._sent = metrics.trace_spans.series(result="exported")
        self._failed = metrics.trace_spans.series(result="failed")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._inner.export(spans)
        except Exception:     # an exporter bug must not kill the processor's thread
            result = SpanExportResult.FAILURE
        (self._sent if result is SpanExportResult.SUCCESS else self._failed).inc(len(spans))
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class CountingProcessor(BatchSpanProcessor):
    """BatchSpanProcessor, counting the spans its full queue drops (the SDK only logs them)."""

    def __init__(self, exporter: SpanExporter, metrics: EngineMetrics, max_queue: int) -> None:
        super().__init__(exporter, max_queue_size=max_queue)
        self._dropped = metrics.trace_spans.series(result="dropped")
        inner = getattr(self, "_batch_processor", None)
        self._queue: Any = getattr(inner, "_queue", None)
        self._max = max_queue

    def on_end(self, span: ReadableSpan) -> None:
        if self._queue is not None and len(self._queue) >= self._max:
            self._dropped.inc()
        super().on_end(span)


class RequestTracer:
    def __init__(self, cfg: TracingConfig, metrics: EngineMetrics, model: str, engine: str,
                 server_address: str) -> None:
        import os

        attrs: dict[str, Any] = {}
        if not os.environ.get("OTEL_SERVICE_NAME") and "service.name" not in os.environ.get(
                "OTEL_RESOURCE_ATTRIBUTES", ""):
            attrs["service.name"] = "zccp"
        sampler = None if os.environ.get("OTEL_TRACES_SAMPLER") else ParentBased(TraceIdRatioBased(cfg.sample_ratio))
        # the config's ratio decided before any span is made (the SDK's sampler decides again,
        # alike): a request left out costs a flag read and a random number, not a span
        self._ratio = 1.0 if sampler is None else cfg.sample_ratio
        self.provider = TracerProvider(resource=Resource.create(attrs), sampler=sampler)
        # the config's URL, else the SDK's OTEL_EXPORTER_OTLP_* (an empty one, as compose passes an
        # unset variable, is not a URL: the OTLP default then)
        from zccp.tracing import ENDPOINT_VARS

        endpoint = cfg.endpoint or (None if any(os.environ.get(v) for v in ENDPOINT_VARS)
                                    else "http://localhost:4318/v1/traces")
        exporter = OTLPSpanExporter(endpoint=endpoint, timeout=5)
        self.provider.add_span_processor(CountingProcessor(CountingExporter(exporter, metrics), metrics,
                                                           cfg.max_queue))
        self.tracer = self.provider.get_tracer("zccp")
        self.model = model
        self.engine = engine
        host, _, port = server_address.rpartition(":")
        self.server = (host.strip("[]") or server_address, int(port) if port.isdigit() else None)

    def begin(self, outcome: Outcome) -> RequestTrace | None:
        """The request's trace, or None when it is not sampled: a client's traceparent decides
        (its sampled flag), else the ratio."""
        flags = int(outcome.ctx.view.request.trace_flags)
        if flags & TRACEPARENT_SENT:
            if not flags & 1:
                return None
        elif self._ratio < 1.0 and random() >= self._ratio:
            return None
        return RequestTrace(self, outcome)

    def shutdown(self) -> None:
        self.provider.shutdown()


def _parent(req: Any) -> otel_context.Context:
    """The client's traceparent as nginx wrote it into the slot, or an empty context (a new trace)."""
    flags = int(req.trace_flags)
    if not flags & TRACEPARENT_SENT:
        return otel_context.Context()
    sc = SpanContext(int.from_bytes(bytes(ffi.buffer(req.trace_id, 16)), "big"),
                     int.from_bytes(bytes(ffi.buffer(req.parent_span_id, 8)), "big"),
                     is_remote=True, trace_flags=TraceFlags(flags & 0xFF))
    if not sc.is_valid:
        return otel_context.Context()
    return set_span_in_context(NonRecordingSpan(sc))


class RequestTrace:
    """One request's spans: the root started now (at nginx's start), the rest at its end."""

    def __init__(self, tracer: RequestTracer, outcome: Outcome) -> None:
        self._t = tracer
        self._wall0 = time.time_ns()
        self._perf0 = outcome.started
        view = outcome.ctx.view
        req = view.request
        self._nginx_start = int(req.nginx_start_ns) or self._wall0
        self._admit_ns = int(req.nginx_admit_us) * 1000
        self.root: Span = tracer.tracer.start_span(
            f"chat {tracer.model}", context=_parent(req), kind=SpanKind.SERVER,
            start_time=min(self._nginx_start, self._wall0))
        self._ctx = set_span_in_context(self.root)
        self.upstream: Span | None = None
        self._ended = False

    def _ns(self, t: float) -> int:
        return self._wall0 + int((t - self._perf0) * 1e9)

    def upstream_headers(self, model: str) -> dict[str, str]:
        """Start the upstream call's span; the traceparent (and tracestate) to send with it."""
        self.upstream = self._t.tracer.start_span(f"chat {model}", context=self._ctx, kind=SpanKind.CLIENT,
                                                  attributes={"gen_ai.operation.name": "chat",
                                                              "gen_ai.request.model": model})
        headers: dict[str, str] = {}
        get_global_textmap().inject(headers, context=set_span_in_context(self.upstream))
        return headers

    def upstream_end(self, ok: bool) -> None:
        if self.upstream is not None:
            if not ok:
                self.upstream.set_status(Status(StatusCode.ERROR))
            self.upstream.end()
            self.upstream = None

    def end(self, o: Outcome, status: int, result: GenerationResult | None) -> None:
        """The spans of the request's one ending (a second, e.g. abandoned after answered, adds none)."""
        if self._ended:
            return
        self._ended = True
        root, t = self.root, self._t
        if not root.is_recording():
            root.end()
            return
        now = time.time_ns()
        view = o.ctx.view
        child = t.tracer.start_span
        ctx = self._ctx
        if self._admit_ns:
            child("zccp.nginx.admit", context=ctx, start_time=self._nginx_start).end(
                end_time=self._nginx_start + self._admit_ns)
        cache = CACHE_NAMES.get(int(view.meta.cache_status), "NONE")
        if o.submitted:
            child("zccp.engine.prepare", context=ctx, start_time=self._wall0,
                  attributes={"zccp.cache.result": cache}).end(end_time=self._ns(o.submitted))
            if o.admitted:
                child("zccp.queue", context=ctx, start_time=self._ns(o.submitted)).end(end_time=self._ns(o.admitted))
                if o.first_token:
                    child("zccp.prefill", context=ctx, start_time=self._ns(o.admitted)).end(
                        end_time=self._ns(o.first_token))
            if o.first_token:
                child("zccp.decode", context=ctx, start_time=self._ns(o.first_token)).end(
                    end_time=self._ns(o.last_token) if o.last_token else now)
        elif status == 200:
            child("zccp.cache.replay", context=ctx, start_time=self._wall0,
                  attributes={"zccp.cache.result": cache}).end(end_time=now)
        self.upstream_end(status == 200)
        req = view.request
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": t.model,
            "server.address": t.server[0],
            "http.response.status_code": status,
            "zccp.cache.result": cache,
            "zccp.slot": view.index,
            "zccp.request_id": o.ctx.request_id,
            "zccp.api": o.codec.name,
        }
        if t.server[1] is not None:
            attrs["server.port"] = t.server[1]
        if t.engine:
            attrs["zccp.engine"] = t.engine
        if int(view.meta.max_tokens):
            attrs["gen_ai.request.max_tokens"] = int(view.meta.max_tokens)
        if int(view.header.flags) & Flag.TENANT:
            attrs["zccp.tenant"] = bytes(ffi.buffer(req.tenant, 8)).hex()   # a digest's first 8 bytes
        if result is not None:
            attrs["gen_ai.usage.input_tokens"] = result.input_tokens
            attrs["gen_ai.usage.output_tokens"] = result.output_tokens
            attrs["gen_ai.response.finish_reasons"] = (result.stop_reason,)
        if o.response_id:
            attrs["gen_ai.response.id"] = o.response_id
        root.set_attributes(attrs)
        if status >= 500:
            root.set_status(Status(StatusCode.ERROR))
        root.end(end_time=now)
