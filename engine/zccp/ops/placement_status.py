"""The placement in force, read back from /proc (`zccp-stack status`): each engine's
allowed CPUs (every thread's Cpus_allowed_list), its arena's memory policy and the nodes
its pages are on (numa_maps), and nginx's workers' CPUs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from zccp.process.placement import format_cpulist, parse_cpulist

_PAGES = re.compile(r"\bN(\d+)=(\d+)")


def allowed_cpus(pid: int, tid: int | None = None, proc: Path = Path("/proc")) -> list[int]:
    """Cpus_allowed_list of a process (or one of its threads)."""
    status = proc / str(pid) / ("status" if tid is None else f"task/{tid}/status")
    for line in status.read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return parse_cpulist(line.split(":", 1)[1])
    return []


def thread_cpus(pid: int, proc: Path = Path("/proc")) -> dict[int, list[int]]:
    """Each thread of pid and its allowed CPUs."""
    out = {}
    for t in sorted((proc / str(pid) / "task").iterdir(), key=lambda p: int(p.name)):
        try:
            out[int(t.name)] = allowed_cpus(pid, int(t.name), proc)
        except OSError:      # ended meanwhile
            pass
    return out


@dataclass(frozen=True)
class MappingNuma:
    policy: str                  # numa_maps' policy word: default, prefer:0, bind:0-1, ...
    pages: dict[int, int]        # node -> pages of the mapping there


def arena_numa(pid: int, shm_name: str, proc: Path = Path("/proc")) -> MappingNuma | None:
    """The arena's line of pid's numa_maps (its file, /dev/shm/<name>); None if not mapped."""
    needle = "/dev/shm/" + shm_name.lstrip("/")
    for line in (proc / str(pid) / "numa_maps").read_text().splitlines():
        if f" file={needle} " in line + " ":
            fields = line.split()
            return MappingNuma(fields[1], {int(n): int(c) for n, c in _PAGES.findall(line)})
    return None


def describe(engines: list[tuple[str, int, str]], nginx_workers: list[int]) -> list[str]:
    """Lines for `zccp-stack status`: engines as (name, pid, arena name)."""
    lines = []
    for name, pid, shm in engines:
        try:
            threads = thread_cpus(pid)
            cpus = sorted({c for cs in threads.values() for c in cs})
            numa = arena_numa(pid, shm)
        except OSError as exc:
            lines.append(f"engine {name} (pid {pid}): cannot read /proc: {exc.strerror}")
            continue
        where = "not mapped" if numa is None else (
            f"policy {numa.policy}, pages on " + (", ".join(f"node {n}: {c}" for n, c in sorted(numa.pages.items()))
                                                  or "no node yet"))
        lines.append(f"engine {name} (pid {pid}): CPUs {format_cpulist(cpus)} ({len(threads)} threads); "
                     f"arena {shm}: {where}")
    for pid in nginx_workers:
        try:
            lines.append(f"nginx worker (pid {pid}): CPUs {format_cpulist(allowed_cpus(pid))}")
        except OSError as exc:
            lines.append(f"nginx worker (pid {pid}): cannot read /proc: {exc.strerror}")
    return lines
