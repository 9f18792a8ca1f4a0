"""Engine metrics in the Prometheus text format, or OpenMetrics with exemplars.

Counters are plain ints bumped from the loop and the model thread (the GIL makes
a single `+=` on a dict entry safe enough for monotonic counters). The text is
served on `<socket_path>.metrics` (connect, send a format line, read to EOF); nginx's
GET /metrics appends it to its own counters, so one scrape sees both sides. Written
by hand, not with prometheus_client: docs/observability.md says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

Labels = tuple[tuple[str, str], ...]


def _fmt_labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{v}"' for k, v in labels)
    return "{" + inner + "}"


def _num(v: float) -> str:
    """A sample's value: an integral one whole (`%g` would round a counter past 999999)."""
    v = float(v)
    if v.is_integer() and abs(v) < 2**53:
        return str(int(v))
    return repr(v) if v == v and abs(v) != float("inf") else {"inf": "+Inf", "-inf": "-Inf"}.get(repr(v), "NaN")


def _om_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _head(name: str, kind: str, help: str, om: bool) -> str:
    """# HELP and # TYPE: OpenMetrics names a counter's family without its `_total`."""
    if om:
        if kind == "counter" and name.endswith("_total"):
            name = name[:-6]
        help = _om_help(help)
    return f"# HELP {name} {help}\n# TYPE {name} {kind}"


def _key(labels: dict[str, str]) -> Labels:
    return tuple(sorted(labels.items()))


class Series:
    """Metric.series: inc() without building the label key again."""

    __slots__ = ("_values", "_key")

    def __init__(self, values: dict[Labels, float], key: Labels) -> None:
        self._values = values
        self._key = key

    def inc(self, amount: float = 1.0) -> None:
        self._values[self._key] += amount


@dataclass
class Metric:
    name: str
    help: str
    kind: str  # "counter" | "gauge"
    values: dict[Labels, float] = field(default_factory=lambda: defaultdict(float))
    # the sorted key of each label set as a call site spells it (label values are the code's
    # own small sets: statuses, reasons; capped all the same)
    _sorted: dict[Labels, Labels] = field(default_factory=dict, repr=False)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        # several per request: no sort for the unlabelled and one-label series, one dict
        # lookup for the others
        key = tuple(labels.items())
        if len(key) > 1:
            if (known := self._sorted.get(key)) is None:
                known = _key(labels)
                if len(self._sorted) < 4096:
                    self._sorted[key] = known
            key = known
        self.values[key] += amount

    def set(self, value: float, **labels: str) -> None:
        # every decode step sets the batch gauges: no sort for the unlabelled and one-label ones
        self.values[tuple(labels.items()) if len(labels) < 2 else _key(labels)] = value

    def get(self, **labels: str) -> float:
        return self.values.get(_key(labels), 0.0)

    def series(self, **labels: str) -> Series:
        """One label set's counter, its key made once (a hot path's fixed labels)."""
        return Series(self.values, _key(labels))

    def seed(self, *label_sets: dict[str, str]) -> Metric:
        """Start these label sets at 0, so that a counter nothing has bumped yet still has a
        sample (a rate over a series that appears late misses its first increments)."""
        for labels in label_sets:
            self.values.setdefault(tuple(sorted(labels.items())), 0.0)
        return self

    def render(self, om: bool = False) -> str:
        lines = [_head(self.name, self.kind, self.help, om)]
        values = self.values if self.values else {(): 0.0}   # an unlabelled counter at zero
        for labels, v in sorted(values.items()):
            lines.append(f"{self.name}{_fmt_labels(labels)} {_num(v)}")
        return "\n".join(lines)


# an exemplar: trace id, span id (ints), the observed value, its Unix time
Exemplar = tuple[int, int, float, float]


