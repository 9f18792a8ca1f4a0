"""A hostile local writer: random and adversarial values in the slots and on the doorbell.

Runs as a process of the engine's own user (it maps the arena read-write and connects to
the doorbell socket as nginx does) against a running engine, and for each iteration:
writes random or edge values (0, 1, caps and caps +- 1, 2^31, 2^32 - 1, ...) into fields of
a slot's header, meta block, signature and request block (every field, from the ABI
header's own struct layout), sometimes a random, truncated or valid JSON body into its
payload, marks it READY or not, and rings it (a valid ring, a stale or far generation, a
slot out of range, a random or truncated frame, an unknown opcode), then keeps mutating
the slot while the engine may be reading it. It never answers the engine's notices.

The checks (tests/integration/test_fuzz.py, or bench/faults/fuzz.py): the engine process
stays alive, answers PING, counts what it refused (zccp_engine_rejects_total), and after
the fuzzer has put the slots' constant fields back (what nginx itself cannot repair) the
stack serves normal traffic.

    python -m bench.faults.fuzz --seconds 300 [--seed N]   # longer, against a stack it starts
"""

from __future__ import annotations

import mmap
import random
import select
import socket
import time
from collections import Counter
from dataclasses import dataclass, field

import posix_ipc

from zccp.transport.abi import (
    ABI_VERSION,
    META_OFFSET,
    NOTICE_SIZE,
    PAGE_SIZE,
    REQ_OFFSET,
    RING_SIZE,
    SIG_OFFSET,
    SLOT_MAGIC,
    Kind,
    Op,
    State,
    ffi,
)
from zccp.transport.doorbell import decode_notice, encode_ring, engine_ping

# (struct, offset of the struct in the slot) for every block of a slot's first page
_BLOCKS = (("struct zccp_slot_header", 0), ("struct zccp_slot_meta", META_OFFSET),
           ("struct zccp_slot_signature", SIG_OFFSET), ("struct zccp_slot_request", REQ_OFFSET))


def _fields() -> list[tuple[str, int, int, int]]:
    """(name, offset in the slot, element size, element count) of every field, from the header."""
    out = []
    for struct, base in _BLOCKS:
        for name, f in ffi.typeof(struct).fields:
            t = f.type
            if t.kind == "array":
                out.append((f"{struct.split('_', 2)[-1]}.{name}", base + f.offset, ffi.sizeof(t.item), t.length))
            else:
                out.append((f"{struct.split('_', 2)[-1]}.{name}", base + f.offset, ffi.sizeof(t), 1))
    return out


FIELDS = _fields()

_BODIES = (
    b'{"model":"zccp-tiny","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}',
    b'{"model":"zccp-tiny","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"hi"}]}',
    b'{"model":"zccp-tiny","messages":[{"role":"user","content":"hi"}]}',
    b'{"all": true}',
    b"{", b"", b"null", b"[]", b'"x"', b"\xff\xfe\x00", b'{"model":' + b"[" * 4000,
)


@dataclass
class FuzzStats:
    iterations: int = 0
    rings: int = 0
    frames: Counter = field(default_factory=Counter)       # kind of frame sent -> count
    notices: Counter = field(default_factory=Counter)      # "op/status" received -> count
    mutations: Counter = field(default_factory=Counter)    # field name -> count
    reconnects: int = 0


