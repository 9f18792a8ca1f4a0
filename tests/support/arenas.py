"""The shared-memory arenas this test session's stacks name (/dev/shm/<name>). An engine that
is SIGKILLed (a crash test, a host left dead, `zccp-stack` killed) cannot unlink its own:
the stack's stop() does, and the session fails when one outlives it (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Final

ARENAS: list[str] = []               # every arena name a Stack of this session made
SHM: Final = Path("/dev/shm")
PREFIX: Final = "zccp.test."         # the harness's names: /zccp.test.<tag>[.<engine>]


def arena_path(name: str) -> Path:
    return SHM / name.lstrip("/")


def remove_arenas(names: list[str]) -> None:
    for name in names:
        arena_path(name).unlink(missing_ok=True)


def present() -> set[str]:
    """The harness's arenas in /dev/shm now (any session's)."""
    return {p.name for p in SHM.glob(PREFIX + "*")}


def left_by_this_session(before: set[str]) -> list[str]:
    """This session's arenas still in /dev/shm that were not there when it began (other
    sessions on the host make and remove their own meanwhile)."""
    ours = {n.lstrip("/") for n in ARENAS}
    return sorted((present() - before) & ours)
