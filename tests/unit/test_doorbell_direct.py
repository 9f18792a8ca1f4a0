"""The model thread writes its doorbell notices itself (zccp.transport.doorbell.Connection): no loop
wake-up per token, frames in order however direct and queued writes mix, never a write
after close or to a descriptor number another connection reused, and a full socket
(EAGAIN) or a partial write falls back to the loop, still in order. Real sockets and real
loops (asyncio's and uvloop, the engine's)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from zccp.transport.doorbell import Connection, encode_notice


class _Counting:
    """Counts the connection's wake-ups of the loop (other threads' call_soon_threadsafe of
    Connection._take_inbox; an executor's completions are not counted)."""

    wakes = 0

    def call_soon_threadsafe(self, callback: Any, *args: Any, **kw: Any) -> Any:
        if getattr(callback, "__func__", None) is Connection._take_inbox:
            self.wakes += 1
        return super().call_soon_threadsafe(callback, *args, **kw)  # type: ignore[misc]


class _AsyncioLoop(_Counting, asyncio.SelectorEventLoop):
    pass


LOOPS: list[type] = [_AsyncioLoop]
try:
    import uvloop

    class _UvLoop(_Counting, uvloop.Loop):
        pass

    LOOPS.append(_UvLoop)
except ImportError:      # the engine falls back to asyncio's loop without it
    pass


@pytest.fixture(params=LOOPS, ids=lambda c: c.__name__.strip("_").lower())
def loop(request: pytest.FixtureRequest) -> Iterator[Any]:
    lp = request.param()
    yield lp
    lp.close()


class _Proto(asyncio.Protocol):
    def __init__(self) -> None:
        self.conn: Connection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.conn = Connection(transport, asyncio.get_running_loop())  # type: ignore[arg-type]

    def connection_lost(self, exc: Exception | None) -> None:
        assert self.conn is not None
        self.conn.lost()


async def _connect(engine_side: socket.socket) -> Connection:
    proto = _Proto()
    await asyncio.get_running_loop().connect_accepted_socket(lambda: proto, engine_side)
    assert proto.conn is not None
    return proto.conn


def _frames(a: int, b: int) -> list[bytes]:
    return [encode_notice(2, 3, 7, n, 0, 200) for n in range(a, b)]


def _from_thread(send: Callable[[bytes], None], frames: list[bytes]) -> None:
    th = threading.Thread(target=lambda: [send(f) for f in frames])
    th.start()
    th.join()            # the loop is held here: it takes nothing meanwhile


