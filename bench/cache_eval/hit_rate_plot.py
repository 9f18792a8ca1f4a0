"""hit_rate.png: the near-duplicate hit rate by true-Jaccard bucket (matplotlib; none without it)."""

from __future__ import annotations

from pathlib import Path

from bench.cache_eval.decision import THRESHOLD


def plot_hit_rate(rows: list[tuple[str, int, float, float, float]], pairs: int, path: Path) -> None:
    """rows: (bucket, pairs, hit rate, mean J, P(est >= 0.85)) per true-Jaccard bucket."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=110)
    xs = list(range(len(rows)))
    ax.bar(xs, [100 * r[2] for r in rows], color=["#c44" if r[3] < THRESHOLD else "#4a8" for r in rows], width=0.7)
    for x, r in zip(xs, rows, strict=True):
        ax.text(x, 100 * r[2] + 1.5, f"{100 * r[2]:.0f}%\nn={r[1]}", ha="center", va="bottom", fontsize=7.5)
    ax.plot(xs, [100 * r[4] for r in rows], "k--", marker="o", ms=3, lw=1,
            label="the estimate alone (before the exact check): P(estimate ≥ 0.85), binomial over 128 slots")
    ax.set_xticks(xs, [r[0] for r in rows], fontsize=8)
    ax.set_xlabel("true Jaccard of the pair (word 2-shingle sets, after masking)")
    ax.set_ylabel("served from cache (HIT or NEAR), %")
    ax.set_ylim(0, 118)
    ax.axhline(95, color="#888", lw=0.6, ls=":")
    ax.set_title(f"Near-duplicate hit rate vs true Jaccard ({pairs} ShareGPT pairs, threshold 0.85)", fontsize=10)
    ax.legend(loc="upper left", fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
