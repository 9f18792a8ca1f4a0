"""bench/tracing.svg from bench.tracing_ab's JSON files: each round's paired on/off req/s,
miss and hit, one group per file, with the issue's floors (miss 0.95, hit 0.90). A plain
SVG (no plotting library in the engine's environment).

    python -m bench.tracing_plot LABEL=FILE.json [LABEL=FILE.json ...] --out bench/tracing.svg
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

W, H, LEFT, TOP, BOTTOM = 720, 360, 60, 30, 60
COLOURS = {"miss": "#c0392b", "hit": "#2874a6"}


def ratios(path: Path) -> dict[str, list[float]]:
    runs = json.loads(path.read_text())["runs"]
    return {p: [on["rps"] / off["rps"] for off, on in zip(runs[f"off {p}"], runs[f"on {p}"], strict=True)]
            for p in ("miss", "hit")}


def svg(groups: list[tuple[str, dict[str, list[float]]]], top: float = 1.4) -> str:
    plot_h = H - TOP - BOTTOM
    y = lambda v: TOP + plot_h * (1 - min(v, top) / top)   # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
           f'font-size="12"><rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="18" text-anchor="middle">tracing at ratio 1.0: req/s on / off, '
           f'each round (null engine, c=16)</text>']
    for v in (0.0, 0.25, 0.5, 0.75, 1.0, 1.25):
        out.append(f'<line x1="{LEFT}" x2="{W - 10}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>'
                   f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    for floor, path in ((0.95, "miss"), (0.90, "hit")):
        out.append(f'<line x1="{LEFT}" x2="{W - 10}" y1="{y(floor):.1f}" y2="{y(floor):.1f}" '
                   f'stroke="{COLOURS[path]}" stroke-dasharray="4 3"/>')
    gw = (W - LEFT - 10) / len(groups)
    for gi, (label, r) in enumerate(groups):
        x0 = LEFT + gi * gw + 10
        bars = [(p, v) for p in ("miss", "hit") for v in r[p]]
        bw = (gw - 20) / max(len(bars), 1)
        for bi, (p, v) in enumerate(bars):
            x = x0 + bi * bw
            out.append(f'<rect x="{x:.1f}" y="{y(v):.1f}" width="{bw - 3:.1f}" height="{y(0) - y(v):.1f}" '
                       f'fill="{COLOURS[p]}"><title>{p} {v:.3f}</title></rect>')
        out.append(f'<text x="{x0 + (gw - 20) / 2:.1f}" y="{H - BOTTOM + 18}" text-anchor="middle">{label}</text>')
    out.append(f'<text x="{LEFT}" y="{H - 14}" fill="{COLOURS["miss"]}">miss (floor 0.95, dashed)</text>'
               f'<text x="{LEFT + 220}" y="{H - 14}" fill="{COLOURS["hit"]}">L1 hit (floor 0.90, dashed)</text>')
    return "\n".join(out + ["</svg>"]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", help="LABEL=FILE.json")
    ap.add_argument("--out", type=Path, default=Path("bench/tracing.svg"))
    args = ap.parse_args()
    groups = [(label, ratios(Path(f))) for label, _, f in (a.partition("=") for a in args.runs)]
    args.out.write_text(svg(groups))


if __name__ == "__main__":
    main()
