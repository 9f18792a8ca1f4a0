"""The engine's end of the pipe to its span process (zccp.observe.trace_spans), driven by the event
loop: no second Python thread in the engine takes the GIL from it. Every batch (or every
OTEL_BSP_SCHEDULE_DELAY) the queued records are packed into frames and written without
blocking; what the pipe cannot take now waits for the loop's writer callback, up to
PENDING_MAX bytes (past it a batch is dropped and counted). The counts the span process
writes back ("exported N", "failed N") are read with the loop's reader callback.
"""

from __future__ import annotations

import asyncio
import os
import select
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

PENDING_MAX = 8 << 20       # bytes of frames waiting for a slow span process


class SpanPipe:
    def __init__(self, proc: subprocess.Popen[bytes], records: deque[tuple[Any, ...]], batch: int, delay: float,
                 frame: Callable[[Any], bytes], on_count: Callable[[str, int], None],
                 on_drop: Callable[[list[tuple[Any, ...]]], None]) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._proc = proc
        self._in, self._out = proc.stdin.fileno(), proc.stdout.fileno()
        os.set_blocking(self._in, False)
        os.set_blocking(self._out, False)
        self._records, self._batch, self._delay = records, batch, delay
        self._frame, self._on_count, self._on_drop = frame, on_count, on_drop
        self._pending = bytearray()
        self._lines = b""
        self._writing = False
        self.gone = False
        self._loop.add_reader(self._out, self._read)
        self._timer = self._loop.call_later(delay, self._tick)

    def kick(self) -> None:
        """A batch is ready (from any thread: a request may end on the model thread)."""
        if threading.get_ident() == self._thread:
            self._loop.call_soon(self.flush)
        else:
            self._loop.call_soon_threadsafe(self.flush)

    def _tick(self) -> None:
        self.flush()
        self._timer = self._loop.call_later(self._delay, self._tick)

    def _pack(self) -> None:
        records = self._records
        while records:
            batch = [records.popleft() for _ in range(min(len(records), self._batch))]
            if self.gone or len(self._pending) > PENDING_MAX:
                self._on_drop(batch)
            else:
                self._pending += self._frame(batch)

    def flush(self) -> None:
        self._pack()
        self._write()

    def _send_some(self) -> None:
        if self._pending and not self.gone:
            try:
                n = os.write(self._in, self._pending)
            except BlockingIOError:
                n = 0
            except OSError:            # the span process is gone: what it would have sent is dropped
                self.gone = True
                n = len(self._pending)
            del self._pending[:n]

    def _write(self) -> None:
        self._send_some()
        want = bool(self._pending)
        if want != self._writing:
            if want:
                self._loop.add_writer(self._in, self._write)
            else:
                self._loop.remove_writer(self._in)
            self._writing = want

    def _counts(self, data: bytes) -> None:
        *lines, self._lines = (self._lines + data).split(b"\n")
        for line in lines:
            what, _, n = line.partition(b" ")
            if n.isdigit():
                self._on_count(what.decode("ascii", "replace"), int(n))

    def _read(self) -> None:
        try:
            data = os.read(self._out, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self._counts(data)
        else:
            self._loop.remove_reader(self._out)

    def close(self, seconds: float) -> None:
        """From a thread the loop waits for (the engine's stop): the loop lets go of the pipe,
        then what is queued is written, the pipe closed and the counts read, for `seconds`."""
        end = time.monotonic() + seconds
        detached = threading.Event()

        def detach() -> None:
            self._timer.cancel()
            if self._writing:
                self._loop.remove_writer(self._in)
                self._writing = False
            self._loop.remove_reader(self._out)
            detached.set()

        try:
            self._loop.call_soon_threadsafe(detach)
            detached.wait(2)
        except RuntimeError:           # the loop is closed: nothing of it to detach
            pass
        self._pack()
        while self._pending and not self.gone and (left := end - time.monotonic()) > 0:
            if select.select([], [self._in], [], left)[1]:
                self._send_some()
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        while (left := end - time.monotonic()) > 0 and select.select([self._out], [], [], left)[0]:
            try:
                data = os.read(self._out, 4096)
            except OSError:
                break
            if not data:
                break
            self._counts(data)
