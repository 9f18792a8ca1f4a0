"""Engine metrics in Prometheus text format.

Counters are plain ints bumped from the loop and the model thread (the GIL makes
a single `+=` on a dict entry safe enough for monotonic counters). The text is
served on `<socket_path>.metrics` (connect, read to EOF); nginx's GET /metrics
appends it to its own counters, so one scrape sees both sides.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import defaultdict
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]


def _fmt_labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{v}"' for k, v in labels)
    return "{" + inner + "}"


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

    def render(self) -> str:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        values = self.values if self.values else {(): 0.0}   # an unlabelled counter at zero
        for labels, v in sorted(values.items()):
            lines.append(f"{self.name}{_fmt_labels(labels)} {v:g}")
        return "\n".join(lines)


class Registry:
    def __init__(self) -> None:
        self._metrics: dict[str, Metric] = {}

    def counter(self, name: str, help: str) -> Metric:
        return self._metrics.setdefault(name, Metric(name, help, "counter"))

    def gauge(self, name: str, help: str) -> Metric:
        return self._metrics.setdefault(name, Metric(name, help, "gauge"))

    def render(self) -> str:
        return "\n".join(m.render() for m in self._metrics.values()) + "\n"


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
        self.batch_rows = r.gauge("zccp_engine_batch_rows", "Sequences in the decode batch")
        self.queue_waiting = r.gauge("zccp_engine_queue_waiting", "Sequences waiting for admission to the model")
        self.parked = r.gauge("zccp_engine_parked", "Sequences out of the batch until nginx acks room in their ring")
        self.queue_full = r.counter("zccp_engine_queue_full_total",
                                    "Requests refused (429) because the model queue was full")
        self.kv_bytes = r.gauge("zccp_engine_kv_bytes", "KV cache bytes held by the decode batch")
        self.decode_steps = r.counter("zccp_engine_decode_steps_total", "Batched decode forwards")
        self.prefilled = r.counter("zccp_engine_prefill_tokens_total", "Prompt tokens computed by prefill")
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

    def render(self) -> str:
        return self.registry.render()


class MetricsServer:
    """Serves the text on a unix socket: connect, read to EOF."""

    def __init__(self, path: str, metrics: EngineMetrics, group: str | None = None) -> None:
        self.path = path
        self._metrics = metrics
        self._group = group
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        from zccp.doorbell import start_private_unix_server

        self._server = await start_private_unix_server(
            self.path, self._group, lambda path: asyncio.start_unix_server(self._serve, path=path, backlog=1024))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(self._metrics.render().encode())
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
