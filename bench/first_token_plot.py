"""The figure of bench/guidellm.md's 2026-12-07 section: TTFT at c = 1 per round (bench.first_token),
chunk gaps and TTFT at c = 8 (bench.first_token --conc 8) and guidellm's TTFT p50 (bench.guidellm_peer),
ZCCP against the peer.

    .venv/bin/python -m bench.first_token_plot [--c1 bench/first_token_c1.json] [--c8 bench/first_token_c8.json]
        [--guidellm bench/guidellm_peer.json] [--out bench/first_token.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parent
COLORS = {"D": "#4c72b0", "D-base": "#999999", "P": "#dd8452"}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--c1", default=str(BENCH / "first_token_c1.json"))
    ap.add_argument("--c8", default=str(BENCH / "first_token_c8.json"))
    ap.add_argument("--guidellm", default=str(BENCH / "guidellm_peer.json"))
    ap.add_argument("--out", default=str(BENCH / "first_token.png"))
    a = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    runs = json.loads(Path(a.c1).read_text())["runs"]
    ax = axes[0]
    for name, color in COLORS.items():
        mine = [r for r in runs if r["variant"] == name]
        if mine:
            ax.plot([r["round"] for r in mine], [r["ttft_p50_ms"] for r in mine], "o-", color=color, label=name)
    ax.set(title="c = 1: TTFT p50 per round (own client)", xlabel="round", ylabel="ms")
    ax.legend()
    rows = json.loads(Path(a.c8).read_text())["median"]
    ax = axes[1]
    keys = ["gap_p50_ms", "gap_p99_ms", "ttft_p50_ms", "ttft_p99_ms"]
    width = 0.8 / len(rows)
    for i, r in enumerate(rows):
        xs = [k + i * width for k in range(len(keys))]
        ax.bar(xs, [r[k] for k in keys], width, color=COLORS.get(r["variant"], "#55a868"), label=r["variant"])
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(keys))], ["gap p50", "gap p99", "TTFT p50", "TTFT p99"])
    ax.set(title="c = 8, 128 tokens (own client)", ylabel="ms", yscale="log")
    ax.legend()
    ax = axes[2]
    gl = json.loads(Path(a.guidellm).read_text())["rows"]
    labels = sorted({(r["conc"], r["order"]) for r in gl})
    for j, name in enumerate(("D", "P")):
        # the latest run of each cell (bench/guidellm.md: the earlier ones repeated prompts)
        vals = [next((r["ttft_p50_ms"] or 0 for r in reversed(gl) if r["variant"] == name
                      and (r["conc"], r["order"]) == lab), 0) for lab in labels]
        ax.bar([k + j * 0.4 for k in range(len(labels))], vals, 0.4, color=COLORS[name], label=name)
    ax.set_xticks([k + 0.2 for k in range(len(labels))], [f"c={c} {o}" for c, o in labels])
    ax.set(title="guidellm: TTFT p50, latest run per cell", ylabel="ms", yscale="log")
    ax.legend()
    fig.suptitle("ZCCP (D) vs transformers serve --continuous-batching (P), medium checkpoint, shared 2-core host")
    fig.tight_layout()
    fig.savefig(a.out, dpi=90)


if __name__ == "__main__":
    main()