class Fuzzer:
    def __init__(self, shm_name: str, socket_path: str, seed: int = 0) -> None:
        shm = posix_ipc.SharedMemory(shm_name, 0)
        try:
            self._map = mmap.mmap(shm.fd, shm.size)
        finally:
            shm.close_fd()
        self._buf = ffi.from_buffer(self._map)
        c = ffi.cast("struct zccp_control *", self._buf)
        self.slot_count, self.slot_size = int(c.slot_count), int(c.slot_size)
        self.caps = {"payload_cap": int(c.payload_cap), "tokens_cap": int(c.tokens_cap),
                     "response_cap": int(c.response_cap)}
        self.payload_offset = int(c.payload_offset)
        self.socket_path = socket_path
        self.rng = random.Random(seed)
        self.stats = FuzzStats()
        self._sock: socket.socket | None = None
        self._pending = b""

    # -- the arena ----------------------------------------------------------------------

    def _base(self, i: int) -> int:
        return PAGE_SIZE + i * self.slot_size

    def header(self, i: int):
        return ffi.cast("struct zccp_slot_header *", self._buf + self._base(i))

    def _value(self, size: int) -> int:
        r = self.rng
        edges = [0, 1, 2, 3, 0x7F, 0xFF, 2 ** 15, 2 ** 16 - 1, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 63, 2 ** 64 - 1,
                 *self.caps.values(), *(v + 1 for v in self.caps.values()), *(v - 1 for v in self.caps.values()),
                 len(_BODIES[0]), self.slot_size, self.slot_count, time.time_ns(), time.time_ns() + 10 ** 9]
        v = r.choice(edges) if r.random() < 0.6 else r.getrandbits(8 * size)
        return v % (1 << (8 * size))

    def mutate(self, i: int, n: int) -> None:
        """n random fields of slot i get a random or edge value."""
        base = self._base(i)
        for _ in range(n):
            name, off, size, count = self.rng.choice(FIELDS)
            k = self.rng.randrange(count)
            at = base + off + k * size
            self._map[at : at + size] = self._value(size).to_bytes(size, "little")
            self.stats.mutations[name] += 1

    def fill(self, i: int) -> int:
        """Slot i made to look like nginx's work (valid constants, a body, READY), with some
        fields then broken; the generation the ring should carry."""
        h, r = self.header(i), self.rng
        h.magic, h.version = SLOT_MAGIC, ABI_VERSION
        for k, v in self.caps.items():
            setattr(h, k, v)
        body = r.choice(_BODIES)
        if r.random() < 0.3:
            body = body[: r.randrange(len(body) + 1)]
        start = self._base(i) + self.payload_offset
        self._map[start : start + len(body)] = body
        h.payload_len = len(body)
        h.response_len = h.response_acked = h.status = 0
        req = ffi.cast("struct zccp_slot_request *", self._buf + self._base(i) + REQ_OFFSET)
        req.kind = r.choice([Kind.GENERATE, Kind.GENERATE, Kind.COUNT_TOKENS, Kind.MODELS, Kind.WARMUP,
                             Kind.PURGE, r.getrandbits(32)])
        h.deadline_ns = time.time_ns() + r.choice([-1, 1, 10 ** 9]) * 10 ** 9
        h.generation = gen = (int(h.generation) + 1) % (1 << 64)
        if r.random() < 0.7:
            self.mutate(i, r.randrange(1, 6))
        h.state = State.READY if r.random() < 0.9 else r.getrandbits(32)
        return gen

    def restore(self) -> None:
        """Put back what the engine wrote at start and nginx never rewrites (magic, version,
        capacities) and free every slot: the state a hostile writer's exit leaves to repair."""
        for i in range(self.slot_count):
            h = self.header(i)
            h.magic, h.version = SLOT_MAGIC, ABI_VERSION
            for k, v in self.caps.items():
                setattr(h, k, v)
            h.deadline_ns = 0
            h.state = State.FREE

    def busy(self) -> int:
        return sum(1 for i in range(self.slot_count) if self.header(i).state in (State.RUNNING, State.STREAMING))

    # -- the doorbell ---------------------------------------------------------------------

    def _conn(self) -> socket.socket:
        if self._sock is None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(2)
            s.connect(self.socket_path)
            s.setblocking(False)
            self._sock = s
            self._pending = b""
            self.stats.reconnects += 1
        return self._sock

    def _hang_up(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _send(self, data: bytes, kind: str) -> None:
        self.stats.frames[kind] += 1
        try:
            self._conn().sendall(data)
        except (BlockingIOError, BrokenPipeError, ConnectionResetError):
            self._hang_up()

    def sync(self, timeout: float = 10.0) -> None:
        """PING on the fuzzing connection and read (and count) every notice up to the PONG:
        the engine has handled every frame sent before (it never acks anything). Raises
        TimeoutError when the engine does not answer in time."""
        if self._sock is None:
            return
        self._send(encode_ring(Op.PING, 0, 0), "ping")
        if self._sock is None:
            return
        end = time.monotonic() + timeout
        buf = self._pending
        while True:
            while len(buf) >= NOTICE_SIZE:
                n = decode_notice(buf[:NOTICE_SIZE])
                buf = buf[NOTICE_SIZE:]
                if int(n.op) == Op.PONG:
                    self._pending = buf
                    return
                self.stats.notices[f"{int(n.op)}/{int(n.status)}"] += 1
            try:
                chunk = self._sock.recv(65536)
            except BlockingIOError:
                if time.monotonic() > end:
                    raise TimeoutError("the engine did not answer a PING within %.0f s" % timeout) from None
                select.select([self._sock], [], [], 0.05)
                continue
            except OSError:
                chunk = b""
            if not chunk:                     # the engine closed it (an unknown opcode, ...)
                self._hang_up()
                return
            buf += chunk

    def ping(self, timeout: float = 5.0) -> bool:
        """A fresh connection's PING is answered with a PONG (the engine is serving)."""
        return engine_ping(self.socket_path, timeout) is not None

    # -- one iteration ---------------------------------------------------------------------

    def step(self) -> None:
        r, st = self.rng, self.stats
        st.iterations += 1
        i = r.randrange(self.slot_count)
        roll = r.random()
        if roll < 0.55:                       # a filled slot, rung (usually right)
            gen = self.fill(i)
            if r.random() < 0.2:
                gen = r.choice([gen - 1, gen + 1, 0, 2 ** 64 - 1, r.getrandbits(64)]) % (1 << 64)
            self._send(encode_ring(Op.RING, i, gen), "ring")
            st.rings += 1
            if r.random() < 0.5:              # and changed again while the engine reads it
                self.mutate(i, r.randrange(1, 4))
            if r.random() < 0.1:              # rung twice
                self._send(encode_ring(Op.RING, i, gen), "ring-twice")
        elif roll < 0.7:                      # fields of a slot only
            self.mutate(i, r.randrange(1, 8))
        elif roll < 0.8:                      # a ring for a slot out of range
            self._send(encode_ring(Op.RING, r.choice([self.slot_count, 2 ** 31, 2 ** 32 - 1]), 1), "ring-range")
        elif roll < 0.88:                     # random bytes, of any length
            size = r.choice([1, RING_SIZE - 1, RING_SIZE, RING_SIZE + 1, 64])
            self._send(r.randbytes(size), "random")
            if size % RING_SIZE:
                self._hang_up()               # a partial frame: the stream is misaligned now
        elif roll < 0.94:                     # an unknown opcode
            self._send(encode_ring(r.choice([0, 3, 16, 17, 18, 2 ** 32 - 1]), i, 1), "opcode")
        else:                                 # a truncated frame, then the connection closes
            self._send(encode_ring(Op.RING, i, 1)[: r.randrange(1, RING_SIZE)], "truncated")
            self._hang_up()
        if r.random() < 0.02:
            self._hang_up()                   # the engine cancels what this connection rang
        self.sync()

    def run(self, iterations: int | None = None, seconds: float | None = None) -> FuzzStats:
        end = time.monotonic() + seconds if seconds is not None else None
        n = 0
        while (iterations is None or n < iterations) and (end is None or time.monotonic() < end):
            self.step()
            n += 1
        self._hang_up()
        return self.stats

    def settle(self, timeout: float = 30.0) -> None:
        """Wait until the engine runs nothing the fuzzer rang, then restore the slots."""
        end = time.monotonic() + timeout
        while self.busy() and time.monotonic() < end:
            time.sleep(0.05)
        self.restore()

    def close(self) -> None:
        self._hang_up()
        del self._buf
        self._map.close()
