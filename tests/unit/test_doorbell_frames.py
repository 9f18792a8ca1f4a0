"""The doorbell's frame reader over a real unix socket: frames split across reads,
many frames in one read, and an unknown opcode (zccp.transport.doorbell._RingProtocol)."""

from __future__ import annotations

import asyncio
import random
import socket
import tempfile
from pathlib import Path

from zccp.transport.abi import Op
from zccp.transport.doorbell import DoorbellServer, encode_ring


async def _serve(frames: bytes, pieces: list[int]) -> tuple[list[tuple[int, int]], int, int]:
    rings: list[tuple[int, int]] = []
    pings, closes = [0], [0]
    done = asyncio.Event()

    def on_close(conn) -> None:
        closes[0] += 1
        done.set()

    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "bell.sock")
        server = DoorbellServer(path, lambda conn, ring: rings.append((ring.slot, ring.generation)),
                                on_close, lambda conn: pings.__setitem__(0, pings[0] + 1))
        await server.start()
        try:
            loop = asyncio.get_running_loop()
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            await loop.sock_connect(s, path)
            pos = 0
            for n in pieces:
                await loop.sock_sendall(s, frames[pos:pos + n])
                pos += n
                await asyncio.sleep(0.001)     # separate reads on the server side
            if frames[pos:]:
                await loop.sock_sendall(s, frames[pos:])
            await asyncio.sleep(0.05)
            s.close()
            await asyncio.wait_for(done.wait(), 5)
        finally:
            await server.stop()
    return rings, pings[0], closes[0]


def test_frames_split_anywhere_arrive_whole_and_in_order():
    rng = random.Random(7)
    want = [(rng.randrange(1000), rng.randrange(1 << 40)) for _ in range(300)]
    frames = b"".join(encode_ring(Op.RING, slot, gen) for slot, gen in want) + encode_ring(Op.PING, 0, 0)
    pieces = [rng.choice([1, 3, 15, 16, 17, 40, 1000, 2000]) for _ in range(200)]
    rings, pings, closes = asyncio.run(_serve(frames, pieces))
    assert rings == want
    assert pings == 1 and closes == 1


def test_an_unknown_opcode_stops_reading_that_connection():
    frames = encode_ring(Op.RING, 1, 1) + encode_ring(99, 0, 0) + encode_ring(Op.RING, 2, 2)
    rings, _, closes = asyncio.run(_serve(frames, [len(frames)]))
    assert rings == [(1, 1)] and closes == 1
