"""The response ring: wrap-around, waiting for acks, and refusing a lying ack."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from zccp.transport.abi import Flag, SlotLayout, State
from zccp.transport.arena import Arena
from zccp.transport.ring_writer import ResponseWriter, SlotAbandoned


@pytest.fixture
def arena():
    a = Arena(f"/zccp.unit.{uuid.uuid4().hex[:8]}", SlotLayout.build(1, 64 * 1024, 8192, 8192))
    a.publish("/tmp/unused.sock")
    yield a
    a.close()


def _writer(arena, notices, cancelled=lambda: False):
    view = arena.slot(0)
    view.header.generation = 5
    return view, ResponseWriter(arena, view, 5, lambda total, final, status: notices.append((total, final, status)),
                                cancelled)


def _reader(arena, view, out: bytearray, stop: threading.Event):
    """Plays nginx: consume committed bytes, advance the ack."""
    region = arena.response_region(view)
    cap = len(region)
    acked = 0
    while not stop.is_set() or acked < view.header.response_len:
        committed = view.header.response_len
        while acked < committed:
            pos = acked % cap
            n = min(committed - acked, cap - pos)
            out += bytes(region[pos : pos + n])
            acked += n
        view.header.response_acked = acked
        time.sleep(0.0005)


def test_response_larger_than_the_ring_wraps_intact(arena):
    notices: list = []
    view, w = _writer(arena, notices)
    data = bytes(range(256)) * 200  # 51,200 bytes through an 8 KiB ring
    out, stop = bytearray(), threading.Event()
    t = threading.Thread(target=_reader, args=(arena, view, out, stop))
    t.start()
    w.begin(200, sse=True)
    for i in range(0, len(data), 3000):
        w.write(data[i : i + 3000])
    w.finish()
    stop.set()
    t.join(10)
    assert bytes(out) == data
    assert view.header.state == State.DONE and view.header.status == 200
    assert view.header.flags & Flag.RESPONSE_SSE
    assert notices[-1] == (len(data), True, 200)
    assert all(n[0] <= len(data) for n in notices)


def test_an_ack_beyond_what_was_committed_is_refused(arena):
    view, w = _writer(arena, [])
    w.begin(200, sse=False)
    w.write(b"x" * 8192)             # fills the ring
    view.header.response_acked = 999_999
    with pytest.raises(SlotAbandoned):
        w.write(b"y")


def test_generation_change_stops_the_writer(arena):
    view, w = _writer(arena, [])
    w.begin(200, sse=False)
    view.header.generation = 6       # nginx gave the slot to another request
    with pytest.raises(SlotAbandoned):
        w.write(b"late")


def test_cancel_while_waiting_for_room(arena):
    flag = {"c": False}
    view, w = _writer(arena, [], cancelled=lambda: flag["c"])
    w.begin(200, sse=False)
    w.write(b"z" * 8192)
    threading.Timer(0.05, lambda: flag.update(c=True)).start()
    with pytest.raises(SlotAbandoned):
        w.write(b"more")             # no ack ever comes; the cancel ends the wait


def test_with_later_write_never_waits_and_finish_follows_the_acks(arena):
    """The engine's loop never sleeps for room (a fuzzer found it blocked forever on a
    writer that never acked): the rest goes out from timers, then the final notice."""
    notices: list = []
    timers: list = []
    view = arena.slot(0)
    view.header.generation = 5
    view.header.deadline_ns = time.time_ns() + 10**10
    w = ResponseWriter(arena, view, 5, lambda total, final, status: notices.append((total, final, status)),
                       lambda: False, later=lambda delay, fn: timers.append(fn), give_up_s=5)
    w.begin(200, sse=False)
    data = bytes(range(256)) * 100          # 25,600 bytes through an 8 KiB ring
    w.write(data)                           # returns at once: 8 KiB committed, the rest held
    w.finish()
    assert w.pending == len(data) - 8192 and not any(final for _, final, _ in notices)
    region, out = arena.response_region(view), bytearray()

    def consume() -> None:                  # play nginx: copy what is committed, ack it
        acked = view.header.response_acked
        committed = view.header.response_len
        while acked < committed:
            pos = acked % 8192
            n = min(committed - acked, 8192 - pos)
            out.extend(region[pos : pos + n])
            acked += n
        view.header.response_acked = acked

    while timers:
        consume()
        timers.pop(0)()
    consume()
    assert bytes(out) == data and notices[-1] == (len(data), True, 200)
    assert view.header.state == State.DONE


def test_with_later_a_writer_nobody_acks_gives_up(arena):
    timers: list = []
    view = arena.slot(0)
    view.header.generation = 5
    view.header.deadline_ns = 1             # nginx gave up
    w = ResponseWriter(arena, view, 5, lambda *a: None, lambda: False,
                       later=lambda delay, fn: timers.append(fn), give_up_s=5)
    w.begin(200, sse=False)
    w.write(b"q" * 20000)
    w.finish()
    timers.pop(0)()
    assert not timers and view.header.state != State.DONE


def test_the_committed_mark_counts_only_tokens_whose_bytes_are_in_the_ring(arena):
    """meta.committed_mark = (response_len << 32) | tokens: a token whose bytes wait for room
    (pending) is not counted until they are committed (nginx settles early endings from it)."""
    notices: list = []
    view, w = _writer(arena, notices)
    cap = len(arena.response_region(view))
    w.begin(200, sse=True)
    w.write_nowait(b"start")                      # no tokens yet
    assert view.meta.committed_mark == (5 << 32) | 0
    w.write_nowait(b"a" * 10, 1)
    assert view.meta.committed_mark == (15 << 32) | 1
    w.write_nowait(b"b" * cap, 2)                 # only part fits: token 2 is not committed
    mark = view.meta.committed_mark
    assert mark >> 32 == cap and mark & 0xFFFFFFFF == 1
    view.header.response_acked = cap              # nginx took it all: the rest goes in
    assert w.flush_pending()
    assert view.meta.committed_mark == ((15 + cap) << 32) | 2
