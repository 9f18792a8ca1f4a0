"""What a streamed token does not pay for any more (issue 47), and what it still gets: the
model thread's notices wake the event loop once per batch the loop has not taken yet, not
once each, and every notice still leaves, in order; the byte detokenizer's ASCII shortcut
gives the decoder's text; a token's write still refuses a slot that is not ours."""

from __future__ import annotations

import asyncio
import codecs
import random
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from zccp.transport.abi import SlotLayout
from zccp.transport.arena import Arena
from zccp.transport.doorbell import Connection, encode_notice
from zccp.model.prompt import ByteFormat
from zccp.transport.ring_writer import ResponseWriter, SlotAbandoned
from tests.support.recording_transport import RecordingTransport




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
    t = RecordingTransport()
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
        conn._take_inbox()               # a wake-up whose frames an earlier one took: nothing to do
        conn.close()
        _from_thread(conn, [encode_notice(2, 3, 7, 0, 1, 200)])   # after close: dropped, no wake-up
        assert loop.wakes == 2

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert b"".join(t.writes) == b"".join(first + second)


def test_the_byte_detokenizer_gives_the_incremental_decoders_text_step_by_step() -> None:
    rng = random.Random(47)
    pieces = [*range(128), *"é€😀".encode(), 0x80, 0xBF, 0xC3, 0xF0, 0xFF, 256, 300, -1]
    for _ in range(2000):
        ids = [rng.choice(pieces) for _ in range(rng.randrange(1, 24))]
        detok = ByteFormat().detokenizer(())
        got = [detok.step(i) for i in ids] + [detok.flush()]
        ref = codecs.getincrementaldecoder("utf-8")(errors="replace")
        want = [ref.decode(bytes([i])) if 0 <= i < 256 else "" for i in ids] + [ref.decode(b"", final=True)]
        assert got == want, ids


@pytest.fixture
def arena() -> Iterator[Arena]:
    a = Arena(f"/zccp.unit.{uuid.uuid4().hex[:8]}", SlotLayout.build(1, 64 * 1024, 8192, 8192))
    a.publish("/tmp/unused.sock")
    yield a
    a.close()


def test_a_tokens_write_and_count_still_refuse_a_slot_that_is_not_ours(arena: Arena) -> None:
    view = arena.slot(0)
    view.header.generation = 5
    cancelled = {"now": False}
    w = ResponseWriter(arena, view, 5, lambda total, final, status: None, lambda: cancelled["now"])
    w.begin(200, sse=True)
    w.write_nowait(b"data: 1\n\n", 1)
    w.count_tokens(1)
    assert view.header.response_len == 9 and view.meta.committed_mark == (9 << 32) | 1
    assert view.meta.completion_len == 1
    cancelled["now"] = True                       # client gone: the next token's write notices
    with pytest.raises(SlotAbandoned):
        w.write_nowait(b"data: 2\n\n", 2)
    cancelled["now"] = False
    view.header.generation = 6                    # nginx gave the slot to another request
    with pytest.raises(SlotAbandoned):
        w.write_nowait(b"data: 2\n\n", 2)
    w.count_tokens(2)
    assert view.header.response_len == 9 and view.meta.completion_len == 1   # nothing moved