class HistogramSeries:
    """One label set's buckets: observe() is a bisect and three adds (no lock: the GIL, as
    for the counters; a scrape may see a count one ahead of its sum, never a torn float)."""

    __slots__ = ("_bounds", "counts", "total", "exemplars")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)   # per bucket, not cumulative; the last is +Inf
        self.total = 0.0
        self.exemplars: list[Exemplar | None] | None = None   # per bucket: its last traced observation

    def observe(self, value: float, trace: tuple[int, int] | None = None) -> None:
        """One value; a traced request's (trace id, span id) becomes its bucket's exemplar."""
        i = bisect_left(self._bounds, value)
        self.counts[i] += 1
        self.total += value
        if trace is not None:
            if self.exemplars is None:
                self.exemplars = [None] * len(self.counts)
            self.exemplars[i] = (trace[0], trace[1], value, time.time())


def _exemplar(ex: Exemplar | None) -> str:
    if ex is None:
        return ""
    return f' # {{trace_id="{ex[0]:032x}",span_id="{ex[1]:016x}"}} {ex[2]!r} {ex[3]:.3f}'


@dataclass
class Histogram:
    """A Prometheus histogram (`_bucket{le}`, `_sum`, `_count`) over fixed upper bounds."""

    name: str
    help: str
    bounds: tuple[float, ...]
    values: dict[Labels, HistogramSeries] = field(default_factory=dict)

    def series(self, **labels: str) -> HistogramSeries:
        """One label set's series, made once (a hot path's fixed labels: the engine's model)."""
        key = _key(labels)
        if (s := self.values.get(key)) is None:
            s = self.values[key] = HistogramSeries(self.bounds)
        return s

    def render(self, om: bool = False) -> str:
        """OpenMetrics (om): its canonical `le` (1.0, not 1) and each bucket's exemplar."""
        n = self.name
        lines = [_head(n, "histogram", self.help, om)]
        les = [repr(float(b)) if om else f"{b:g}" for b in self.bounds] + ["+Inf"]
        for labels, s in sorted(self.values.items()):
            inner = ",".join(f'{k}="{v}"' for k, v in labels)
            sep = "," if inner else ""
            exemplars = s.exemplars if om and s.exemplars is not None else [None] * len(les)
            running = 0
            for le, c, ex in zip(les, s.counts, exemplars, strict=True):
                running += c
                lines.append(f'{n}_bucket{{{inner}{sep}le="{le}"}} {running}{_exemplar(ex)}')
            lines.append(f"{n}_sum{_fmt_labels(labels)} {s.total:.9g}")
            lines.append(f"{n}_count{_fmt_labels(labels)} {running}")
        return "\n".join(lines)


class Registry:
    def __init__(self) -> None:
        self._metrics: dict[str, Metric | Histogram] = {}

    def histogram(self, name: str, help: str, bounds: tuple[float, ...]) -> Histogram:
        h = self._metrics.setdefault(name, Histogram(name, help, bounds))
        assert isinstance(h, Histogram)
        return h

    def counter(self, name: str, help: str) -> Metric:
        m = self._metrics.setdefault(name, Metric(name, help, "counter"))
        assert isinstance(m, Metric)
        return m

    def gauge(self, name: str, help: str) -> Metric:
        m = self._metrics.setdefault(name, Metric(name, help, "gauge"))
        assert isinstance(m, Metric)
        return m

    def metrics(self) -> dict[str, Metric | Histogram]:
        return self._metrics

    def render(self, om: bool = False) -> str:
        """The text format, or OpenMetrics' families (om; nginx ends the whole page's `# EOF`)."""
        return "\n".join(m.render(om) for m in self._metrics.values()) + "\n"


# OpenTelemetry's advised bucket bounds for the GenAI server metrics, each with finer bounds
# below its first one: a small model's token or a cache hit takes well under 10 ms, and a
# regression there would otherwise stay inside one bucket. A superset of OTel's bounds, so
# quantiles a dashboard built for them computes stay meaningful.
TTFT_BOUNDS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
               1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BOUNDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15,
               0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
DURATION_BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28,
                   2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
MODEL_LABEL = "gen_ai_request_model"    # gen_ai.request.model, as an OTel exporter spells it


