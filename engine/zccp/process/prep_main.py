"""A prep process's main (zccp.process.group starts it): `python -m zccp.process.prep_main RANK FD
EPOCH`, the engine's resolved config pickled on stdin by its parent, the doorbell's listening
socket inherited as FD. It serves rings as rank 0 does, on the arena rank 0 published, and
stops when rank 0 does: SIGTERM from it, or its death (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import ctypes
import logging
import os
import pickle
import signal
import sys

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """SIGTERM when the process that started this one exits (a rank 0 SIGKILLed included)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:      # it exited before the prctl
        sys.exit(1)


def main(argv: list[str]) -> None:
    if len(argv) != 4:
        raise SystemExit("usage: python -m zccp.process.prep_main RANK FD EPOCH (started by the engine)")
    parent = os.getppid()
    rank, fd, epoch = int(argv[1]), int(argv[2]), int(argv[3])
    _die_with_parent(parent)
    cfg = pickle.load(sys.stdin.buffer)    # from the engine that started this process: its own
    from zccp.transport.arena import ArenaError
    from zccp.process.engine_main import run_engine
    from zccp.observe.logs import setup_logging
    from zccp.process.group import ProcessRole

    setup_logging(cfg.logging.level, cfg.logging.file)
    try:
        run_engine(cfg, ProcessRole(rank, fd, epoch))
    except ArenaError as exc:
        logging.getLogger("zccp.engine").error("prep process %d cannot start: %s", rank, exc)
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv)
