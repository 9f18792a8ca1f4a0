"""Whether the engine traces requests, and the one tracer when it does.

Off (the default) this module is all there is: `ACTIVE` stays None, the OpenTelemetry SDK is
never imported, and a request pays one global lookup. On (tracing.enabled, or an OTLP
endpoint in the environment as every OpenTelemetry-instrumented service reads it) the
request spans are made by zccp.observe.trace_export (docs/observability.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from zccp.config.sections import TracingConfig

if TYPE_CHECKING:
    from zccp.observe.metrics import EngineMetrics
    from zccp.prep.outcome import RequestContext
    from zccp.observe.trace_export import RequestTracer

ACTIVE: RequestTracer | None = None

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def wanted(cfg: TracingConfig, env: Mapping[str, str] = os.environ) -> bool:
    """On when the config says so or an OTLP endpoint is set, unless OTEL_SDK_DISABLED=true."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return cfg.enabled or any(env.get(v) for v in ENDPOINT_VARS)


def start(cfg: TracingConfig, metrics: EngineMetrics, model: str, engine: str, server_address: str) -> bool:
    """Make the tracer when tracing is wanted; True when it is on."""
    global ACTIVE
    if not wanted(cfg):
        return False
    from zccp.observe.trace_export import RequestTracer   # the SDK, only now

    ACTIVE = RequestTracer(cfg, metrics, model, engine, server_address)
    return True


def ratio() -> float:
    """The sampling ratio of a request without a client's traceparent (0 when off)."""
    return ACTIVE.ratio if ACTIVE is not None else 0.0


def take_l1_spans(ctx: RequestContext, done: Callable[[], None]) -> None:
    """A batch of nginx's L1 hits (ZCCP_KIND_SPANS): their records to the exporter, 204."""
    from zccp.transport.ring_writer import SlotAbandoned

    try:
        if ACTIVE is not None:
            ACTIVE.take_l1(ctx.payload)
        ctx.payload.release()
        ctx.writer.begin(204, sse=False)
        ctx.writer.finish()
    except SlotAbandoned:
        pass
    finally:
        done()


def stop() -> None:
    """Export what is queued (bounded by the SDK's timeout) and stop the exporter thread."""
    global ACTIVE
    if ACTIVE is not None:
        ACTIVE.shutdown()
        ACTIVE = None
