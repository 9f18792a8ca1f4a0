"""The Markdown that RESULTS.md's sections are made of: a table, a percentage with its counts."""

from __future__ import annotations


def pct(k: int, n: int, digits: int = 1) -> str:
    return "—" if n == 0 else f"{100 * k / n:.{digits}f}% ({k}/{n})"


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out
