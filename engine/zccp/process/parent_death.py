"""Children that never outlive their parent (prctl PR_SET_PDEATHSIG): zccp-stack's services
(a preexec_fn) and an engine's prep processes (the first thing their main does)."""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1
# libc resolved at import, before any fork: a preexec_fn child only makes two system calls
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def die_with(parent: int) -> bool:
    """SIGTERM to this process when `parent` (the thread that started it) dies, even by
    SIGKILL; exit at once if it already has (before the prctl took effect). False: the prctl
    failed, the child is not bound to its parent."""
    took = _prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0
    if os.getppid() != parent:
        os._exit(1)
    return took
