"""The Prometheus text exposition of a live stack, parsed: histogram families checked whole."""

from __future__ import annotations

import re
from collections import defaultdict

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample line: (name, labels, value); a line that is neither a comment nor a sample fails."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        out.append((m[1], dict(LABEL.findall(m[2] or "")), float(m[3])))
    return out


def histograms(text: str, family: str) -> dict[tuple[tuple[str, str], ...], dict[str, object]]:
    """A histogram family's series by their labels (le aside): buckets (le -> cumulative
    count, in exposition order), sum and count; asserts the buckets never decrease and +Inf is the count."""
    series: dict[tuple[tuple[str, str], ...], dict[str, object]] = defaultdict(lambda: {"buckets": {}})
    for name, labels, value in samples(text):
        if name == family + "_bucket":
            le = labels.pop("le")
            series[tuple(sorted(labels.items()))]["buckets"][le] = value     # type: ignore[index]
        elif name in (family + "_sum", family + "_count"):
            series[tuple(sorted(labels.items()))][name.rsplit("_", 1)[1]] = value
    for key, s in series.items():
        counts = list(s["buckets"].values())     # type: ignore[attr-defined]
        assert counts == sorted(counts), f"{family}{key}: buckets decrease: {counts}"
        assert counts and counts[-1] == s["count"], f"{family}{key}: +Inf is not the count"
        assert list(s["buckets"])[-1] == "+Inf"  # type: ignore[call-overload]
    return dict(series)