class LatencyHistograms:
    """The latency of answered requests, named after OpenTelemetry's GenAI server metrics
    (gen_ai.server.*) as Prometheus histograms, plus the engine's queue wait and prefill.
    One observation per request (zccp.prep.outcome), never one per token: the time per output
    token is (last token - first token) / (tokens - 1), OTel's definition."""

    def __init__(self, r: Registry) -> None:
        self.ttft = r.histogram("gen_ai_server_time_to_first_token_seconds",
                                "Time from the engine taking a generated request to its first token", TTFT_BOUNDS)
        self.tpot = r.histogram("gen_ai_server_time_per_output_token_seconds",
                                "Mean time between output tokens after the first, per request", TPOT_BOUNDS)
        self.duration = r.histogram("gen_ai_server_request_duration_seconds",
                                    "Time from the engine taking a request to its last byte written, by cache "
                                    "result (200 answers)", DURATION_BOUNDS)
        self.queue = r.histogram("zccp_engine_queue_wait_seconds",
                                 "Time a generated request waited for admission to the decode batch", TTFT_BOUNDS)
        self.prefill = r.histogram("zccp_engine_prefill_seconds",
                                   "Time from admission to the first token (the prompt's prefill)", TTFT_BOUNDS)
        self.for_model("")

    def for_model(self, model: str) -> None:
        """The engine's model (its label on every series); the generation series start at 0."""
        for h in (self.ttft, self.tpot, self.duration, self.queue, self.prefill):
            h.values.clear()
        self._model = model
        self._by_cache: dict[str, HistogramSeries] = {}
        self.ttft_s = self.ttft.series(**{MODEL_LABEL: model})
        self.tpot_s = self.tpot.series(**{MODEL_LABEL: model})
        self.queue_s = self.queue.series(**{MODEL_LABEL: model})
        self.prefill_s = self.prefill.series(**{MODEL_LABEL: model})
        for cache in ("HIT", "MISS"):
            self.duration_series(cache)

    def duration_series(self, cache: str) -> HistogramSeries:
        if (s := self._by_cache.get(cache)) is None:
            s = self._by_cache[cache] = self.duration.series(**{MODEL_LABEL: self._model, "cache": cache})
        return s


