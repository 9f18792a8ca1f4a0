"""The doorbell: a unix stream socket owned by the engine.

Only fixed-size frames travel here (struct zccp_ring in, struct zccp_notice out,
both from zccp_abi.h); data never does. Every frame is input from another
process: an unknown opcode or a short read closes that connection, nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import os
import socket
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NamedTuple, Protocol, cast

from zccp.transport.abi import NOTICE_SIZE, RING_SIZE, Op, ffi, packer
from zccp.config.own_dirs import own_dir

log = logging.getLogger("zccp.doorbell")

_RING = packer("zccp_ring")
_NOTICE = packer("zccp_notice")


class Ring(NamedTuple):
    op: int
    slot: int
    generation: int


def decode_ring(frame: bytes) -> Ring:
    if len(frame) != RING_SIZE:
        raise ValueError(f"ring frame of {len(frame)} bytes, expected {RING_SIZE}")
    return Ring._make(_RING.unpack(frame))


def decode_notice(frame: bytes):
    """A notice frame as `struct zccp_notice *` (for tools and tests that play nginx's part).
    A copy: a pointer into `frame` would outlive a temporary frame (decode_notice(buf[:32]))
    and read freed memory (the fuzzer met exactly that)."""
    if len(frame) != NOTICE_SIZE:
        raise ValueError(f"notice frame of {len(frame)} bytes, expected {NOTICE_SIZE}")
    p = ffi.new("struct zccp_notice *")
    ffi.memmove(p, frame, NOTICE_SIZE)
    return p


def encode_notice(op: int, slot: int, generation: int, response_len: int = 0, final: int = 0, status: int = 0) -> bytes:
    return _NOTICE.pack(op, slot, generation, response_len, final, status, 0)


def encode_ring(op: int, slot: int, generation: int) -> bytes:
    """Used by tests and tools that speak to the engine as nginx does."""
    return _RING.pack(op, slot, generation)


def engine_ping(socket_path: str, timeout: float = 1.0) -> int | None:
    """The epoch of the engine answering a PING on `socket_path`, else None."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(socket_path)
            s.sendall(encode_ring(Op.PING, 0, 0))
            data = b""
            while len(data) < NOTICE_SIZE:
                chunk = s.recv(NOTICE_SIZE - len(data))
                if not chunk:
                    return None
                data += chunk
    except OSError:
        return None
    n = decode_notice(data)
    return int(n.generation) if n.op == Op.PONG else None


class Cancellable(Protocol):
    """A job rung on a connection (zccp.process.engine.Job): cancelled when the connection closes."""

    def cancel(self) -> None: ...


def _own_descriptor(transport: asyncio.BaseTransport) -> socket.socket | None:
    """A descriptor of the connection's own (a dup of the transport's): the model thread
    writes to it, so a number the transport closes and the next connection reuses can never
    take that thread's frame. None where the transport has no socket (tests)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None
    try:
        return socket.socket(fileno=os.dup(sock.fileno()))
    except (OSError, ValueError):
        return None


_DONTWAIT = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL


class Connection:
    """One nginx cosocket. Notices may be sent from worker threads (thread-safe).

    Notices sent during one turn of the loop leave in one write (one send(2) for the
    answers to every ring that one read brought, not one each): they wait in a list the
    loop flushes once the callbacks ready now have run. A notice from another thread (the
    model thread's, one per streamed token) is written by that thread itself when nothing
    of this connection waits anywhere (the loop's list, the inbox, the transport's buffer):
    a non-blocking send(2) on the connection's own descriptor under the connection's lock,
    no loop wake-up. The lock is held around every write and around close, and close marks
    the connection closed under it: that thread never writes after close, never out of
    order, never to another connection. Otherwise (something waits, EAGAIN, an error) the
    notice waits in the inbox: only the first after the loop took the inbox wakes the loop
    (one callback for all that came meanwhile), which writes them at once unless notices of
    its own wait for this turn's write (then behind those); each notice leaves, in order."""

    # Whether other threads write their notices themselves: the model thread's scheduler turns
    # it off for a step with many rows (their send(2)s would lengthen the step; the loop writes
    # them beside it) and on for one or two (a loop wake-up per token otherwise).
    direct_writes = True

    __slots__ = ("_transport", "_loop", "_loop_thread", "_pending", "_inbox", "_woken", "closed", "jobs",
                 "_lock", "_direct", "_carry")

    def __init__(self, transport: asyncio.WriteTransport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._pending: list[bytes] = []
        self._inbox: deque[bytes] = deque()   # other threads' notices, for the loop
        self._woken = False                   # a _take_inbox is due on the loop
        self.closed = False
        self.jobs: set[Cancellable] = set()   # jobs rung on this connection, cancelled on EOF
        # around every write and close; re-entrant should a transport call connection_lost
        # from within its write (asyncio's and uvloop's defer it)
        self._lock = threading.RLock()
        self._direct = _own_descriptor(transport)
        self._carry = b""                     # a direct write's unsent tail: leaves before anything

    def send(self, frame: bytes) -> None:
        if self.closed:
            return
        if threading.get_ident() == self._loop_thread:
            self._queue(frame)
            return
        if Connection.direct_writes and self._direct is not None and not self._inbox and self._send_direct(frame):
            return
        # appended before _woken is read: a _take_inbox that cleared _woken already takes
        # this frame (it clears the flag before it empties the inbox)
        self._inbox.append(frame)
        self._wake()

    def _wake(self) -> None:
        if not self._woken:
            self._woken = True
            self._loop.call_soon_threadsafe(self._take_inbox)

    def _send_direct(self, frame: bytes) -> bool:
        """The frame written from this (non-loop) thread; False: nothing of it was, the
        caller queues it. A partial write keeps the tail for the loop's next write."""
        with self._lock:
            sock = self._direct
            if (sock is None or self.closed or self._pending or self._inbox or self._carry
                    or self._transport.get_write_buffer_size()):
                return False
            try:
                n = sock.send(frame, _DONTWAIT)
            except OSError:          # EAGAIN, EPIPE...: the loop's transport writes it or finds out
                return False
            if n == len(frame):
                return True
            self._carry = frame[n:]
        self._wake()
        return True

    def close(self) -> None:
        self._flush()
        if self._carry:                    # a partial direct write's tail: the frame whole
            self._write(b"")
        with self._lock:
            self.closed = True
            self._drop_direct()
        self._transport.close()

    def lost(self) -> None:
        """The transport is gone (the loop's connection_lost)."""
        with self._lock:
            self.closed = True
            self._drop_direct()

    def _drop_direct(self) -> None:
        if self._direct is not None:
            self._direct.close()
            self._direct = None

    def _write(self, data: bytes) -> None:
        with self._lock:
            if self.closed:
                return
            if self._carry:
                data, self._carry = self._carry + data, b""
            self._transport.write(data)

    def _queue(self, frame: bytes) -> None:
        pending = self._pending
        pending.append(frame)
        if len(pending) == 1:
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        pending = self._pending
        if not pending or self.closed:
            pending.clear()
            return
        # taken and written under the lock: a direct write that found the list empty between
        # the two would overtake these frames
        with self._lock:
            data = pending[0] if len(pending) == 1 else b"".join(pending)
            pending.clear()
            self._write(data)

    def _take_inbox(self) -> None:
        self._woken = False
        inbox = self._inbox
        if self.closed:
            inbox.clear()
            return
        if not inbox:                      # an earlier call took what woke this one
            if self._carry:
                self._write(b"")
            return
        if self._pending:                  # the loop's own notices of this turn go first
            while inbox:
                self._queue(inbox.popleft())
            return
        # nothing of this turn waits: written now, not from one more callback
        with self._lock:                   # taken and written as one (see _flush)
            frames = [inbox.popleft() for _ in range(len(inbox))]
            self._write(frames[0] if len(frames) == 1 else b"".join(frames))


def inherited_unix_stream(fd: int) -> socket.socket:
    """An inherited descriptor as a non-blocking unix stream socket; ValueError (the descriptor
    left open, not ours to close) when it is anything else."""
    sock = socket.socket(fileno=fd)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        sock.detach()
        raise ValueError(f"fd {fd} is not a unix stream socket")
    sock.setblocking(False)
    return sock


RingHandler = Callable[[Connection, Ring], None]
CloseHandler = Callable[[Connection], None]


async def start_private_unix_server(
        path: str, group: str | None,
        create: Callable[[str], Awaitable[asyncio.AbstractServer]]) -> asyncio.AbstractServer:
    """A unix socket only its owner (or, with a group, that group) can connect to;
    create(path) makes the server (asyncio's stream or protocol flavour)."""
    sock_path = Path(path)
    own_dir(sock_path.parent, f"the directory of the socket {path}", group=group)   # ours, or refused
    with contextlib.suppress(FileNotFoundError):
        if sock_path.is_socket():
            sock_path.unlink()  # a stale socket from a crashed engine
    old = os.umask(0o007 if group else 0o077)
    try:
        server = await create(path)
    finally:
        os.umask(old)
    if group:
        os.chown(path, -1, grp.getgrnam(group).gr_gid)
    os.chmod(path, 0o660 if group else 0o600)
    return server


class _RingProtocol(asyncio.BufferedProtocol):
    """One nginx connection: whole frames are handled as they arrive, a partial one waits
    for the rest (a protocol, not a stream reader: no coroutine resumption per frame).
    Buffered: the loop recv_into()s this connection's own small buffer, where a plain
    Protocol has asyncio allocate (and fault in) a 256 KiB bytes object per read."""

    FRAMES = 64   # frames one read can take

    def __init__(self, server: DoorbellServer) -> None:
        self._server = server
        self._buf = bytearray(RING_SIZE * self.FRAMES)
        self._view = memoryview(self._buf)
        self._filled = 0                 # bytes of a partial frame at the buffer's start
        self.conn: Connection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio's or uvloop's (whose transports do not subclass asyncio.WriteTransport)
        self.conn = Connection(cast(asyncio.WriteTransport, transport), asyncio.get_running_loop())
        self._server._conns.add(self.conn)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view[self._filled:]

    def buffer_updated(self, nbytes: int) -> None:
        conn, server, buf = self.conn, self._server, self._buf
        assert conn is not None
        n = self._filled + nbytes
        end = n - n % RING_SIZE
        for off in range(0, end, RING_SIZE):
            ring = Ring._make(_RING.unpack_from(buf, off))
            if ring.op == Op.RING:
                server._on_ring(conn, ring)
            elif ring.op == Op.PING:
                server._on_ping(conn)
            else:
                log.warning("doorbell: unknown opcode %d, closing connection", ring.op)
                conn.close()
                return
        self._filled = n - end
        if self._filled:
            buf[:self._filled] = buf[end:n]

    def connection_lost(self, exc: Exception | None) -> None:
        conn = self.conn
        if conn is None:
            return
        conn.lost()
        self._server._conns.discard(conn)
        self._server._on_close(conn)


class DoorbellServer:
    def __init__(self, path: str, on_ring: RingHandler, on_close: CloseHandler,
                 on_ping: Callable[[Connection], None], group: str | None = None) -> None:
        self.path = path
        self._on_ring = on_ring
        self._on_close = on_close
        self._on_ping = on_ping
        self._group = group
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[Connection] = set()
        self._listening: socket.socket | None = None
        self._adopted = False
        self._own: list[tuple[asyncio.AbstractServer, str]] = []

    async def start(self, accept: bool = True) -> None:
        """Bind and listen on the socket path; listening_fd is then the socket the engine's
        prep processes accept on too (zccp.process.group). accept=False: connections wait in
        the backlog (or go to the prep processes) until accept_now()."""
        loop = asyncio.get_running_loop()

        def create(path: str) -> Awaitable[asyncio.AbstractServer]:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(path)
            sock.listen(1024)
            sock.setblocking(False)
            self._listening = sock
            return loop.create_unix_server(lambda: _RingProtocol(self), sock=sock, start_serving=accept)

        self._server = await start_private_unix_server(self.path, self._group, create)

    async def accept_now(self) -> None:
        assert self._server is not None
        await self._server.start_serving()

    async def adopt(self, fd: int) -> None:
        """Accept on a listening socket another process bound (a prep process's doorbell:
        the kernel hands each new nginx connection to one of the processes accepting)."""
        sock = inherited_unix_stream(fd)
        self._adopted = True
        self._server = await asyncio.get_running_loop().create_unix_server(lambda: _RingProtocol(self), sock=sock)

    async def listen_also(self, path: str) -> None:
        """A socket of this process's own beside the shared one (a prep process's: nginx rings
        each process's in turn, zccp.process.group); removed at stop()."""
        loop = asyncio.get_running_loop()

        def create(p: str) -> Awaitable[asyncio.AbstractServer]:
            return loop.create_unix_server(lambda: _RingProtocol(self), path=p, backlog=1024)

        self._own.append((await start_private_unix_server(path, self._group, create), path))

    @property
    def listening_fd(self) -> int:
        if self._listening is None:
            raise RuntimeError("the doorbell is not listening")
        return self._listening.fileno()

    async def stop(self) -> None:
        for server, path in self._own:
            server.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if self._server is not None:
            self._server.close()
            for c in list(self._conns):
                c.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
        if not self._adopted:     # the path is the binding process's to remove
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
