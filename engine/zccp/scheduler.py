"""The model thread: every active generation advanced one token at a time, in turn.

Requests arrive as step generators (zccp.pipeline.execute_steps). One thread runs them
round-robin, so a long generation never holds up the first token of a new request:
time to first token under concurrency is one prefill plus a round of token steps, not
the sum of every earlier request's whole generation. One thread, because the model is
the serial resource on this machine and torch parallelises inside each step.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Generator
from typing import Any

log = logging.getLogger("zccp.scheduler")

Steps = Generator[None, None, Any]
OnDone = Callable[[Any], None]


class RoundRobinScheduler:
    def __init__(self, name: str = "zccp-model") -> None:
        self._inbox: queue.SimpleQueue[tuple[Steps, OnDone] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, steps: Steps, on_done: OnDone) -> None:
        """on_done(result) runs on the model thread when `steps` finishes."""
        self._inbox.put((steps, on_done))

    def stop(self, timeout: float = 10.0) -> None:
        self._inbox.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        active: deque[tuple[Steps, OnDone]] = deque()
        stopping = False
        while active or not stopping:
            try:
                # Block only when idle; otherwise just pick up whatever has arrived.
                item = self._inbox.get() if not active else self._inbox.get_nowait()
            except queue.Empty:
                item = ()
            if item is None:
                stopping = True
            elif item:
                active.append(item)
                continue  # drain the inbox before the next step
            if not active:
                continue
            steps, on_done = active.popleft()
            try:
                next(steps)
            except StopIteration as done:
                self._finish(on_done, done.value)
                continue
            except BaseException:  # execute_steps never raises; a bug must not kill the thread
                log.exception("model step failed")
                self._finish(on_done, None)
                continue
            active.append((steps, on_done))

    @staticmethod
    def _finish(on_done: OnDone, value: Any) -> None:
        try:
            on_done(value)
        except BaseException:
            log.exception("completion callback failed")
