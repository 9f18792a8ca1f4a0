"""bench/restart.svg: kill -9 to first 200, each kill a dot, per runner (the JSON files of
bench.restart, bench.restart_systemd and bench.restart_compose). A plain SVG: nothing to install.

    python -m bench.restart_plot
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROWS = [  # label, file
    ("zccp-stack, standby", "restart_standby.json"),
    ("zccp-stack, --no-standby", "restart_nostandby.json"),
    ("systemd unit, --warm-standby", "restart_systemd_standby.json"),
    ("systemd unit, no standby", "restart_systemd.json"),
    ("compose, --warm-standby", "restart_compose.json"),
    ("compose, no standby", "restart_compose_nostandby.json"),
]
LO, HI = 0.1, 20.0          # seconds, log scale
LEFT, WIDTH, ROW_H, TOP = 230, 560, 34, 40


def x_of(s: float) -> float:
    s = min(max(s, LO), HI)
    return LEFT + WIDTH * (math.log10(s) - math.log10(LO)) / (math.log10(HI) - math.log10(LO))


def svg() -> str:
    h = TOP + ROW_H * len(ROWS) + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + WIDTH + 30}" height="{h}" '
           'font-family="sans-serif" font-size="12">',
           f'<text x="{LEFT}" y="20">kill -9 of the engine to the first 200 (s, log scale; tiny model, '
           '2 clients of load; | = p50)</text>']
    for tick in (0.1, 0.3, 1, 3, 10):
        x = x_of(tick)
        out.append(f'<line x1="{x:.1f}" y1="{TOP - 8}" x2="{x:.1f}" y2="{h - 30}" stroke="#ddd"/>')
        out.append(f'<text x="{x:.1f}" y="{h - 14}" text-anchor="middle">{tick:g}</text>')
    x3 = x_of(3.0)
    out.append(f'<line x1="{x3:.1f}" y1="{TOP - 8}" x2="{x3:.1f}" y2="{h - 30}" stroke="#c44" '
               'stroke-dasharray="4 3"/>')
    out.append(f'<text x="{x3 + 4:.1f}" y="{TOP - 10}" fill="#c44">target 3 s</text>')
    for i, (label, name) in enumerate(ROWS):
        y = TOP + ROW_H * i + ROW_H / 2
        out.append(f'<text x="{LEFT - 10}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
        path = HERE / name
        if not path.exists():
            out.append(f'<text x="{LEFT + 4}" y="{y + 4:.1f}" fill="#999">not measured</text>')
            continue
        vals = json.loads(path.read_text())["kill_to_200_s"]
        color = "#dd8452" if "no" in label.split(", ")[1] else "#4c72b0"   # without a standby: orange
        for v in vals:
            out.append(f'<circle cx="{x_of(v):.1f}" cy="{y:.1f}" r="4" fill="{color}" fill-opacity="0.6"/>')
        p50 = x_of(statistics.median(vals))
        out.append(f'<line x1="{p50:.1f}" y1="{y - 10:.1f}" x2="{p50:.1f}" y2="{y + 10:.1f}" stroke="#000" '
                   'stroke-width="2"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    (HERE / "restart.svg").write_text(svg())
