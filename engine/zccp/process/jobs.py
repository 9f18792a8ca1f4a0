"""One ring being answered, as the engine's job table holds it: a nginx connection's
(Job), or a miss a prep process handed over (HandoffJob, zccp.process.handoff)."""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Callable

from zccp.process.handoff import N_PREFIX, NOT_STORED, Ended, done_frame
from zccp.shared_types import Completed
from zccp.transport.abi import REQUEST_ID_MAX, Op, ffi
from zccp.transport.arena import SlotView
from zccp.transport.doorbell import Connection, encode_notice


class Job:
    """One ring being answered. cancel() may come from the loop or the sweeper; the model
    thread reads cancelled() (a flag: a plain attribute is enough under the GIL)."""

    __slots__ = ("conn", "view", "generation", "_cancelled", "_on_done", "forward_cancel")

    def __init__(self, conn: Connection, view: SlotView, generation: int,
                 on_done: Callable[[Job], None] | None = None) -> None:
        self.conn = conn
        self.view = view
        self.generation = generation
        self._cancelled = False
        self._on_done = on_done
        self.forward_cancel: Callable[[], None] | None = None   # a prep process's handed miss: tell rank 0

    def notify(self, total: int, final: bool, status: int) -> None:
        """The response ring's notice to the nginx worker that rang (the writer's notify)."""
        self.conn.send(encode_notice(Op.NOTICE, self.view.index, self.generation, total & 0xFFFFFFFF, int(final),
                                     status))

    def done(self) -> None:
        """The flow is over (its on_done): the engine drops the job."""
        if self._on_done is not None:
            self._on_done(self)

    def cancel(self) -> None:
        self._cancelled = True
        if self.forward_cancel is not None:
            self.forward_cancel()

    def cancelled(self) -> bool:
        if self._cancelled:
            return True
        deadline = self.view.header.deadline_ns
        if deadline and time.time_ns() > deadline:
            self._cancelled = True
        return self._cancelled


class HandoffJob(Job):
    """A prep process's miss (rank 0's side): its notices and its ending go back through that
    process's channel, which relays them to nginx; the ending carries the complete answer for
    the prep process to store."""

    __slots__ = ("completed", "literals")

    def __init__(self, conn: Connection, view: SlotView, generation: int,
                 on_done: Callable[[Job], None] | None = None) -> None:
        super().__init__(conn, view, generation, on_done)
        self.completed: Completed | None = None
        self.literals: tuple[str, ...] = ()

    def notify(self, total: int, final: bool, status: int) -> None:
        self.conn.send(N_PREFIX + encode_notice(Op.NOTICE, self.view.index, self.generation,
                                                total & 0xFFFFFFFF, int(final), status))

    def done(self) -> None:
        try:
            data = done_frame(self.view.index, self.generation, Ended(self.completed, self.literals))
        except (pickle.PicklingError, ValueError, TypeError):
            data = done_frame(self.view.index, self.generation, NOT_STORED)
        self.conn.send(data)
        super().done()


def process_exists(pid: int) -> bool:
    """Whether `pid` names a process here. A worker in another pid namespace (nginx in its
    own container) may look gone: its slot is then only reset after the grace, which cannot
    hand it to anyone else (nginx's shared-dict claim still holds it)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def request_id(view: SlotView) -> str:
    """The slot's request id (X-Request-ID), printable ASCII only: shared memory is input."""
    req = view.request
    n = req.request_id_len
    if not n:
        return ""
    if n > REQUEST_ID_MAX:
        return "<invalid>"
    try:
        text = bytes(ffi.buffer(req.request_id, n)).decode("ascii")
    except UnicodeDecodeError:
        return "<invalid>"
    return text if text.isprintable() else "<invalid>"
