"""One /metrics page for an engine of several processes: each prep process hands the model's
process its registry's values (state()), which sums them into its own (merged()). Counters,
histogram buckets and gauges add up; the identity gauge is the same in every process."""

from __future__ import annotations

import math
from typing import Any

from zccp.observe.metrics import Histogram, HistogramSeries, Metric, Registry

SAME_IN_EVERY_PROCESS = frozenset({"zccp_engine_info"})
STATE_MAX_BYTES = 8 << 20     # a process's values are a few KiB; more is not one of ours


def state(r: Registry) -> dict[str, list[Any]]:
    """This process's values, as JSON: per metric, [labels, value] or [labels, counts, sum, exemplars]."""
    out: dict[str, list[Any]] = {}
    for name, m in r.metrics().items():
        if isinstance(m, Histogram):
            out[name] = [[list(map(list, k)), s.counts, s.total, s.exemplars] for k, s in m.values.items()]
        else:
            out[name] = [[list(map(list, k)), v] for k, v in m.values.items()]
    return out


def _labels(raw: Any) -> tuple[tuple[str, str], ...] | None:
    if not isinstance(raw, list) or len(raw) > 16:
        return None
    pairs = []
    for p in raw:
        if not (isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) and len(x) < 256 for x in p)):
            return None
        pairs.append((p[0], p[1]))
    return tuple(pairs)


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _exemplar(e: Any) -> tuple[int, int, float, float] | None:
    if (isinstance(e, list) and len(e) == 4 and all(isinstance(x, int) and x >= 0 for x in e[:2])
            and all(_number(x) is not None for x in e[2:])):
        return (e[0], e[1], float(e[2]), float(e[3]))
    return None


def _add_histogram(h: Histogram, rows: list[Any]) -> None:
    for row in rows[:4096]:
        if not (isinstance(row, list) and len(row) == 4):
            continue
        key, counts, total = _labels(row[0]), row[1], _number(row[2])
        if (key is None or total is None or not isinstance(counts, list) or len(counts) != len(h.bounds) + 1
                or not all(isinstance(c, int) and c >= 0 for c in counts)):
            continue
        s = h.values.get(key)
        if s is None:
            s = h.values[key] = HistogramSeries(h.bounds)
        s.counts = [a + b for a, b in zip(s.counts, counts, strict=True)]
        s.total += total
        if isinstance(row[3], list) and len(row[3]) == len(counts):
            mine = s.exemplars or [None] * len(counts)
            theirs = [_exemplar(e) for e in row[3]]
            s.exemplars = [b if b is not None and (a is None or b[3] > a[3]) else a
                           for a, b in zip(mine, theirs, strict=True)]


def _add_metric(m: Metric, rows: list[Any]) -> None:
    for row in rows[:4096]:
        if not (isinstance(row, list) and len(row) == 2):
            continue
        key, v = _labels(row[0]), _number(row[1])
        if key is None or v is None:
            continue
        if m.name in SAME_IN_EVERY_PROCESS:
            m.values[key] = max(m.values.get(key, v), v)
        else:
            m.values[key] = m.values.get(key, 0.0) + v


def merged(r: Registry, states: list[Any]) -> Registry:
    """A copy of r with every other process's state added: only the metrics r defines count
    (a state is another process's input: anything malformed in it is skipped)."""
    out = Registry()
    for name, m in r.metrics().items():
        if isinstance(m, Histogram):
            h = out.histogram(name, m.help, m.bounds)
            for key, s in m.values.items():
                c = h.values[key] = HistogramSeries(m.bounds)
                c.counts, c.total = list(s.counts), s.total
                c.exemplars = list(s.exemplars) if s.exemplars is not None else None
        else:
            copy = out.counter(name, m.help) if m.kind == "counter" else out.gauge(name, m.help)
            copy.values.update(m.values)
    for st in states:
        if not isinstance(st, dict):
            continue
        for name, m in out.metrics().items():
            rows = st.get(name)
            if not isinstance(rows, list):
                continue
            if isinstance(m, Histogram):
                _add_histogram(m, rows)
            else:
                _add_metric(m, rows)
    return out
