"""A prep process's misses, handed to the process that owns the model (rank 0).

With a model backend (tiny, hf) a prep process parses, tokenizes into the slot, looks the
cache up and replays hits itself; a miss is handed to rank 0 over a private channel: a
socketpair rank 0 makes for each prep process (zccp.process.group), the prep's end passed as
an inherited descriptor, so nothing else can reach it (no path, unlike the doorbells).

  prep -> rank 0   H  a Handoff (what rank 0 needs to run the slot's prepared prompt)
                   C  slot, generation: nginx left (the prep's connection closed)
  rank 0 -> prep   N  a notice frame (struct zccp_notice) for the nginx connection that rang
                   D  slot, generation, and how it Ended: the Completed answer or None, its
                      masked literals, or failed (nothing was answered: the prep process
                      answers the engine's 500)

The prompt's tokens are already in the slot (shared memory): only the parsed request's
small fields travel. Rank 0 writes the answer into the slot's response ring itself; its
notices go back through the prep process, which owns nginx's connection (two processes
writing one stream socket could interleave frames). The prep stores a complete answer in the
cache when D comes. Pickle, because both ends are the same program started by one parent, on
a channel no other process holds; a frame is bounded and a bad one closes the channel."""

from __future__ import annotations

import asyncio
import logging
import pickle
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from zccp.shared_types import Completed, GenerationRequest, Pin
from zccp.transport.abi import NOTICE_SIZE, packer
from zccp.transport.doorbell import Connection, inherited_unix_stream

log = logging.getLogger("zccp.handoff")

_HEAD = struct.Struct("<cI")        # kind, body length
_SLOT = struct.Struct("<II")        # slot, generation (C)
_NOTICE = packer("zccp_notice")
MAX_BODY = 1 << 28                  # a D frame holds a whole answer's text: bounded by the ring's
N_PREFIX = _HEAD.pack(b"N", NOTICE_SIZE)


@dataclass(frozen=True)
class Verdict:
    """What rank 0 needs to set the cache's meta before the final notice (zccp.prep.flow's
    _cache_verdict): the request's masked values, nginx's L1 TTL (0: not kept) and scope."""
    request_literals: tuple[bytes, ...]
    ttl_s: int
    scope: int


@dataclass(frozen=True)
class Handoff:
    """A prepared miss: the prompt's tokens are the slot's first prompt_len."""
    slot: int
    generation: int
    req: GenerationRequest | None         # messages and system dropped (they are in the tokens); None: whole
    prompt_len: int = 0
    salt: bytes = b""                     # the prefix cache's (the tenant's)
    pins: tuple[Pin, ...] = ()
    verdict: Verdict | None = None        # None: the answer is not stored
    started: float = 0.0                  # when the prep process took the ring (perf_counter: CLOCK_MONOTONIC)
    whole: bool = False                   # rank 0 serves the slot from its payload (n > 1, a schema, a warm-up)


@dataclass(frozen=True)
class Ended:
    """How a handed request ended, for the prep process: the answer to store (None: nothing
    to store), the masked values it carries, or failed (nothing was answered)."""
    completed: Completed | None = None
    literals: tuple[str, ...] = ()
    failed: bool = False


NOT_STORED = Ended()
FAILED = Ended(failed=True)
OnEnded = Callable[[Ended], None]


@dataclass(frozen=True)
class ModelFacts:
    """Rank 0's model as a prep process must see it: the limits prepare() checks against
    (max_context after model.kv_cache_mb shrank it) without the weights."""
    name: str
    max_context: int
    vocab_size: int
    has_logits: bool
    prefix_pins: bool                     # rank 0 keeps a prefix cache: cache_control breakpoints pin
    device_id: int = -1                   # the GPU the model runs on (the slot's meta.gpu_device_id)


def frame(kind: bytes, body: bytes) -> bytes:
    if len(body) > MAX_BODY:
        raise ValueError(f"handoff frame of {len(body)} bytes")
    return _HEAD.pack(kind, len(body)) + body


def done_frame(slot: int, generation: int, ended: Ended = NOT_STORED) -> bytes:
    return frame(b"D", pickle.dumps((slot, generation, ended), protocol=pickle.HIGHEST_PROTOCOL))


