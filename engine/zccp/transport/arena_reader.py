"""A read-only look at a running engine's arena: the slot table, for operators and tests."""

from __future__ import annotations

import mmap
from dataclasses import dataclass

import posix_ipc

from zccp.transport.abi import CONTROL_MAGIC, META_OFFSET, PAGE_SIZE, CData, ffi


@dataclass(frozen=True)
class SlotSnapshot:
    index: int
    state: int
    generation: int
    context_id: str
    payload_len: int
    status: int
    flags: int
    owner_pid: int
    response_len: int
    response_acked: int
    sha256: bytes
    magic: int
    version: int


class ArenaReader:
    def __init__(self, name: str) -> None:
        shm = posix_ipc.SharedMemory(name, 0)
        try:
            self._map = mmap.mmap(shm.fd, shm.size, prot=mmap.PROT_READ)
        finally:
            shm.close_fd()
        self._buf = ffi.from_buffer(self._map)
        control: CData = ffi.cast("struct zccp_control *", self._buf)
        self.control = control
        if self.control.magic != CONTROL_MAGIC:
            raise ValueError(f"{name}: control page not published")
        self.slot_count = int(self.control.slot_count)
        self.slot_size = int(self.control.slot_size)
        if PAGE_SIZE + self.slot_count * self.slot_size != len(self._map):
            raise ValueError(f"{name}: size does not match the control page")

    @property
    def epoch(self) -> int:
        return int(self.control.epoch)

    @property
    def purge_epoch(self) -> int:
        return int(self.control.purge_epoch)

    def _base(self, i: int) -> int:
        if not 0 <= i < self.slot_count:
            raise IndexError(i)
        return PAGE_SIZE + i * self.slot_size

    def slot(self, i: int) -> SlotSnapshot:
        h: CData = ffi.cast("struct zccp_slot_header *", self._buf + self._base(i))
        return SlotSnapshot(
            index=i, state=int(h.state), generation=int(h.generation),
            context_id=bytes(ffi.buffer(h.context_id, 8)).hex(), payload_len=int(h.payload_len),
            status=int(h.status), flags=int(h.flags), owner_pid=int(h.owner_pid),
            response_len=int(h.response_len), response_acked=int(h.response_acked),
            sha256=bytes(ffi.buffer(h.sha256, 32)), magic=int(h.magic), version=int(h.version),
        )

    def slots(self) -> list[SlotSnapshot]:
        return [self.slot(i) for i in range(self.slot_count)]

    def meta(self, i: int) -> CData:
        return ffi.cast("struct zccp_slot_meta *", self._buf + self._base(i) + META_OFFSET)

    def payload(self, i: int) -> bytes:
        s = self.slot(i)
        start = self._base(i) + int(self.control.payload_offset)
        n = min(s.payload_len, int(self.control.payload_cap))
        return bytes(self._map[start : start + n])

    def close(self) -> None:
        del self.control, self._buf
        self._map.close()
