"""An engine of several processes. Rank 0 owns the model: it makes the arena, binds the
doorbell, sweeps, and serves /metrics for all. Prep processes (ranks 1..n-1, zccp.process.prep_main)
attach the same arena and accept on the same listening socket, and each process also on a
doorbell of its own that nginx rings in turn (the control page's doorbell_count); the process
a ring reaches parses, looks up the cache, runs the backend and writes the answer. A backend every
process can run on its own (PER_PROCESS_BACKENDS: null, upstream) runs in each; one that holds a
model (HANDOFF_BACKENDS: tiny, hf) runs in rank 0 only, and a prep process hands it its misses
over a socketpair of its own (zccp.process.handoff): one model has one owner.

Why processes: one Python event loop caps the misses an engine answers at one core (the
GIL); vLLM splits its API server from its engine core for the same reason."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from zccp.config import HANDOFF_BACKENDS, PER_PROCESS_BACKENDS, Config
from zccp.observe.metrics import STATE_REQUEST, EngineMetrics
from zccp.observe.metrics_merge import STATE_MAX_BYTES
from zccp.transport.abi import SOCKET_PATH_MAX

if TYPE_CHECKING:
    from zccp.process.handoff import ModelFacts
    from zccp.transport.arena import Arena
    from zccp.transport.doorbell import DoorbellServer

log = logging.getLogger("zccp.engine")

MAX_AUTO = 8            # prep processes an unset engine_processes grows to
RESTART_FIRST_S = 0.5   # a prep process that died is started again after this, doubling
RESTART_MAX_S = 30.0
STOP_WAIT_S = 5.0       # SIGTERM, then SIGKILL after this
GATHER_WAIT_S = 1.0     # a prep process's metrics state, or the page goes without it
READY_WAIT_S = 20.0     # rank 0 waits this long for its prep processes before accepting itself


@dataclass(frozen=True)
class ProcessRole:
    """Which process of the engine this is; rank 0 has no doorbell_fd (it binds the socket)."""
    rank: int = 0
    doorbell_fd: int = -1
    epoch: int = 0      # the arena a prep process must find published
    handoff_fd: int = -1                # a model backend's prep process: its channel to rank 0
    facts: ModelFacts | None = None     # ... and rank 0's model, as prepare() checks against it

    @property
    def owner(self) -> bool:
        return self.rank == 0


MODEL_OWNER = ProcessRole()


def process_count(cfg: Config, cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """server.engine_processes, or (0) half the CPUs this process may run on, 1..MAX_AUTO:
    nginx's workers need the rest. A backend registered outside PER_PROCESS_BACKENDS and
    HANDOFF_BACKENDS (its prompt side unknown here) runs in one process."""
    if cfg.model.backend not in PER_PROCESS_BACKENDS + HANDOFF_BACKENDS:
        return 1
    if cfg.server.engine_processes:
        return cfg.server.engine_processes
    return max(1, min(MAX_AUTO, usable_cpus(cpu_max) // 2))


def usable_cpus(cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """The CPUs this process may run on, fewer under a cgroup v2 CPU quota (a container's
    `cpus:` or a Pod's limits.cpu leave every CPU in the affinity mask)."""
    cpus = len(os.sched_getaffinity(0))
    try:
        quota, period = Path(cpu_max).read_text().split()[:2]
        if quota != "max" and int(period) > 0:
            cpus = min(cpus, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cpus


def own_doorbell(socket_path: str, rank: int) -> str | None:
    """Process `rank`'s own doorbell (the ABI's doorbell_count), or None where the path would
    not fit a unix socket's address: that process is then rung on the shared socket only."""
    path = f"{socket_path}.p{rank}"
    return path if len(path.encode()) <= SOCKET_PATH_MAX - 1 else None


def metrics_path(socket_path: str, rank: int) -> str:
    """A prep process's own metrics socket (its state, for rank 0's page)."""
    return f"{socket_path}.metrics.{rank}"


class _Member:
    __slots__ = ("rank", "proc", "backoff", "due")

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.proc: subprocess.Popen[bytes] | None = None
        self.backoff = RESTART_FIRST_S
        self.due = 0.0          # monotonic time of the next start


async def start_group(cfg: Config, count: int, doorbell: DoorbellServer, arena: Arena,
                      metrics: EngineMetrics, facts: ModelFacts | None = None,
                      on_channel: Callable[[socket.socket], None] | None = None) -> ProcessGroup:
    """Rank 0's prep processes started; once they accept (or after READY_WAIT_S), rank 0
    accepts too, and nginx is told to ring each process's own doorbell in turn. With facts
    (a model backend), each prep process gets a handoff channel, rank 0's end to on_channel."""
    assert cfg.server.socket_path is not None
    group = ProcessGroup(cfg, count, doorbell.listening_fd, arena.epoch, metrics, facts, on_channel)
    group.start()
    await group.ready()
    await doorbell.accept_now()
    if (own := own_doorbell(cfg.server.socket_path, 0)) is not None and \
            own_doorbell(cfg.server.socket_path, count - 1) is not None:
        await doorbell.listen_also(own)
        arena.set_doorbells(count)
    return group


class ProcessGroup:
    """Rank 0's prep processes: started, started again when one dies, stopped with it."""

    def __init__(self, cfg: Config, count: int, doorbell_fd: int, epoch: int, metrics: EngineMetrics,
                 facts: ModelFacts | None = None, on_channel: Callable[[socket.socket], None] | None = None) -> None:
        self.cfg = cfg
        self._metrics = metrics
        self._fd = doorbell_fd
        self._epoch = epoch
        self._members = [_Member(rank) for rank in range(1, count)]
        self._stopping = False
        self._config = pickle.dumps((cfg, facts))
        self._on_channel = on_channel if facts is not None else None

    def start(self) -> None:
        for m in self._members:
            self._spawn(m)

    async def ready(self, timeout: float = READY_WAIT_S) -> bool:
        """Whether every prep process accepts on the doorbell (it serves its metrics socket
        only after it does) within timeout. Rank 0 accepts only then: nginx keeps a doorbell
        connection for as long as it is busy, so the first ones would otherwise all be rank 0's."""
        socket_path = self.cfg.server.socket_path
        assert socket_path is not None
        paths = [Path(metrics_path(socket_path, m.rank)) for m in self._members]
        end = time.monotonic() + timeout
        while not all(p.is_socket() for p in paths):
            if time.monotonic() > end:
                log.warning("prep processes not serving after %.0f s: rank 0 accepts without them", timeout)
                return False
            await asyncio.sleep(0.02)
        return True

    def _spawn(self, m: _Member) -> None:
        socket_path = self.cfg.server.socket_path
        assert socket_path is not None
        with contextlib.suppress(FileNotFoundError):    # the last one's: ready() waits for the new one's
            os.unlink(metrics_path(socket_path, m.rank))
        ours: socket.socket | None = None
        theirs: socket.socket | None = None
        if self._on_channel is not None:     # the handoff channel: a pair of its own, no path
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fds = (self._fd,) if theirs is None else (self._fd, theirs.fileno())
        cmd = [sys.executable, "-m", "zccp.process.prep_main", str(m.rank), str(self._fd), str(self._epoch),
               str(os.getpid()), str(-1 if theirs is None else theirs.fileno())]
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, pass_fds=fds, close_fds=True)
        except OSError as exc:
            log.error("prep process %d: cannot start: %s", m.rank, exc)
            m.due = time.monotonic() + m.backoff
            for sock in (ours, theirs):
                if sock is not None:
                    sock.close()
            return
        if theirs is not None:
            theirs.close()                    # the child's now
        if ours is not None and self._on_channel is not None:
            self._on_channel(ours)
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(self._config)    # a few KiB: the pipe holds it
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
        m.proc = proc
        log.info("prep process %d started (pid %d)", m.rank, proc.pid)

    def check(self, now: float | None = None) -> int:
        """Start again the prep processes that died (after their backoff); how many are alive."""
        now = time.monotonic() if now is None else now
        alive = 0
        for m in self._members:
            if m.proc is not None:
                code = m.proc.poll()
                if code is None:
                    alive += 1
                    if now - m.due > 60:
                        m.backoff = RESTART_FIRST_S   # up for a minute: a later death starts afresh
                    continue
                log.error("prep process %d (pid %d) exited with %s; starting it again in %.1f s",
                          m.rank, m.proc.pid, code, m.backoff)
                m.proc = None
                m.due = now + m.backoff
                m.backoff = min(m.backoff * 2, RESTART_MAX_S)
            if not self._stopping and now >= m.due:
                self._spawn(m)
                if m.proc is not None:
                    m.due = now     # its start time (a failed start set its next try)
        self._metrics.processes.set(alive + 1)
        return alive

    async def supervise(self, period: float = 0.25) -> None:
        while True:
            await asyncio.sleep(period)
            self.check()

    async def stop(self) -> None:
        """SIGTERM each prep process (it stops as rank 0 does: its rings' jobs cancelled, its
        arena view closed), then SIGKILL what is left after STOP_WAIT_S."""
        self._stopping = True
        procs = [m.proc for m in self._members if m.proc is not None]
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for p in procs:
            if p.poll() is None:
                log.warning("prep process pid %d did not stop in %.0f s: killed", p.pid, STOP_WAIT_S)
                p.kill()
                await asyncio.to_thread(p.wait)

    async def gather(self) -> list[object]:
        """Every live prep process's metrics state (zccp.observe.metrics_merge); one that does not
        answer within GATHER_WAIT_S is left out of this page."""
        socket_path = self.cfg.server.socket_path
        assert socket_path is not None
        got = await asyncio.gather(*(_state(metrics_path(socket_path, m.rank)) for m in self._members
                                     if m.proc is not None))
        return [s for s in got if s is not None]


async def _state(path: str) -> object | None:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), GATHER_WAIT_S)
    except (OSError, asyncio.TimeoutError):
        return None
    try:
        writer.write(STATE_REQUEST)
        data = await asyncio.wait_for(_read_to_eof(reader), GATHER_WAIT_S)
        return None if data is None else json.loads(data)
    except (OSError, asyncio.TimeoutError, ValueError):
        return None
    finally:
        writer.close()


async def _read_to_eof(reader: asyncio.StreamReader) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while chunk := await reader.read(1 << 16):
        size += len(chunk)
        if size > STATE_MAX_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
