"""Keeping a started stack running: each engine restarted when it dies, at once when it
had served, with growing backoff while it keeps dying before it serves; optionally a warm
standby engine per engine (its imports done, waiting on stdin) that takes over in ~0.1 s
instead of a fresh start's seconds of importing torch."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from zccp.config import Config
from zccp.transport.doorbell import engine_ping
from zccp.ops.stack import Service, _tail


@dataclass
class Backoff:
    """The delay before restarting an engine that died: none when it had served (it
    answered its doorbell PING: a crash after serving is not a crash loop), doubling from
    first_s up to max_s while it keeps dying before it serves."""

    first_s: float = 0.5
    max_s: float = 30.0
    delay_s: float = field(default=0.0, init=False)

    def after(self, served: bool) -> float:
        if served:
            self.delay_s = 0.0
        else:
            self.delay_s = min(max(self.delay_s * 2, self.first_s), self.max_s)
        return self.delay_s


def _say(msg: str) -> None:
    print(f"zccp-stack: {msg}", file=sys.stderr, flush=True)


def standby_of(svc: Service) -> Service:
    """An engine process for the same engine that imports everything, then waits for
    "go" on stdin (zccp-engine --standby): same command, log and environment."""
    return Service(svc.name, [*svc.cmd, "--standby"], svc.log_path, env=svc.env, stdin_pipe=True)


def take_over(spare: Service) -> bool:
    """Tell a standby to become the engine; False when it is gone or does not listen."""
    if not spare.alive or spare.proc is None or spare.proc.stdin is None:
        return False
    try:
        spare.proc.stdin.write(b"go\n")
        spare.proc.stdin.close()
    except OSError:
        return False
    spare.started_at = time.monotonic()
    return True


@dataclass
class _Tended:
    """One engine under supervision: its service, doorbell, standby and restart state."""

    svc: Service
    socket_path: str
    backoff: Backoff = field(default_factory=Backoff)
    restart_at: float | None = None
    died_at: float = 0.0
    waiting: bool = False
    served: bool = True          # the stack started it and waited for its PING
    spare: Service | None = None
    spare_failures: int = 0      # standbys that died waiting: after 3, none until the engine restarts
    plain: Service | None = None  # the engine as first started: what a restart without standby runs

    def __post_init__(self) -> None:
        self.plain = self.svc


@dataclass
class Supervisor:
    """Keeps a started stack running: each engine is restarted when it dies (nginx stays
    up, routes its model's requests to the other replicas, or answers 503 when there is
    none, and maps the new arena by itself); redis or nginx dying stops the stack with a
    non-zero status and the cause. standby: a warm spare per engine, started once the
    engine serves."""

    cfg: Config
    engines: list[tuple[Service, str]]      # each engine and its doorbell socket
    others: list[Service]
    standby: bool = False
    restarts: int = field(default=0, init=False)
    _tended: list[_Tended] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self._tended = [_Tended(svc, sock) for svc, sock in self.engines]

    def run(self, stopping: Callable[[], bool], poll_s: float = 0.05) -> int:
        """Until stopping() says so (0) or a service other than an engine exits (1)."""
        while not stopping():
            for svc in self.others:
                if not svc.alive:
                    _say(f"{svc.name} exited ({svc.exit_reason()}); stopping the rest. "
                         f"Its log, {svc.log_path}:\n{_tail(svc.log_path)}")
                    return 1
            for t in self._tended:
                self._tend_engine(t)
            time.sleep(poll_s)
        return 0

    def current(self) -> list[Service]:
        """The engines now running and their standbys (what to stop at the end)."""
        return [s for t in self._tended for s in (t.svc, t.spare) if s is not None]

    def stop_engines(self) -> None:
        for svc in self.current():
            svc.stop()

    def _tend_engine(self, t: _Tended) -> None:
        now = time.monotonic()
        eng = t.svc
        if t.restart_at is None and not eng.alive:
            lived = now - eng.started_at
            delay = t.backoff.after(t.served)
            t.died_at, t.restart_at, t.served = now, now + delay, False
            meanwhile = "its replicas take its requests, or nginx answers 503" if len(self._tended) > 1 \
                else "nginx answers 503 meanwhile"
            how = "its standby takes over" if t.spare is not None and t.spare.alive else "restarting it"
            _say(f"{eng.name} exited ({eng.exit_reason()}) after {lived:.1f} s; {how} in {delay:.1f} s "
                 f"({meanwhile})")
        if t.restart_at is not None and now >= t.restart_at:
            t.restart_at = None
            self.restarts += 1
            spare, t.spare = t.spare, None
            if spare is not None and take_over(spare):
                t.svc = spare
            else:
                if spare is not None:
                    spare.stop()
                assert t.plain is not None
                t.svc = t.plain
                t.svc.start()
            t.waiting = True
        if t.waiting and t.svc.alive and engine_ping(t.socket_path, 0.5) is not None:
            t.waiting, t.served, t.spare_failures = False, True, 0
            _say(f"{t.svc.name} serving again (pid {t.svc.pid}), {time.monotonic() - t.died_at:.1f} s after it "
                 f"exited")
        if t.spare is not None and not t.spare.alive:
            t.spare_failures += 1
            _say(f"{t.svc.name}'s standby exited ({t.spare.exit_reason()})"
                 + (f"; see {t.spare.log_path}" if t.spare.log_path else ""))
            t.spare = None
        if self.standby and t.served and not t.waiting and t.spare is None and t.spare_failures < 3:
            assert t.plain is not None
            with contextlib.suppress(OSError):
                t.spare = standby_of(t.plain)
                t.spare.start()
