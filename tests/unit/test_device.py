"""The device seam. No GPU here: the CPU path runs for real; the CUDA path runs against a
recording stand-in for cupy (checked on a real GPU only when a device is lent)."""

from __future__ import annotations

import ctypes
import mmap
import sys
import types

import pytest
import torch

from zccp.transport import device as dev
from zccp.config import GpuConfig


def test_cpu_view_is_zero_copy():
    m = mmap.mmap(-1, 4096)
    t = torch.frombuffer(m, dtype=torch.int32, count=16, offset=64)
    v = dev.CpuDevice().input_view(t[:4])
    t[0] = 7
    assert v[0] == 7 and v.data_ptr() == t.data_ptr()
    del t, v


def test_auto_without_cuda_falls_back_to_cpu_and_on_refuses(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    m = mmap.mmap(-1, 4096)
    assert isinstance(dev.select_device(GpuConfig(enabled="auto"), m), dev.CpuDevice)
    assert isinstance(dev.select_device(GpuConfig(enabled="off"), m), dev.CpuDevice)
    with pytest.raises(RuntimeError, match="gpu.enabled is 'on'"):
        dev.select_device(GpuConfig(enabled="on"), m)


# The stand-in's device address space: the host mapping shifted by DEVICE_DELTA, as mapped
# host memory appears to a GPU at its own addresses. Reading a "device" address reads the
# host bytes it stands for, so what the model would read stays observable.
DEVICE_DELTA = 0x100000000000


class _FakeRuntime:
    def __init__(self) -> None:
        self.registered: list[tuple[int, int, int]] = []
        self.unregistered: list[int] = []

    def hostRegister(self, ptr, size, flags):
        self.registered.append((ptr, size, flags))

    def hostUnregister(self, ptr):
        self.unregistered.append(ptr)

    def pointerGetAttributes(self, ptr):
        (base, size, _), = self.registered
        assert base <= ptr < base + size, "only registered memory has a device pointer"
        return types.SimpleNamespace(devicePointer=ptr + DEVICE_DELTA)


def _fake_cupy():
    rt = _FakeRuntime()
    made = []

    class UnownedMemory:
        def __init__(self, ptr, size, owner):
            self.ptr, self.size = ptr, size

    class MemoryPointer:
        def __init__(self, mem, off):
            self.mem, self.off = mem, off

    def ndarray(shape, dtype, memptr):
        made.append((shape, memptr.mem.ptr, memptr.mem.size))
        host = memptr.mem.ptr + memptr.off - DEVICE_DELTA
        (n,) = shape
        # The "device array" is the registered host memory itself, read in place.
        return torch.frombuffer((ctypes.c_int32 * n).from_address(host), dtype=torch.int32)

    cuda = types.SimpleNamespace(runtime=rt, UnownedMemory=UnownedMemory, MemoryPointer=MemoryPointer,
                                 Device=lambda i: types.SimpleNamespace(use=lambda: None), is_available=lambda: True)
    return types.SimpleNamespace(cuda=cuda, ndarray=ndarray, int32="int32"), rt, made


def test_cuda_path_registers_the_arena_once_and_maps_views_by_offset(monkeypatch):
    cupy, rt, made = _fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(torch, "from_dlpack", lambda a: a)
    m = mmap.mmap(-1, 64 * 1024)
    d = dev.CudaMappedDevice(m, 0)
    (ptr, size, flags), = rt.registered
    assert size == len(m) and flags == 3  # cudaHostRegisterPortable | cudaHostRegisterMapped
    tokens = torch.frombuffer(m, dtype=torch.int32, count=100, offset=8192)
    tokens[:20] = torch.arange(1000, 1020, dtype=torch.int32)
    a = d.input_view(tokens[:10])
    b = d.input_view(tokens[:20])
    assert len(rt.registered) == 1       # once per arena, not per request
    assert made[0] == ((10,), ptr + DEVICE_DELTA + 8192, 40)
    assert made[1] == ((20,), ptr + DEVICE_DELTA + 8192, 80)
    # The model reads exactly the slot's token ids, and in place: a write to the arena
    # shows through the view at once (no staging copy was made).
    assert a.tolist() == list(range(1000, 1010)) and b.tolist() == list(range(1000, 1020))
    tokens[3] = 7
    assert int(a[3]) == 7 and int(b[3]) == 7
    outside = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(ValueError, match="outside the registered arena"):
        d.input_view(outside)
    del a, b
    d.close()
    d.close()
    assert rt.unregistered == [ptr]
    del tokens
