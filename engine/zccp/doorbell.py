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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from zccp.abi import NOTICE_SIZE, RING_SIZE, Op, ffi
from zccp.paths import make_dirs

log = logging.getLogger("zccp.doorbell")


@dataclass(frozen=True)
class Ring:
    op: int
    slot: int
    generation: int


def decode_ring(frame: bytes) -> Ring:
    if len(frame) != RING_SIZE:
        raise ValueError(f"ring frame of {len(frame)} bytes, expected {RING_SIZE}")
    p = ffi.cast("struct zccp_ring *", ffi.from_buffer(frame))
    return Ring(op=int(p.op), slot=int(p.slot), generation=int(p.generation))


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
    p = ffi.new("struct zccp_notice *")
    p.op, p.slot, p.generation = op, slot, generation
    p.response_len, p.final, p.status = response_len, final, status
    return bytes(ffi.buffer(p, NOTICE_SIZE))


def encode_ring(op: int, slot: int, generation: int) -> bytes:
    """Used by tests and tools that speak to the engine as nginx does."""
    p = ffi.new("struct zccp_ring *")
    p.op, p.slot, p.generation = op, slot, generation
    return bytes(ffi.buffer(p, RING_SIZE))


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


class Connection:
    """One nginx cosocket. Notices may be sent from worker threads (thread-safe)."""

    def __init__(self, writer: asyncio.StreamWriter, loop: asyncio.AbstractEventLoop) -> None:
        self._writer = writer
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self.closed = False
        self.jobs: set[object] = set()   # jobs rung on this connection, cancelled on EOF

    def send(self, frame: bytes) -> None:
        if self.closed:
            return
        if threading.get_ident() == self._loop_thread:
            self._writer.write(frame)
        else:
            self._loop.call_soon_threadsafe(self._write_if_open, frame)

    def close(self) -> None:
        self.closed = True
        self._writer.close()

    def _write_if_open(self, frame: bytes) -> None:
        if not self.closed:
            self._writer.write(frame)


RingHandler = Callable[[Connection, Ring], None]
CloseHandler = Callable[[Connection], None]


async def start_private_unix_server(path: str, handler, group: str | None) -> asyncio.AbstractServer:
    """A unix socket only its owner (or, with a group, that group) can connect to."""
    sock_path = Path(path)
    make_dirs(sock_path.parent)
    with contextlib.suppress(FileNotFoundError):
        if sock_path.is_socket():
            sock_path.unlink()  # a stale socket from a crashed engine
    old = os.umask(0o007 if group else 0o077)
    try:
        server = await asyncio.start_unix_server(handler, path=path, backlog=1024)
    finally:
        os.umask(old)
    if group:
        os.chown(path, -1, grp.getgrnam(group).gr_gid)
    os.chmod(path, 0o660 if group else 0o600)
    return server


class DoorbellServer:
    def __init__(self, path: str, on_ring: RingHandler, on_close: CloseHandler, on_ping: Callable[[Connection], None], group: str | None = None) -> None:
        self.path = path
        self._on_ring = on_ring
        self._on_close = on_close
        self._on_ping = on_ping
        self._group = group
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[Connection] = set()

    async def start(self) -> None:
        self._server = await start_private_unix_server(self.path, self._serve, self._group)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(writer, asyncio.get_running_loop())
        self._conns.add(conn)
        try:
            while True:
                try:
                    frame = await reader.readexactly(RING_SIZE)
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                ring = decode_ring(frame)
                if ring.op == Op.RING:
                    self._on_ring(conn, ring)
                elif ring.op == Op.PING:
                    self._on_ping(conn)
                else:
                    log.warning("doorbell: unknown opcode %d, closing connection", ring.op)
                    break
        finally:
            conn.closed = True
            self._conns.discard(conn)
            self._on_close(conn)
            writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for c in list(self._conns):
                c.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

