"""Every bench script imports: bench/ is run by hand, rarely, so a helper that moves in
tests/support (as remove_socket_dirs did, to leftovers) would break it unseen."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
MODULES = sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", MODULES)
def test_the_bench_script_imports(name: str) -> None:
    importlib.import_module(f"bench.{name}")
