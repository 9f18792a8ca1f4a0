"""What a test session's stacks leave outside pytest's temp tree, and its removal: socket
directories under /tmp, and shared-memory arenas (/dev/shm/<name>). An engine that is
SIGKILLed (a crash test, a host left dead, `zccp-stack` killed) cannot unlink its arena:
the stack's stop() does, and the session fails when one outlives it (tests/conftest.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from zccp.config import Config

# Every socket directory a Stack of this process made under /tmp, for the session's
# clean-up (conftest) to remove even when a stack was only used for its config.
SOCKET_DIRS: list[Path] = []


def remove_socket_dirs() -> None:
    for d in SOCKET_DIRS:
        shutil.rmtree(d, ignore_errors=True)


ARENAS: list[str] = []               # every arena name a Stack of this session made
SHM: Final = Path("/dev/shm")
PREFIX: Final = "zccp.test."         # the harness's names: /zccp.test.<tag>[.<engine>]


def arena_names(cfg: Config) -> list[str]:
    """The arenas a stack's engines map (the one engine's, or each of engines:)."""
    return [cfg.shared_memory.name, *(e.shared_memory.name for e in cfg.engines)]


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
