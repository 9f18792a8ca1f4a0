"""The shared-memory arena: one POSIX shm object per engine instance.

Page 0 is the control page; then `slot_count` slots of `slot_size` bytes, each
with its header + meta page and its payload, token and response regions. The
engine creates the arena, nginx maps it; everything read back from it is
validated against the layout before use (shared memory is input, not trust).
"""

from __future__ import annotations

import errno
import grp
import mmap
import os
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import posix_ipc

from zccp.transport.abi import (
    CData,
    ABI_VERSION,
    CONTROL_MAGIC,
    META_OFFSET,
    REQ_OFFSET,
    SIG_OFFSET,
    SLOT_MAGIC,
    EngineState,
    SlotLayout,
    State,
    ffi,
)
from zccp.transport.doorbell import engine_ping

if TYPE_CHECKING:
    import torch


class SlotError(Exception):
    """A slot header that fails validation; the ring is rejected, nothing is read."""


class ArenaError(RuntimeError):
    """The arena cannot be made: the message says why and which setting to change."""


def _refuse_if_served(name: str) -> None:
    """An arena whose engine still answers on the doorbell it published is not stale:
    replacing it would cut that engine off from its nginx."""
    try:
        shm = posix_ipc.SharedMemory(name, 0)
    except posix_ipc.ExistentialError:
        return
    try:
        if shm.size < ffi.sizeof("struct zccp_control"):
            return
        page = mmap.mmap(shm.fd, ffi.sizeof("struct zccp_control"), prot=mmap.PROT_READ)
    finally:
        shm.close_fd()
    c: CData = ffi.cast("struct zccp_control *", ffi.from_buffer(page))
    magic, epoch, pid = int(c.magic), int(c.epoch), int(c.engine_pid)
    sock = bytes(ffi.buffer(c.socket_path)).split(b"\0", 1)[0].decode("utf-8", "replace")
    del c
    page.close()
    if magic == CONTROL_MAGIC and sock and engine_ping(sock) == epoch:
        raise ArenaError(f"shared_memory.name {name}: an engine (pid {pid}) is serving on it, doorbell {sock}; "
                         f"stop it, or give this one another shared_memory.name")


def _reserve(fd: int, layout: SlotLayout, name: str) -> None:
    """Allocate every page now, so that a /dev/shm too small for the arena is an error with
    the sizes in it at start-up rather than a SIGBUS on the first request that touches it."""
    try:
        os.posix_fallocate(fd, 0, layout.arena_size)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise
        st = os.statvfs("/dev/shm")
        mib = 1024 * 1024
        raise ArenaError(
            f"shared memory: arena {name} needs {layout.arena_size / mib:.1f} MiB (shared_memory.segment_count "
            f"{layout.slot_count} x segment_size_kb {layout.slot_size // 1024} + a 4 KiB control page), but /dev/shm "
            f"has {st.f_bavail * st.f_frsize / mib:.1f} MiB free of {st.f_blocks * st.f_frsize / mib:.1f} MiB "
            f"({exc.strerror}): lower shared_memory.segment_count or segment_size_kb, or give /dev/shm more "
            f"room (Docker: --shm-size, Compose: shm_size)") from None


@dataclass(frozen=True)
class SlotView:
    """Typed pointers into one slot. Cheap to create; holds no copies."""

    index: int
    header: CData       # struct zccp_slot_header *
    meta: CData         # struct zccp_slot_meta *
    signature: CData    # struct zccp_slot_signature *
    request: CData      # struct zccp_slot_request *
    base: int           # offset of the slot in the arena


