"""This checkout's root, and the check that `zccp` is imported from it (not from another
checkout a shared venv's `pip install -e` points at)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def require_this_checkout() -> None:
    """Raise unless `zccp` comes from REPO/engine. pytest puts it first (pyproject's pythonpath);
    a bench script or tool run elsewhere: `PYTHONPATH=engine python -m ...` from the root."""
    import zccp

    where = Path(zccp.__file__).resolve()
    if not where.is_relative_to(REPO / "engine"):
        raise RuntimeError(f"zccp is imported from {where}, not from this checkout ({REPO}): run from the "
                           "checkout's root with PYTHONPATH=engine (or pip install -e . here)")