def _read(peer: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = peer.recv(n - len(data))
        assert chunk, "peer closed"
        data += chunk
    return data


async def _drain(loop: Any, peer: socket.socket, n: int) -> bytes:
    return await loop.run_in_executor(None, _read, peer, n)


def test_the_model_threads_notices_leave_without_a_loop_wake_up(loop: Any) -> None:
    engine_side, peer = socket.socketpair()
    frames = _frames(1, 101)                       # what the socket's buffer holds (~1 KiB each in it)

    async def main() -> bytes:
        conn = await _connect(engine_side)
        _from_thread(conn.send, frames)
        assert loop.wakes == 0                    # 100 notices, not one wake-up
        got = await _drain(loop, peer, 32 * len(frames))
        conn.close()
        return got

    assert loop.run_until_complete(main()) == b"".join(frames)
    peer.close()


def test_direct_and_queued_writes_mix_in_order(loop: Any) -> None:
    engine_side, peer = socket.socketpair()
    own, t1, t2, t3 = _frames(900, 902), _frames(1, 4), _frames(4, 7), _frames(7, 8)

    async def main() -> bytes:
        conn = await _connect(engine_side)
        conn.send(own[0])                          # the loop's own notice, this turn's write
        _from_thread(conn.send, t1)                # something waits: to the inbox, one wake-up
        assert loop.wakes == 1
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        _from_thread(conn.send, t2)                # nothing waits: written by the thread
        assert loop.wakes == 1
        conn.send(own[1])
        await asyncio.sleep(0)
        _from_thread(conn.send, t3)
        got = await _drain(loop, peer, 32 * 9)
        conn.close()
        _from_thread(conn.send, _frames(50, 51))  # after close: nothing, no wake-up
        assert loop.wakes == 1
        for _ in range(3):
            await asyncio.sleep(0)                 # the transport's close happens on the loop
        return got

    assert loop.run_until_complete(main()) == b"".join([own[0], *t1, *t2, own[1], *t3])
    peer.settimeout(5)
    assert peer.recv(64) == b""                   # closed, nothing after
    peer.close()


class _SocketTransport:
    """A transport over a real socket that closes its descriptor before the connection is
    told (asyncio's and uvloop's tell it first, but nothing promises that order)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self.sock if name == "socket" else default

    def get_write_buffer_size(self) -> int:
        return 0

    def write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        self.sock.close()


def test_a_closed_descriptors_number_reused_by_another_connection_never_gets_a_frame() -> None:
    loop = _AsyncioLoop()
    engine_side, peer = socket.socketpair()
    number = engine_side.fileno()

    async def main() -> None:
        t = _SocketTransport(engine_side)
        conn = Connection(t, asyncio.get_running_loop())  # type: ignore[arg-type]
        t.close()                                  # the transport's descriptor is gone, the connection not told yet
        other, other_peer = socket.socketpair()    # the next connection takes its number
        assert number in (other.fileno(), other_peer.fileno())
        reused, reused_peer = (other, other_peer) if other.fileno() == number else (other_peer, other)
        _from_thread(conn.send, _frames(1, 3))     # the model thread's notices, racing the close
        reused_peer.setblocking(False)
        with pytest.raises(BlockingIOError):
            reused_peer.recv(64)                   # nothing reached the reused number
        assert _read(peer, 64) == b"".join(_frames(1, 3))   # they went to the connection's own socket
        conn.lost()                                # told: its own descriptor closes, nothing after
        _from_thread(conn.send, _frames(3, 4))
        with pytest.raises(BlockingIOError):
            reused_peer.recv(64)
        peer.settimeout(5)
        assert peer.recv(64) == b""                # the last descriptor on that socket is closed
        assert loop.wakes == 0
        other.close()
        other_peer.close()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
        peer.close()


def test_a_full_socket_falls_back_to_the_loop_and_keeps_the_order(loop: Any) -> None:
    engine_side, peer = socket.socketpair()
    engine_side.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
    frames = _frames(1, 20001)                     # 640 KB, far past what the socket holds

    async def main() -> bytes:
        conn = await _connect(engine_side)
        _from_thread(conn.send, frames)            # direct until EAGAIN, then the inbox
        assert loop.wakes == 1
        got = await _drain(loop, peer, 32 * len(frames))
        _from_thread(conn.send, _frames(1, 6))     # the loop wrote the rest: direct again
        assert loop.wakes == 1
        got += await _drain(loop, peer, 32 * 5)
        conn.close()
        return got

    assert loop.run_until_complete(main()) == b"".join(frames + _frames(1, 6))
    peer.close()


class _HalfSocket:
    """Sends half of what it is given (a partial write)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, data: bytes, flags: int = 0) -> int:
        return self.sock.send(data[:len(data) // 2], flags)

    def close(self) -> None:
        self.sock.close()


def test_a_partial_write_leaves_its_tail_first(loop: Any) -> None:
    engine_side, peer = socket.socketpair()
    first, rest = _frames(1, 2), _frames(2, 5)

    async def main() -> bytes:
        conn = await _connect(engine_side)
        conn._direct = _HalfSocket(conn._direct)  # type: ignore[arg-type,assignment]
        own = _frames(900, 901)
        _from_thread(conn.send, first)             # half written, the tail kept, the loop woken
        conn.send(own[0])                          # the loop's own notice comes after the tail
        _from_thread(conn.send, rest)              # behind the tail: to the inbox
        assert loop.wakes == 1
        got = await _drain(loop, peer, 32 * 5)
        conn.close()
        return got

    # the tail first (the frame whole), then what waited: the loop's own notice, the inbox
    assert loop.run_until_complete(main()) == b"".join([*first, *_frames(900, 901), *rest])
    peer.close()


def test_a_wide_steps_notices_go_to_the_loop_in_order(loop: Any) -> None:
    engine_side, peer = socket.socketpair()
    wide, narrow = _frames(1, 9), _frames(9, 12)

    async def main() -> bytes:
        conn = await _connect(engine_side)
        Connection.direct_writes = False           # the scheduler's step of many rows
        try:
            _from_thread(conn.send, wide)
        finally:
            Connection.direct_writes = True
        assert loop.wakes == 1                     # the loop writes them
        _from_thread(conn.send, narrow)            # the inbox not taken yet: behind it
        assert loop.wakes == 1
        got = await _drain(loop, peer, 32 * 11)
        _from_thread(conn.send, _frames(12, 13))   # taken: direct again
        assert loop.wakes == 1
        got += await _drain(loop, peer, 32)
        conn.close()
        return got

    assert loop.run_until_complete(main()) == b"".join(_frames(1, 13))
    peer.close()


@pytest.mark.parametrize("path", ["flush", "inbox"])
def test_a_direct_write_never_overtakes_frames_the_loop_has_taken(
        loop: Any, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop takes its frames (its own list, or the inbox) and writes them; a model
    thread's notice sent between the take and the write must still leave after them."""
    engine_side, peer = socket.socketpair()
    first, late = _frames(1, 3), _frames(3, 4)
    write = Connection._write
    racing: list[threading.Thread] = []

    def write_after_a_racing_send(conn: Connection, data: bytes) -> None:
        if data and not racing:      # the model thread sends now, between the take and the write
            racing.append(threading.Thread(target=conn.send, args=(late[0],)))
            racing[0].start()
            racing[0].join(0.2)
        write(conn, data)

    monkeypatch.setattr(Connection, "_write", write_after_a_racing_send)

    async def main() -> bytes:
        conn = await _connect(engine_side)
        if path == "flush":
            for f in first:
                conn.send(f)                     # the loop's own: written at the turn's end
        else:
            conn._inbox.extend(first)            # the model thread's, left to the loop
            conn._take_inbox()
        await asyncio.sleep(0)
        got = await _drain(loop, peer, 32 * (len(first) + len(late)))
        racing[0].join()
        conn.close()
        return got

    assert loop.run_until_complete(main()) == b"".join(first + late)
    peer.close()
