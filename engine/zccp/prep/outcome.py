"""How one slot request ends, whatever served it (a generation, a cache replay, an
endpoint, a purge): every flow ends through its Outcome, once.

  answered(status, result)  the answer is written: the request metric and the log line
  client_error(err)         an ApiError, API-shaped through the slot, then answered(...)
  abandoned(exc)            nginx gave up on the slot (SlotAbandoned): counted, logged
  failed(encoder, err)      anything else: a 500, or err when it is known (or the stream's error event)
  done()                    the slot's payload released, the engine told the job is over

`guard()` wraps a step and maps what it raises onto those endings, so no flow repeats
the try/except ladder.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

import numpy as np

from zccp.observe import tracing
from zccp.transport.abi import CACHE_NAMES
from zccp.api.codec import ApiCodec, StreamEncoder
from zccp.transport.arena import SlotView
from zccp.observe.logs import RequestLog
from zccp.observe.metrics import EngineMetrics
from zccp.transport.ring_writer import ResponseWriter, SlotAbandoned
from zccp.shared_types import ApiError, GenerationResult

if TYPE_CHECKING:
    import torch

log = logging.getLogger("zccp.outcome")


@dataclass(slots=True)
class RequestContext:
    """The slot side of one request."""

    view: SlotView
    generation: int
    payload: memoryview            # the body in shared memory, validated length
    tokens: torch.Tensor           # the slot's whole token array (int32 view of the mmap)
    host_tokens: np.ndarray        # the same memory as a numpy array (made once per slot)
    writer: ResponseWriter
    cancelled: Callable[[], bool]
    context_id: str
    request_id: str                # X-Request-ID, from the slot's request block ("" when none)

    def ids(self) -> dict[str, str]:
        """The fields that tie a log line to one request."""
        return {"context_id": self.context_id, "request_id": self.request_id}


class _Guard:
    """Outcome.guard's context manager: a plain object, not a generator (two per request)."""

    __slots__ = ("_outcome", "_what")

    def __init__(self, outcome: Outcome, what: str) -> None:
        self._outcome = outcome
        self._what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        if exc is None or not isinstance(exc, Exception):
            return False
        o = self._outcome
        if isinstance(exc, ApiError):
            try:
                o.client_error(exc)
                return True
            except Exception as raised:   # the error's answer failed: that is the ending
                exc = raised
        if isinstance(exc, SlotAbandoned):
            o.abandoned(exc)
        else:
            log.error(self._what, exc_info=exc, extra=o.ctx.ids())
            o.failed(None)
        return True


class Outcome:
    """The endings of one request; `started` is when the engine took it."""

    def __init__(self, ctx: RequestContext, codec: ApiCodec, metrics: EngineMetrics, request_log: RequestLog,
                 on_done: Callable[[], None]) -> None:
        self.ctx = ctx
        self.codec = codec
        self._metrics = metrics
        self._request_log = request_log
        self._on_done = on_done
        self.started = time.perf_counter()
        # a generation's times (zccp.serving.token_sink, zccp.upstream.reply; perf_counter, 0: not reached)
        self.submitted = 0.0        # handed to the model thread (or the upstream)
        self.admitted = 0.0         # taken into the decode batch
        self.first_token = 0.0
        self.last_token = 0.0
        self.response_id = ""       # the answer's id (gen_ai.response.id), when a generation made one
        # the request's spans when tracing is on (zccp.observe.tracing: off, nothing but this lookup)
        tracer = tracing.ACTIVE
        self.trace = tracer.begin(self) if tracer is not None else None

    def guard(self, what: str = "request failed") -> _Guard:
        """Run a step: an ApiError is answered through the slot, an abandoned slot is
        counted, anything else is logged (as `what`) and failed. Nothing propagates."""
        return _Guard(self, what)

    def client_error(self, err: ApiError) -> None:
        """A client error, API-shaped, through the slot (raises SlotAbandoned)."""
        status = self.codec.http_status(err)
        after = err.headers.get("retry-after", "")
        if after.isdigit():
            self.ctx.writer.set_meta(retry_after_s=min(int(after), 86400))
        self.ctx.writer.answer(status, False, self.codec.render_error(err))
        self.answered(status)

    def abandoned(self, exc: SlotAbandoned) -> None:
        self._metrics.abandoned.inc()
        if self.trace is not None:
            self.trace.end(self, 499, None)
        log.info("request abandoned: %s", exc, extra=self.ctx.ids())

    def failed(self, encoder: StreamEncoder | None, err: ApiError | None = None) -> None:
        """The request failed: err (one sequence's own failure, zccp.serving.scheduler) or the 500."""
        if err is None:
            err = ApiError(500, "api_error", "the engine failed while serving this request")
        status = self.codec.http_status(err)
        self.answered(status)
        writer = self.ctx.writer
        try:
            if not writer.started:
                writer.set_meta(completion_len=0)     # an error answer: the tokens counted so far were not sent
                writer.begin(status, sse=False)
                writer.write(self.codec.render_error(err))
            elif encoder is not None:
                writer.write(encoder.error(err))
            writer.finish(failed=True)
        except SlotAbandoned:
            pass

    def answered(self, status: int, result: GenerationResult | None = None) -> None:
        """The request metric and the log line of an answered request."""
        elapsed = time.perf_counter() - self.started
        m = self._metrics
        m.requests.inc(api=self.codec.name, status=str(status))
        m.seconds.inc(elapsed)
        if result is not None:
            m.tokens_in.inc(result.input_tokens)
            m.tokens_out.inc(result.output_tokens)
        if status == 200:
            self._observe(elapsed, result)
        if self.trace is not None:
            self.trace.end(self, status, result)
        rlog = self._request_log
        if not rlog.enabled:
            return
        ctx = self.ctx
        rlog.write("request done", {
            "context_id": ctx.context_id,
            "request_id": ctx.request_id,
            "slot": ctx.view.index,
            "generation": ctx.generation,
            "status": status,
            "api": self.codec.name,
            "cache": CACHE_NAMES.get(ctx.view.meta.cache_status),
            "duration_ms": round(elapsed * 1000, 3),
            "tokens_in": result.input_tokens if result else None,
            "tokens_out": result.output_tokens if result else None,
        })

    def _observe(self, elapsed: float, result: GenerationResult | None) -> None:
        """The latency histograms of a 200 answer (zccp.observe.metrics.LatencyHistograms); a traced
        request is its buckets' exemplar (its trace and root span, for OpenMetrics)."""
        lat = self._metrics.latency
        ex = self.trace.ids() if self.trace is not None else None
        lat.duration_series(CACHE_NAMES.get(self.ctx.view.meta.cache_status) or "NONE").observe(elapsed, ex)
        first = self.first_token
        if not first:
            return
        lat.ttft_s.observe(first - self.started, ex)
        if self.admitted:
            lat.queue_s.observe(self.admitted - self.submitted, ex)
            lat.prefill_s.observe(first - self.admitted, ex)
        n = result.output_tokens if result is not None else 0
        if n > 1 and self.last_token > first:
            lat.tpot_s.observe((self.last_token - first) / (n - 1), ex)

    def done(self) -> None:
        """The job is over: the payload view released, the slot handed back to the engine."""
        self.ctx.payload.release()
        self._on_done()
