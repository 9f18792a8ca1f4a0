"""The handoff channel between a prep process and the model's process (zccp.process.handoff),
over a real socketpair: handoffs and cancels one way, notices and endings the other; a
notice reaches only the nginx connection of a pending handoff; a malformed frame closes
the channel, and a closed channel ends every pending handoff (prep side) or cancels every
handed job (model side)."""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct

import pytest

from zccp.process.handoff import (FAILED, MAX_BODY, N_PREFIX, NOT_STORED, Ended, Handoff, OwnerChannel, PrepChannel,
                                  Verdict, done_frame, frame, open_owner_channel, open_prep_channel)
from zccp.shared_types import Completed, GenerationRequest, GenerationResult, SamplingParams
from zccp.transport.abi import Op
from zccp.transport.doorbell import encode_notice


class Nginx:
    """Stands for the nginx connection a prep process relays notices to."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def send(self, data: bytes) -> None:
        self.frames.append(data)


class Job:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def _req() -> GenerationRequest:
    return GenerationRequest(api="openai", model="m", system="", messages=(), sampling=SamplingParams(max_tokens=5))


async def _pair(handoffs: list, cancels: list) -> tuple[PrepChannel, OwnerChannel]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    owner = OwnerChannel(lambda conn, h: handoffs.append((conn, h)), lambda s, g: cancels.append((s, g)))
    prep = PrepChannel()
    await open_owner_channel(a, owner)
    await open_prep_channel(b.detach(), prep)
    return prep, owner


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0.005)


def test_a_handoff_goes_over_and_its_notices_and_ending_come_back() -> None:
    async def run() -> None:
        handoffs: list = []
        cancels: list = []
        prep, owner = await _pair(handoffs, cancels)
        nginx, other = Nginx(), Nginx()
        ended: list = []
        h = Handoff(3, 7, _req(), prompt_len=12, salt=b"t" * 32, verdict=Verdict((b"secret",), 60, 1))
        prep.hand(h, nginx, ended.append)                              # type: ignore[arg-type]
        prep.hand(Handoff(4, 1, _req()), other, lambda e: None)        # type: ignore[arg-type]
        await _settle()
        assert [x[1] for x in handoffs] == [h, Handoff(4, 1, _req())]
        conn = handoffs[0][0]
        notice = encode_notice(Op.NOTICE, 3, 7, 100, 0, 200)
        conn.send(N_PREFIX + notice)
        conn.send(N_PREFIX + encode_notice(Op.NOTICE, 3, 6, 1, 0, 200))   # an older generation's: nobody's
        conn.send(N_PREFIX + encode_notice(Op.NOTICE, 9, 1, 1, 0, 200))   # no such handoff
        done = Completed(GenerationResult(text="hi", stop_reason="end_turn", stop_sequence=None, input_tokens=12,
                                          output_tokens=1), (2,))
        conn.send(done_frame(3, 7, Ended(done, ("secret",))))
        conn.send(N_PREFIX + encode_notice(Op.NOTICE, 3, 7, 101, 1, 200))  # after its ending: dropped
        await _settle()
        assert nginx.frames == [notice] and other.frames == []
        assert ended == [Ended(done, ("secret",))]
        prep.cancel(4, 1)          # pending: rank 0 is told
        prep.cancel(3, 7)          # ended already: nothing to tell
        await _settle()
        assert cancels == [(4, 1)]

    asyncio.run(run())


@pytest.mark.parametrize("bad", [
    struct.pack("<cI", b"X", 0),                          # an unknown kind
    struct.pack("<cI", b"H", MAX_BODY + 1),               # a frame past the bound
    frame(b"H", pickle.dumps(42)),                         # not a Handoff
    frame(b"C", b"\x00\x01"),                              # a short cancel
], ids=["kind", "size", "not-a-handoff", "short-cancel"])
def test_a_malformed_frame_closes_the_model_side_and_cancels_its_jobs(bad: bytes) -> None:
    async def run() -> None:
        handoffs: list = []
        prep, owner = await _pair(handoffs, [])
        job = Job()
        assert owner.conn is not None
        owner.conn.jobs.add(job)
        assert prep.transport is not None
        prep.transport.write(bad)
        await _settle()
        assert job.cancelled and owner.conn.closed and handoffs == []

    asyncio.run(run())


@pytest.mark.parametrize("bad", [
    frame(b"N", b"short"),
    frame(b"D", pickle.dumps(("3", 7, NOT_STORED))),
    frame(b"D", pickle.dumps((3, 7, Ended("not completed")))),    # type: ignore[arg-type]
    frame(b"D", pickle.dumps((3, 7, None))),
    frame(b"Q", b""),
], ids=["short-notice", "slot-type", "completed-type", "not-ended", "kind"])
def test_a_malformed_frame_closes_the_prep_side_and_ends_what_it_handed(bad: bytes) -> None:
    async def run() -> None:
        handoffs: list = []
        prep, owner = await _pair(handoffs, [])
        ended: list = []
        prep.hand(Handoff(1, 1, _req()), Nginx(), ended.append)   # type: ignore[arg-type]
        await _settle()
        handoffs[0][0].send(bad)
        await _settle()
        assert ended == [NOT_STORED]                # what rank 0 wrote is unknown: nothing over it
        prep.hand(Handoff(2, 1, _req()), Nginx(), ended.append)   # type: ignore[arg-type]
        assert ended == [NOT_STORED, FAILED]        # a closed channel: rank 0 never saw it, the 500 here

    asyncio.run(run())


def test_a_handoff_the_model_side_fails_on_ends_failed_and_the_channel_stays() -> None:
    async def run() -> None:
        def broken(conn, h: Handoff) -> None:
            if h.slot == 1:
                raise RuntimeError("a bug for this request only")
            conn.send(done_frame(h.slot, h.generation))

        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        prep = PrepChannel()
        await open_owner_channel(a, OwnerChannel(broken, lambda s, g: None))
        await open_prep_channel(b.detach(), prep)
        ended: list = []
        prep.hand(Handoff(1, 1, _req()), Nginx(), ended.append)   # type: ignore[arg-type]
        prep.hand(Handoff(2, 1, _req()), Nginx(), ended.append)   # type: ignore[arg-type]
        await _settle()
        assert ended == [FAILED, NOT_STORED]

    asyncio.run(run())


def test_the_prep_process_gone_cancels_its_handed_jobs() -> None:
    async def run() -> None:
        prep, owner = await _pair([], [])
        job = Job()
        assert owner.conn is not None and prep.transport is not None
        owner.conn.jobs.add(job)
        prep.transport.close()
        await _settle()
        assert job.cancelled

    asyncio.run(run())


def test_a_frame_past_the_bound_is_never_written() -> None:
    with pytest.raises(ValueError):
        frame(b"D", bytes(MAX_BODY + 1))