class Arena:
    def __init__(self, name: str, layout: SlotLayout, group: str | None = None) -> None:
        self.name = name
        self.layout = layout
        self.epoch = secrets.randbits(63) | 1
        mode = 0o660 if group else 0o600
        # A stale arena from a crashed engine is replaced, never reused.
        _refuse_if_served(name)
        try:
            posix_ipc.unlink_shared_memory(name)
        except posix_ipc.ExistentialError:
            pass
        old_umask = os.umask(0o077 if not group else 0o007)
        try:
            self._shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=mode, size=layout.arena_size)
        finally:
            os.umask(old_umask)
        try:
            _reserve(self._shm.fd, layout, name)
        except BaseException:
            self._shm.close_fd()
            self._shm.unlink()
            raise
        if group:
            os.fchown(self._shm.fd, -1, grp.getgrnam(group).gr_gid)
            os.fchmod(self._shm.fd, mode)
        # MAP_POPULATE: fault every page in now, not on a request's first touch.
        self._mmap = mmap.mmap(self._shm.fd, layout.arena_size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        self._shm.close_fd()
        self._owner = True
        self._views()

    @classmethod
    def attach(cls, name: str, layout: SlotLayout, epoch: int) -> Arena:
        """The arena another process of this engine made and published (a prep process's
        view): the same layout and epoch, or refused. Closing it leaves the arena alone."""
        self = cls.__new__(cls)
        self.name = name
        self.layout = layout
        shm = posix_ipc.SharedMemory(name, 0)
        try:
            if shm.size != layout.arena_size:
                raise ArenaError(f"arena {name}: {shm.size} bytes, expected {layout.arena_size}")
            self._mmap = mmap.mmap(shm.fd, layout.arena_size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        finally:
            shm.close_fd()
        self._owner = False
        self._views()
        c = self.control
        if c.magic != CONTROL_MAGIC or int(c.epoch) != epoch or int(c.slot_count) != layout.slot_count:
            self.close()
            raise ArenaError(f"arena {name}: not the published arena of epoch {epoch}")
        self.epoch = epoch
        return self

    def _views(self) -> None:
        layout = self.layout
        self._buf = ffi.from_buffer(self._mmap)
        self.control: CData = ffi.cast("struct zccp_control *", self._buf)
        self._slots = [self._make_view(i) for i in range(layout.slot_count)]
        # One memoryview of the mapping, and each slot's response region cut from it once:
        # a request slices its payload from it, never making views of the whole mapping.
        self._mv = memoryview(self._mmap)
        self._responses = [self._mv[v.base + layout.response_offset:
                                    v.base + layout.response_offset + layout.response_cap] for v in self._slots]
        self._closed = False

    # -- set-up ---------------------------------------------------------------------------

    def publish(self, socket_path: str) -> None:
        """Write every slot header, then the control page; nginx trusts nothing before magic."""
        lay = self.layout
        for v in self._slots:
            h = v.header
            h.magic = SLOT_MAGIC
            h.version = ABI_VERSION
            h.state = State.FREE
            h.payload_cap = lay.payload_cap
            h.tokens_cap = lay.tokens_cap
            h.response_cap = lay.response_cap
            v.meta.gpu_device_id = -1
        c = self.control
        c.abi_version = ABI_VERSION
        c.engine_state = EngineState.STARTING
        c.epoch = self.epoch
        c.engine_pid = os.getpid()
        c.slot_count = lay.slot_count
        c.slot_size = lay.slot_size
        c.payload_offset = lay.payload_offset
        c.payload_cap = lay.payload_cap
        c.tokens_offset = lay.tokens_offset
        c.tokens_cap = lay.tokens_cap
        c.response_offset = lay.response_offset
        c.response_cap = lay.response_cap
        c.started_ns = time.time_ns()
        path = socket_path.encode()
        ffi.memmove(c.socket_path, path + b"\0", len(path) + 1)
        c.magic = CONTROL_MAGIC  # last: the page is complete once the magic is there

    def set_engine_state(self, state: int) -> None:
        self.control.engine_state = state

    def set_purge_epoch(self, epoch: int) -> None:
        """The cache's purge epoch for nginx's L1 (zccp.cache.purge_epoch); 0: unknown."""
        if not self._closed:
            self.control.purge_epoch = epoch

    def set_doorbells(self, count: int) -> None:
        """How many of the engine's processes nginx may ring on a socket of their own."""
        self.control.doorbell_count = count

    def set_tracing(self, ratio: float) -> None:
        """Tell nginx traces are exported (it then sends its L1 hits' spans: ZCCP_KIND_SPANS)."""
        self.control.trace_ratio_ppm = round(ratio * 1_000_000)
        self.control.trace_on = 1

    # -- slots ----------------------------------------------------------------------------

    def _make_view(self, index: int) -> SlotView:
        base = self.layout.slot_base(index)
        return SlotView(
            index=index,
            header=ffi.cast("struct zccp_slot_header *", self._buf + base),
            meta=ffi.cast("struct zccp_slot_meta *", self._buf + base + META_OFFSET),
            signature=ffi.cast("struct zccp_slot_signature *", self._buf + base + SIG_OFFSET),
            request=ffi.cast("struct zccp_slot_request *", self._buf + base + REQ_OFFSET),
            base=base,
        )

    def slot(self, index: int) -> SlotView:
        if not 0 <= index < self.layout.slot_count:
            raise SlotError(f"slot {index} out of range [0, {self.layout.slot_count})")
        return self._slots[index]

    def slots(self) -> list[SlotView]:
        return list(self._slots)

    def validate(self, view: SlotView) -> None:
        """Check every header value the engine is about to trust."""
        h, lay = view.header, self.layout
        if h.magic != SLOT_MAGIC or h.version != ABI_VERSION:
            raise SlotError(f"slot {view.index}: bad magic/version")
        if h.payload_cap != lay.payload_cap or h.tokens_cap != lay.tokens_cap or h.response_cap != lay.response_cap:
            raise SlotError(f"slot {view.index}: capacities were overwritten")
        if h.payload_len > lay.payload_cap:
            raise SlotError(f"slot {view.index}: payload_len {h.payload_len} > cap {lay.payload_cap}")

    def payload(self, view: SlotView) -> memoryview:
        """The request body, zero-copy (length validated by validate())."""
        start = view.base + self.layout.payload_offset
        return self._mv[start : start + view.header.payload_len]

    def token_array(self, view: SlotView) -> np.ndarray:
        """The slot's whole token array as a writable int32 numpy array over the mmap (no copy)."""
        return np.frombuffer(self._mmap, dtype=np.int32, count=self.layout.tokens_cap,
                             offset=view.base + self.layout.tokens_offset)

    def token_tensor(self, view: SlotView) -> torch.Tensor:
        """The slot's whole token array as a writable int32 tensor over the mmap (no copy)."""
        import torch

        return torch.from_numpy(self.token_array(view))

    def response_region(self, view: SlotView) -> memoryview:
        return self._responses[view.index]

    def mapping(self) -> mmap.mmap:
        """The raw mapping (for device registration)."""
        return self._mmap

    def address(self) -> int:
        """Where the mapping starts in this process (for its memory policy: zccp.process.numa)."""
        return int(ffi.cast("uintptr_t", self._buf))

    # -- tear-down ------------------------------------------------------------------------

    def close(self, unlink: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        if self._owner:
            self.control.engine_state = EngineState.STOPPING
            self.control.magic = 0
        for region in self._responses:
            region.release()
        self._mv.release()
        del self._slots, self.control, self._buf, self._responses
        try:
            self._mmap.close()
        except BufferError:
            pass  # a tensor view still alive; the mapping goes with the process
        if unlink and self._owner:    # an attached view (a prep process's) leaves the arena to its maker
            try:
                posix_ipc.unlink_shared_memory(self.name)
            except posix_ipc.ExistentialError:
                pass
