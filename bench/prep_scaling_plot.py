"""bench/prep_scaling.svg from bench.prep_scaling's JSON: misses per second (median of rounds)
of B and of ZCCP with 1, 2 and 3 engine processes, one group per (cores, concurrency) cell of
the scaling table, then one per miss row of the matrix. A plain SVG (no plotting library in the
engine's environment).

    python -m bench.prep_scaling_plot bench/prep_scaling.json --out bench/prep_scaling.svg
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.svg_bars import Frame

W, H, LEFT, TOP, BOTTOM = 900, 380, 60, 40, 80
FRAME = Frame(W, H, LEFT, TOP, BOTTOM)
COLOURS = {"B": "#7f8c8d", "D1": "#aed6f1", "D2": "#3498db", "D3": "#1a5276"}


def groups(result: dict) -> list[tuple[str, dict[str, float]]]:
    out = []
    for c in result["scaling"]:
        out.append((f"{len(c['cpus'])} core{'s' if len(c['cpus']) > 1 else ''} c={c['conc']}",
                    {k: v["rps"] for k, v in c["variants"].items()}))
    for c in result["matrix"]:
        out.append((f"{c['workload']} c={c['conc']}", {k: v["rps"] for k, v in c["variants"].items()}))
    return out


def svg(gs: list[tuple[str, dict[str, float]]]) -> str:
    top = max(v for _, g in gs for v in g.values()) * 1.1
    gw = FRAME.plot_w / len(gs)
    bw = gw / 5
    out = FRAME.start("misses/s, cache bypassed, null model: B (nginx -&gt; FastAPI, 2 workers) and ZCCP with "
                      "1 / 2 / 3 engine processes", top)
    for gi, (label, g) in enumerate(gs):
        x0 = LEFT + gi * gw + bw / 2
        for bi, key in enumerate(("B", "D1", "D2", "D3")):
            if key not in g:
                continue
            h = FRAME.plot_h * g[key] / top
            out.append(f'<rect x="{x0 + bi * bw:.1f}" y="{TOP + FRAME.plot_h - h:.1f}" width="{bw * 0.9:.1f}" '
                       f'height="{h:.1f}" fill="{COLOURS[key]}"/>')
        out.append(FRAME.label(LEFT + gi * gw + gw / 2, label))
    for i, (key, colour) in enumerate(COLOURS.items()):
        out.append(f'<rect x="{LEFT + 10 + i * 70}" y="{TOP - 14}" width="10" height="10" fill="{colour}"/>'
                   f'<text x="{LEFT + 24 + i * 70}" y="{TOP - 5}">{key}</text>')
    out.append("</svg>")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json")
    ap.add_argument("--out", default="bench/prep_scaling.svg")
    args = ap.parse_args(argv)
    Path(args.out).write_text(svg(groups(json.loads(Path(args.json).read_text()))))


if __name__ == "__main__":
    main()
