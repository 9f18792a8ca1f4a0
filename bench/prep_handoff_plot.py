"""bench/prep_handoff.svg from bench.prep_handoff's JSON: for each figure, the tiny engine of 2
processes (T2, a prep process handing its misses over) against 1 (T1), as T2 / T1 of the
medians, with the 1.0 line. A plain SVG (no plotting library in the engine's environment).

    python -m bench.prep_handoff_plot bench/prep_handoff.json --out bench/prep_handoff.svg
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

W, H, LEFT, TOP, BOTTOM = 860, 360, 60, 40, 120
# (row, metric, label): higher is better for each, except the p99s (marked)
FIGURES = [("misses", "rps", "misses/s"), ("misses", "p99_ms", "miss p99 (lower better)"),
           ("hits", "rps", "hits/s"), ("hits", "p99_ms", "hit p99 (lower better)"),
           ("hits+decode", "rps", "hits/s beside 4 streams"),
           ("hits+decode", "stream_tok_per_s", "those streams' tokens/s"),
           ("stream c=1", "tok_per_s", "stream c=1 tokens/s"), ("stream c=1", "gap_p99_ms", "c=1 gap p99 (lower)"),
           ("stream c=8", "tok_per_s", "stream c=8 tokens/s"), ("stream c=8", "gap_p99_ms", "c=8 gap p99 (lower)")]


def ratios(result: dict) -> list[tuple[str, float]]:
    s = result["summary"]
    return [(label, s[row]["T2"][metric] / s[row]["T1"][metric]) for row, metric, label in FIGURES]


def svg(rs: list[tuple[str, float]]) -> str:
    top = max(2.0, max(r for _, r in rs) * 1.1)
    plot_h, plot_w = H - TOP - BOTTOM, W - LEFT - 20
    bw = plot_w / len(rs)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
           f'font-size="11"><rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="13">tiny model, 2 cores: 2 engine processes '
           f'(a prep process handing misses over) / 1 process</text>']
    for i in range(5):
        v = top * i / 4
        yy = TOP + plot_h * (1 - v / top)
        out.append(f'<line x1="{LEFT}" x2="{W - 20}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#ddd"/>'
                   f'<text x="{LEFT - 4}" y="{yy + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    one = TOP + plot_h * (1 - 1 / top)
    for i, (label, r) in enumerate(rs):
        h = plot_h * r / top
        x = LEFT + i * bw + bw * 0.15
        colour = "#3498db" if "lower" not in label else "#e67e22"
        out.append(f'<rect x="{x:.1f}" y="{TOP + plot_h - h:.1f}" width="{bw * 0.7:.1f}" height="{h:.1f}" '
                   f'fill="{colour}"/><text x="{x + bw * 0.35:.1f}" y="{TOP + plot_h - h - 3:.1f}" '
                   f'text-anchor="middle">{r:.2f}</text>')
        cx = LEFT + i * bw + bw / 2
        out.append(f'<text x="{cx:.1f}" y="{H - BOTTOM + 14}" text-anchor="end" '
                   f'transform="rotate(-35 {cx:.1f} {H - BOTTOM + 14})">{label}</text>')
    out.append(f'<line x1="{LEFT}" x2="{W - 20}" y1="{one:.1f}" y2="{one:.1f}" stroke="#c0392b" '
               f'stroke-dasharray="4 3"/>')
    out.append("</svg>")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="?", default="bench/prep_handoff.json")
    ap.add_argument("--out", default="bench/prep_handoff.svg")
    args = ap.parse_args(argv)
    Path(args.out).write_text(svg(ratios(json.loads(Path(args.json).read_text()))) + "\n")


if __name__ == "__main__":
    main()
