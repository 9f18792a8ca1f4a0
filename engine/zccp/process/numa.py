"""Applying an engine's placement to its own process: every thread's CPU affinity, and its
memory node (set_mempolicy for what it allocates; mbind with MPOL_MF_MOVE for the arena's
mapping). The two NUMA calls are raw system calls through cffi: libnuma would be a
dependency for two calls. A refused call (a container's seccomp profile refuses them
without CAP_SYS_NICE) is logged, never fatal: placement is an optimisation."""

from __future__ import annotations

import logging
import os
import platform
from typing import Any

import cffi

from zccp.config import Config
from zccp.process.placement import EnginePlacement, placement_for

log = logging.getLogger("zccp.placement")

MPOL_PREFERRED = 1
MPOL_MF_MOVE = 1 << 1
# (mbind, set_mempolicy) by machine; elsewhere the memory node is not set
_SYSCALLS = {"x86_64": (237, 238), "aarch64": (235, 237)}

_ffi = cffi.FFI()
_ffi.cdef("long syscall(long number, ...);")
_libc: Any = _ffi.dlopen(None)


def _nodemask(node: int) -> tuple[object, int]:
    words = node // 64 + 1
    mask = _ffi.new("unsigned long[]", words)
    mask[node // 64] = 1 << (node % 64)
    return mask, words * 64 + 1


def _syscall(which: int, *args: object) -> bool:
    nums = _SYSCALLS.get(platform.machine())
    if nums is None:
        log.warning("placement: no NUMA memory policy on %s (its system call numbers are not known here)",
                    platform.machine())
        return False
    if _libc.syscall(_ffi.cast("long", nums[which]), *args) != 0:
        err = _ffi.errno
        log.warning("placement: %s refused: %s", ("mbind", "set_mempolicy")[which], os.strerror(err))
        return False
    return True


def prefer_node(node: int) -> bool:
    """This process' later allocations on `node` first (numactl --preferred)."""
    mask, maxnode = _nodemask(node)
    return _syscall(1, _ffi.cast("int", MPOL_PREFERRED), mask, _ffi.cast("unsigned long", maxnode))


def bind_range(address: int, length: int, node: int) -> bool:
    """The pages of [address, address + length) on `node` first, those already there moved
    (the arena's mapping: numa_maps then shows its policy, prefer:<node>)."""
    mask, maxnode = _nodemask(node)
    return _syscall(0, _ffi.cast("unsigned long", address), _ffi.cast("unsigned long", length),
                    _ffi.cast("unsigned long", MPOL_PREFERRED), mask, _ffi.cast("unsigned long", maxnode),
                    _ffi.cast("unsigned", MPOL_MF_MOVE))


def pin_threads(cpus: set[int]) -> None:
    """Every thread of this process on `cpus` (threads started later inherit it)."""
    for tid in sorted(int(t) for t in os.listdir("/proc/self/task")):
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:      # a thread that ended meanwhile
            pass


def apply(cfg: Config) -> EnginePlacement | None:
    """The engine's placement, applied to its threads and memory policy (before its arena
    and its model allocate); None: placement none."""
    p = placement_for(cfg)
    if p is None:
        return None
    pin_threads(set(p.cpus))
    if p.numa_node is not None:
        prefer_node(p.numa_node)
    log.info("placement: CPUs %s, memory node %s", p.cpulist, p.numa_node)
    return p
