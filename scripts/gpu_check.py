"""One short check of the GPU path, for a machine with an NVIDIA GPU (pip install -e .[gpu]).

Creates a real arena, registers it with CUDA (mapped, portable host memory), writes prompt
tokens into a slot from the CPU, reads them on the GPU through the device pointer with no
copy, and checks that the built-in model gives the same greedy tokens on cuda as on the
CPU. Prints one line per check and exits non-zero on the first failure.
"""

from __future__ import annotations

import sys
import uuid

import torch

from zccp.abi import SlotLayout
from zccp.arena import Arena
from zccp.config import GpuConfig
from zccp.device import CudaMappedDevice, select_device
from zccp.model.tiny import TinyConfig, TinyTransformer
from zccp.model.tokenizer import encode_chat_into
from zccp.request import ChatMessage, SamplingParams


def main() -> int:
    arena = Arena(f"/zccp.gpucheck.{uuid.uuid4().hex[:8]}", SlotLayout.build(2, 1 << 20, 256 << 10, 64 << 10))
    try:
        d = select_device(GpuConfig(enabled="on"), arena.mapping())
        assert isinstance(d, CudaMappedDevice), d
        print("ok: arena registered as mapped host memory on", d.name)
        tokens = arena.token_tensor(arena.slot(1))
        n = encode_chat_into("", [ChatMessage("user", "Hello from shared memory")], tokens)
        on_gpu = d.input_view(tokens[:n])
        assert on_gpu.device.type == "cuda", on_gpu.device
        assert torch.equal(on_gpu.cpu(), tokens[:n]), "device view differs from host bytes"
        tokens[0] = tokens[0]  # a host write is visible on the device without a copy:
        tokens[1] = 99
        torch.cuda.synchronize()
        assert int(on_gpu[1].item()) == 99, "device view is a copy, not a mapping"
        print("ok: the GPU reads the slot's token array in place", n, "tokens")
        params = SamplingParams(max_tokens=24, temperature=0)
        encode_chat_into("", [ChatMessage("user", "Hello from shared memory")], tokens)
        cpu_model = TinyTransformer(TinyConfig())
        gpu_model = TinyTransformer(TinyConfig()).to(d.torch_device)
        a = list(cpu_model.generate(tokens[:n], params, lambda: False))
        b = list(gpu_model.generate(d.input_view(tokens[:n]), params, lambda: False))
        print("cpu:", a[:12], "gpu:", b[:12])
        assert a == b, "greedy tokens differ between CPU and GPU"
        print("ok: same greedy tokens on cuda and cpu")
        del on_gpu, tokens
        d.close()
        return 0
    finally:
        arena.close()


if __name__ == "__main__":
    sys.exit(main())
