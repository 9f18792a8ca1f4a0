"""Per-process accounting from /proc: CPU seconds (utime+stime) and kernel I/O bytes.

A service is a root pid plus all its descendants (nginx master + workers, uvicorn
or gunicorn master + workers). Snapshots are taken right before and right after a
measured wrk run; a process present only in the second snapshot counts from zero.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, utime, stime) in clock ticks, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # comm may contain spaces/parentheses: split after the last ')'.
    rest = data[data.rindex(b")") + 2:].split()
    # rest[0] is field 3 (state); ppid = field 4, utime = 14, stime = 15
    return int(rest[1]), int(rest[11]), int(rest[12])


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = _stat(int(name))
        if st is not None:
            children.setdefault(st[0], []).append(int(name))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _io(pid: int) -> tuple[int, int]:
    try:
        with open(f"/proc/{pid}/io") as f:
            kv = dict(line.split(": ") for line in f.read().splitlines())
        return int(kv["rchar"]), int(kv["wchar"])
    except (OSError, KeyError, ValueError):
        return 0, 0


@dataclass
class Snap:
    cpu: dict[int, int]          # pid -> utime+stime ticks
    io: dict[int, tuple[int, int]]


def snapshot(root: int) -> Snap:
    cpu, io = {}, {}
    for pid in descendants(root):
        st = _stat(pid)
        if st is None:
            continue
        cpu[pid] = st[1] + st[2]
        io[pid] = _io(pid)
    return Snap(cpu, io)


def delta(before: Snap, after: Snap) -> dict[str, float]:
    """CPU seconds, bytes read and written (read/write syscalls incl. sockets) between snapshots."""
    cpu = sum(t - before.cpu.get(pid, 0) for pid, t in after.cpu.items())
    rchar = sum(r - before.io.get(pid, (0, 0))[0] for pid, (r, _) in after.io.items())
    wchar = sum(w - before.io.get(pid, (0, 0))[1] for pid, (_, w) in after.io.items())
    return {"cpu_s": cpu / TICK, "rchar": rchar, "wchar": wchar, "procs": len(after.cpu)}


def machine_busy_s() -> float:
    """CPU seconds all cores spent busy (user+nice+system+irq+softirq+steal), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / TICK