@dataclass
class EngineMetrics:
    registry: Registry = field(default_factory=Registry)

    def __post_init__(self) -> None:
        r = self.registry
        self.rings = r.counter("zccp_engine_rings_total", "Doorbell rings received")
        self.rejects = r.counter("zccp_engine_rejects_total", "Rings rejected, by HTTP-like reason status").seed(
            {"status": "400"}, {"status": "409"})
        self.requests = r.counter("zccp_engine_requests_total", "Requests answered, by API and status").seed(
            {"api": "anthropic", "status": "200"}, {"api": "openai", "status": "200"})
        self.tokens_in = r.counter("zccp_engine_prompt_tokens_total", "Prompt tokens processed")
        self.tokens_out = r.counter("zccp_engine_completion_tokens_total", "Tokens generated or replayed")
        self.seconds = r.counter("zccp_engine_request_seconds_total", "Time spent answering requests")
        self.cache = r.counter("zccp_engine_cache_total",
                               "Cache lookups by result (HIT, NEAR, MISS, BYPASS, ERROR) and reason")
        self.cache_errors = r.counter("zccp_engine_cache_errors_total", "Redis operations that failed or timed out")
        self.coalesced = r.counter("zccp_engine_coalesced_total",
                                   "Misses that waited for an identical request in flight, by outcome")
        self.abandoned = r.counter("zccp_engine_abandoned_total", "Requests stopped: client gone, deadline, stale")
        self.sweeps = r.counter("zccp_engine_sweeper_resets_total", "Slots reset by the sweeper")
        self.info = r.gauge("zccp_engine_info", "Engine identity")
        self.processes = r.gauge("zccp_engine_processes", "The engine's processes: the model's and its prep processes")
        self.handoffs = r.counter("zccp_engine_handoffs_total",
                                  "Requests a prep process handed to the model's process: prepared misses, or whole")
        self.batch_rows = r.gauge("zccp_engine_batch_rows", "Sequences in the decode batch")
        self.queue_waiting = r.gauge("zccp_engine_queue_waiting", "Sequences waiting for admission to the model")
        self.parked = r.gauge("zccp_engine_parked", "Sequences out of the batch until nginx acks room in their ring")
        self.queue_full = r.counter("zccp_engine_queue_full_total",
                                    "Requests refused (429) because the model queue was full")
        self.kv_bytes = r.gauge("zccp_engine_kv_bytes", "KV cache bytes held by the decode batch")
        self.decode_steps = r.counter("zccp_engine_decode_steps_total", "Batched decode forwards")
        self.prefilled = r.counter("zccp_engine_prefill_tokens_total", "Prompt tokens computed by prefill")
        self.prefill_steps = r.counter("zccp_engine_prefill_steps_total", "Model steps that prefilled prompt tokens")
        self.mixed_steps = r.counter("zccp_engine_mixed_steps_total",
                                     "Model steps that prefilled prompt tokens and decoded running streams")
        self.prefix_reused = r.counter("zccp_engine_prefix_reused_tokens_total",
                                       "Prompt tokens whose KV state came from the prefix cache")
        self.prefix_pinned = r.gauge("zccp_engine_prefix_pinned_bytes",
                                     "Prefix cache bytes pinned by cache_control breakpoints (as of the last pin)")
        self.pins_refused = r.counter("zccp_engine_prefix_pins_refused_total",
                                      "cache_control pins not granted: the pinned bytes were at their cap")
        self.grammar_compiles = r.counter("zccp_engine_grammar_compiles_total",
                                          "Output schemas compiled (the grammar cache's misses)")
        self.grammar_compiling = r.gauge("zccp_engine_grammar_compiling",
                                         "Output schema compiles not ended: running, or waiting in their tenant's lane")

        self.trace_spans = r.counter("zccp_engine_trace_spans_total",
                                     "Request spans by result: exported, failed (the collector refused or "
                                     "was unreachable), dropped (the exporter's queue was full), invalid (a "
                                     "request's record the span process could not encode: all its spans)")
        self.latency = LatencyHistograms(r)

    def render(self, om: bool = False) -> str:
        return self.registry.render(om)


# The client's first line on the metrics socket: this one asks for OpenMetrics; any other, or
# none within REQUEST_WAIT_S, gets the text format. STATE_REQUEST (the model's process asking a
# prep process) gets the values as JSON (zccp.observe.metrics_merge).
OPENMETRICS_REQUEST = b"openmetrics\n"
STATE_REQUEST = b"state\n"
REQUEST_WAIT_S = 2.0

# the other processes' states (zccp.process.group), gathered for each page
Gather = Callable[[], Awaitable[list[Any]]]


class MetricsServer:
    """Serves the text on a unix socket: connect, send a format line, read to EOF. With
    `gather`, the page sums the engine's other processes' values into this one's."""

    def __init__(self, path: str, metrics: EngineMetrics, group: str | None = None,
                 gather: Gather | None = None) -> None:
        self.path = path
        self._metrics = metrics
        self._group = group
        self._gather = gather
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        from zccp.transport.doorbell import start_private_unix_server

        self._server = await start_private_unix_server(
            self.path, self._group, lambda path: asyncio.start_unix_server(self._serve, path=path, backlog=1024))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), REQUEST_WAIT_S)
        except (asyncio.TimeoutError, ValueError, ConnectionError):   # ValueError: a line past the limit
            line = b""
        from zccp.observe import metrics_merge

        registry = self._metrics.registry
        if line == STATE_REQUEST:
            writer.write(json.dumps(metrics_merge.state(registry)).encode())   # trace ids pass 64 bits
        else:
            if self._gather is not None:
                registry = metrics_merge.merged(registry, await self._gather())
            writer.write(registry.render(line == OPENMETRICS_REQUEST).encode())
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
