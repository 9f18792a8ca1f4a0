"""bench/prep_handoff.svg from bench.prep_handoff's JSON: for each figure, the tiny engine of 2
processes (T2, a prep process handing its misses over) against 1 (T1), as T2 / T1 of the
medians, with the 1.0 line. A plain SVG (no plotting library in the engine's environment).

    python -m bench.prep_handoff_plot bench/prep_handoff.json --out bench/prep_handoff.svg
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.svg_bars import Frame

W, H, LEFT, TOP, BOTTOM = 860, 360, 60, 40, 120
FRAME = Frame(W, H, LEFT, TOP, BOTTOM)
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
    bw = FRAME.plot_w / len(rs)
    out = FRAME.start("tiny model, 2 cores: 2 engine processes (a prep process handing misses over) / 1 process",
                      top, ".2f")
    for i, (label, r) in enumerate(rs):
        h = FRAME.plot_h * r / top
        x = LEFT + i * bw + bw * 0.15
        colour = "#3498db" if "lower" not in label else "#e67e22"
        out.append(f'<rect x="{x:.1f}" y="{TOP + FRAME.plot_h - h:.1f}" width="{bw * 0.7:.1f}" height="{h:.1f}" '
                   f'fill="{colour}"/><text x="{x + bw * 0.35:.1f}" y="{TOP + FRAME.plot_h - h - 3:.1f}" '
                   f'text-anchor="middle">{r:.2f}</text>')
        out.append(FRAME.label(LEFT + i * bw + bw / 2, label))
    one = FRAME.y(1.0, top)
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
