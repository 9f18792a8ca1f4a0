"""A prep process's main (zccp.process.group starts it): `python -m zccp.process.prep_main RANK FD
EPOCH PARENT HANDOFF_FD`, the engine's resolved config (and, for a model backend, its ModelFacts)
pickled on stdin by its parent, the doorbell's listening socket inherited as FD, the handoff
channel to rank 0 as HANDOFF_FD (-1: none, the backend runs here). It serves rings as rank 0 does,
on the arena rank 0 published, and stops when rank 0 does: SIGTERM from it, or its death (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import ctypes
import logging
import pickle
import sys

from zccp.process.parent_death import die_with


def main(argv: list[str]) -> None:
    if len(argv) != 6:
        raise SystemExit("usage: python -m zccp.process.prep_main RANK FD EPOCH PARENT HANDOFF_FD "
                         "(started by the engine)")
    rank, fd, epoch, parent, handoff_fd = (int(a) for a in argv[1:])
    if not die_with(parent):
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    cfg, facts = pickle.load(sys.stdin.buffer)    # from the engine that started this process: its own
    from zccp.transport.arena import ArenaError
    from zccp.process.engine_main import run_engine
    from zccp.observe.logs import setup_logging
    from zccp.process.group import ProcessRole

    setup_logging(cfg.logging.level, cfg.logging.file)
    try:
        run_engine(cfg, ProcessRole(rank, fd, epoch, handoff_fd, facts))
    except ArenaError as exc:
        logging.getLogger("zccp.engine").error("prep process %d cannot start: %s", rank, exc)
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv)