class _Frames(asyncio.Protocol):
    """Whole frames out of the stream; anything malformed closes the channel."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        at = 0
        while len(buf) - at >= _HEAD.size:
            kind, size = _HEAD.unpack_from(buf, at)
            if size > MAX_BODY:
                return self._bad(f"frame of {size} bytes")
            if len(buf) - at - _HEAD.size < size:
                break
            body = bytes(buf[at + _HEAD.size:at + _HEAD.size + size])
            at += _HEAD.size + size
            try:
                self.on_frame(kind, body)
            except Exception as exc:   # a frame that does not decode: the channel is not ours to trust
                return self._bad(f"{kind!r} frame: {exc}")
        del buf[:at]

    def _bad(self, why: str) -> None:
        log.error("handoff channel: %s; closing it", why)
        self._buf.clear()
        if self.transport is not None:
            self.transport.close()

    def on_frame(self, kind: bytes, body: bytes) -> None:
        raise NotImplementedError


class OwnerChannel(_Frames):
    """Rank 0's end of one prep process's channel: handoffs in, notices and endings out
    (through a doorbell Connection: the model thread writes its notices itself)."""

    def __init__(self, on_handoff: Callable[[Connection, Handoff], None],
                 on_cancel: Callable[[int, int], None]) -> None:
        super().__init__()
        self._on_handoff = on_handoff
        self._on_cancel = on_cancel
        self.conn: Connection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.conn = Connection(cast(asyncio.WriteTransport, transport), asyncio.get_running_loop())

    def on_frame(self, kind: bytes, body: bytes) -> None:
        assert self.conn is not None
        if kind == b"H":
            h = pickle.loads(body)
            if not isinstance(h, Handoff):
                raise ValueError(f"not a Handoff: {type(h).__name__}")
            try:
                self._on_handoff(self.conn, h)
            except Exception:       # this request's failure, not the channel's: the prep process answers the 500
                log.exception("handoff of slot %d failed", h.slot)
                self.conn.send(done_frame(h.slot, h.generation, FAILED))
        elif kind == b"C":
            self._on_cancel(*_SLOT.unpack(body))
        else:
            raise ValueError("unknown kind")

    def connection_lost(self, exc: Exception | None) -> None:
        conn = self.conn
        if conn is None:
            return
        conn.lost()
        for job in list(conn.jobs):     # the prep process is gone: nobody reads these answers
            job.cancel()


class _Pending:
    __slots__ = ("conn", "ended")

    def __init__(self, conn: Connection, ended: OnEnded) -> None:
        self.conn = conn
        self.ended = ended


class PrepChannel(_Frames):
    """A prep process's end: hands misses to rank 0 and relays its notices to nginx."""

    def __init__(self) -> None:
        super().__init__()
        self._pending: dict[tuple[int, int], _Pending] = {}

    def hand(self, h: Handoff, conn: Connection, ended: OnEnded) -> None:
        """Send a miss to rank 0; ended(Ended) runs on the loop when it is over (FAILED at once
        when the channel is closed: rank 0 never saw it)."""
        if self.transport is None or self.transport.is_closing():
            ended(FAILED)
            return
        self._pending[(h.slot, h.generation)] = _Pending(conn, ended)
        self.transport.write(frame(b"H", pickle.dumps(h, protocol=pickle.HIGHEST_PROTOCOL)))

    def cancel(self, slot: int, generation: int) -> None:
        if (slot, generation) in self._pending and self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame(b"C", _SLOT.pack(slot, generation)))

    def on_frame(self, kind: bytes, body: bytes) -> None:
        if kind == b"N":
            if len(body) != NOTICE_SIZE:
                raise ValueError(f"notice of {len(body)} bytes")
            _op, slot, generation = _NOTICE.unpack(body)[:3]
            p = self._pending.get((slot, generation))
            if p is not None:
                p.conn.send(body)
        elif kind == b"D":
            slot, generation, ended = _done(pickle.loads(body))
            p = self._pending.pop((slot, generation), None)
            if p is not None:
                _end(p, ended)
        else:
            raise ValueError("unknown kind")

    def connection_lost(self, exc: Exception | None) -> None:
        pending, self._pending = self._pending, {}
        for p in pending.values():   # rank 0 is gone mid-answer (and this process with it): what it
            _end(p, NOT_STORED)        # wrote is unknown here, so nothing is written over it


def _end(p: _Pending, ended: Ended) -> None:
    """One request's ending: its failure is its own, never the channel's."""
    try:
        p.ended(ended)
    except Exception:
        log.exception("a handed request's ending failed")


def _done(value: Any) -> tuple[int, int, Ended]:
    slot, generation, ended = value
    if not isinstance(slot, int) or not isinstance(generation, int) or not isinstance(ended, Ended) \
            or not (ended.completed is None or isinstance(ended.completed, Completed)) \
            or not isinstance(ended.literals, tuple):
        raise ValueError("malformed D frame")
    return slot, generation, ended


async def open_prep_channel(fd: int, channel: PrepChannel) -> None:
    """The prep process's end of its channel (an inherited descriptor), read by `channel`."""
    await asyncio.get_running_loop().create_unix_connection(lambda: channel, sock=inherited_unix_stream(fd))


async def open_owner_channel(sock: socket.socket, channel: OwnerChannel) -> None:
    """Rank 0's end of a prep process's channel (zccp.process.group made the pair)."""
    sock.setblocking(False)
    await asyncio.get_running_loop().create_unix_connection(lambda: channel, sock=sock)


__all__ = ["FAILED", "NOT_STORED", "Ended", "Handoff", "ModelFacts", "OnEnded", "OwnerChannel", "PrepChannel",
           "Verdict", "done_frame", "frame", "open_owner_channel", "open_prep_channel"]
