"""What a streamed token does not pay for any more (issue 47): the model thread's notices wake
the event loop once per batch the loop has not taken yet, not once each, and every notice
still leaves, in order."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from zccp.doorbell import Connection, encode_notice


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        pass


class _CountingLoop(asyncio.SelectorEventLoop):
    """A real loop that counts the wake-ups other threads ask of it."""

    def __init__(self) -> None:
        super().__init__()
        self.wakes = 0

    def call_soon_threadsafe(self, callback: Any, *args: Any, **kw: Any) -> Any:
        self.wakes += 1
        return super().call_soon_threadsafe(callback, *args, **kw)


def _from_thread(conn: Connection, frames: list[bytes]) -> None:
    th = threading.Thread(target=lambda: [conn.send(f) for f in frames])
    th.start()
    th.join()            # the loop is held here: nothing of the inbox is taken meanwhile


def test_the_model_threads_notices_wake_the_loop_once_per_batch_all_in_order() -> None:
    loop = _CountingLoop()
    t = _Transport()
    first = [encode_notice(2, 3, 7, n, 0, 200) for n in range(1, 101)]
    second = [encode_notice(2, 3, 7, n, 0, 200) for n in range(101, 104)] + [encode_notice(2, 3, 7, 103, 1, 200)]

    async def main() -> None:
        conn = Connection(t, loop)  # type: ignore[arg-type]
        _from_thread(conn, first)
        assert loop.wakes == 1           # main asked one wake-up per notice (100)
        for _ in range(3):
            await asyncio.sleep(0)
        assert b"".join(t.writes) == b"".join(first)
        assert len(t.writes) == 1        # the batch leaves in one write
        _from_thread(conn, second)       # the loop took the inbox: the next notice wakes it again
        assert loop.wakes == 2
        for _ in range(3):
            await asyncio.sleep(0)
        conn.close()
        _from_thread(conn, [encode_notice(2, 3, 7, 0, 1, 200)])   # after close: dropped, no wake-up
        assert loop.wakes == 2

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert b"".join(t.writes) == b"".join(first + second)
