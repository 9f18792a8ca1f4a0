"""Where the model reads its input ids: the device seam.

On the CPU the model reads a zero-copy torch view of the slot's token array (a backend
without torch, the null one, reads the numpy array itself: torch is never imported).
With CUDA and cupy present, the whole arena is registered once with the CUDA
driver as mapped, portable host memory, and the model reads the same bytes
through a device pointer: no staging copy, no per-request registration.
Absence of a GPU is detected once and logged once.
"""

from __future__ import annotations

import logging
import mmap
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from zccp.config import GpuConfig

if TYPE_CHECKING:
    import torch

log = logging.getLogger("zccp.device")

# cudaHostRegister flags (CUDA runtime API): Portable = 1, Mapped = 2.
_HOST_REGISTER_PORTABLE = 1
_HOST_REGISTER_MAPPED = 2


@dataclass
class CpuDevice:
    device_id: int = -1
    name: str = "cpu"

    @property
    def torch_device(self) -> torch.device:
        import torch

        return torch.device("cpu")

    def input_view(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens

    def close(self) -> None:
        pass


class CudaMappedDevice:
    """The arena pinned and mapped into the GPU's address space (unified memory)."""

    def __init__(self, arena_map: mmap.mmap, device_id: int) -> None:
        import cupy  # imported here: the CPU path must not need it

        self._cupy = cupy
        self.device_id = device_id
        self.name = f"cuda:{device_id}"
        cupy.cuda.Device(device_id).use()
        self._size = len(arena_map)
        # ctypes gives the mapping's address without copying it.
        import ctypes

        self._host_base = ctypes.addressof(ctypes.c_char.from_buffer(arena_map))
        cupy.cuda.runtime.hostRegister(self._host_base, self._size, _HOST_REGISTER_PORTABLE | _HOST_REGISTER_MAPPED)
        self._dev_base = cupy.cuda.runtime.pointerGetAttributes(self._host_base).devicePointer
        self._registered = True

    @property
    def torch_device(self) -> torch.device:
        import torch

        return torch.device("cuda", self.device_id)

    def input_view(self, tokens: torch.Tensor) -> torch.Tensor:
        offset = tokens.data_ptr() - self._host_base
        nbytes = tokens.numel() * tokens.element_size()
        if offset < 0 or offset + nbytes > self._size:
            raise ValueError("token view lies outside the registered arena")
        mem = self._cupy.cuda.UnownedMemory(self._dev_base + offset, nbytes, owner=self)
        arr = self._cupy.ndarray((tokens.numel(),), dtype=self._cupy.int32,
                                 memptr=self._cupy.cuda.MemoryPointer(mem, 0))
        import torch   # a GPU engine computes with torch: loaded long before its first request

        return torch.from_dlpack(arr)

    def close(self) -> None:
        if self._registered:
            self._registered = False
            self._cupy.cuda.runtime.hostUnregister(self._host_base)


def select_device(cfg: GpuConfig, arena_map: mmap.mmap, uses_torch: bool = True) -> CpuDevice | CudaMappedDevice:
    if cfg.enabled == "off":
        log.info("gpu disabled by config; model runs on the CPU")
        return CpuDevice()
    if not uses_torch and cfg.enabled == "auto":   # no model computes here: nothing to put on a GPU
        return CpuDevice()
    reason = _cuda_unavailable_reason()
    if reason is None and not cfg.register_host_memory:
        reason = "gpu.register_host_memory is false"
    if reason is None:
        try:
            dev = CudaMappedDevice(arena_map, cfg.device_id)
            log.info("arena registered with CUDA as mapped host memory on %s", dev.name)
            return dev
        except Exception as exc:  # driver refused registration: say why, fall back or fail
            reason = f"host registration failed: {exc}"
    if cfg.enabled == "on":
        raise RuntimeError(f"gpu.enabled is 'on' but the GPU path is unavailable: {reason}")
    log.info("no GPU path (%s); model runs on the CPU over a zero-copy view", reason)
    return CpuDevice()


def token_views(host: list[np.ndarray], uses_torch: bool) -> list[Any]:
    """The model's views of the slots' token arrays: torch tensors over the same memory, or,
    for a backend without torch, the numpy arrays themselves."""
    if not uses_torch:
        return list(host)
    import torch

    return [torch.from_numpy(a) for a in host]


def input_view(device: CpuDevice | CudaMappedDevice, uses_torch: bool) -> Callable[[np.ndarray], Any]:
    """A prompt's host ids (a slice of the slot's numpy array) -> what the model reads: a
    torch view on the device seam, or the array itself for a backend without torch."""
    if not uses_torch:
        return _same
    import torch

    to_model, from_numpy = device.input_view, torch.from_numpy
    return lambda ids: to_model(from_numpy(ids))


def _same(ids: np.ndarray) -> np.ndarray:
    return ids


def _cuda_unavailable_reason() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    try:
        import cupy
    except ImportError:
        return "cupy is not installed (pip install .[gpu])"
    try:
        if not cupy.cuda.is_available():
            return "cupy sees no CUDA device"
    except Exception as exc:
        return f"cupy cannot reach CUDA: {exc}"
    return None
