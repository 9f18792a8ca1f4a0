"""One short check of the GPU path, for a machine with an NVIDIA GPU (pip install -e .[gpu,hf]).

Creates a real arena, registers it with CUDA (mapped, portable host memory), writes prompt
tokens into a slot from the CPU, reads them on the GPU through the device pointer with no
copy, and checks that the built-in model gives the same greedy tokens on cuda as on the
CPU. Then the hf backend on cuda (--hf PATH, or the tests' on-the-fly checkpoint): its
chat template writes the ids into the slot, the model reads them through the registered
arena, greedy tokens match the CPU's (float32, TF32 off), batched decoding on the GPU
matches decoding alone, and the planner sizes a prefill chunk from torch.cuda.mem_get_info.
Then placement (docs/engines.md): `auto` for an engine on GPU 0 takes that device's NUMA
node and CPUs local to it (sysfs), applied to this process, and an arena made after it has
its pages on that node (numa_maps) and registers with CUDA from there. (Not yet run: no GPU
has been lent since it was written.)
Prints one line per check and exits non-zero on the first failure.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import uuid
from pathlib import Path

import torch

from zccp.transport.abi import SlotLayout
from zccp.api.common import ParseLimits
from zccp.transport.arena import Arena
from zccp.config import GpuConfig
from zccp.transport.device import CudaMappedDevice, select_device
from zccp.model.tiny import TinyConfig, TinyTransformer
from zccp.model.tokenizer import encode_chat_into
from zccp.shared_types import ChatMessage, SamplingParams

_LIMITS = ParseLimits(served_models=frozenset({"gpu-check"}), max_tokens_cap=4096, default_max_tokens=64)


def check_hf(d: CudaMappedDevice, tokens: torch.Tensor, path: str | None) -> None:
    """The hf backend on cuda, reading the slot through the registered arena."""
    from zccp.api import anthropic
    from zccp.model.hf import HfBackend
    from zccp.model.prompt import Prompt
    from zccp.serving.planner import Planner

    if path is None:
        from tests.support.hf_checkpoint import build_checkpoint

        path = str(build_checkpoint(Path(tempfile.mkdtemp()) / "ckpt", hidden=256, layers=4, heads=4, kv_heads=2))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    gpu = HfBackend(path, "gpu-check", dtype="float32", device=str(d.torch_device))
    cpu = HfBackend(path, "gpu-check", dtype="float32", device="cpu")
    assert next(gpu.model.parameters()).device.type == "cuda"
    print("ok: hf checkpoint loaded on", d.torch_device, "kv bytes/token", gpu.kv_bytes_per_token)
    doc = {"model": "gpu-check", "max_tokens": 24, "system": "Be brief.",
           "messages": [{"role": "user", "content": "Hello from shared memory 😀"}]}
    prompt = Prompt(anthropic.parse_document(doc, _LIMITS), lambda: anthropic.chat_input(doc))
    n = gpu.prompt.encode_into(prompt, tokens)
    view = d.input_view(tokens[:n])
    assert view.device.type == "cuda" and torch.equal(view.cpu(), tokens[:n])
    params = SamplingParams(max_tokens=24, temperature=0)
    a = list(cpu.generate(tokens[:n], params, lambda: False))
    b = list(gpu.generate(view, params, lambda: False))
    print("cpu:", a[:12], "gpu:", b[:12])
    assert a == b, "hf greedy tokens differ between CPU and GPU"
    print("ok: hf greedy tokens on cuda (read through the arena) equal the CPU's")
    alone = [list(gpu.generate(view[: n - k], params, lambda: False)) for k in range(4)]
    batch = gpu.new_batch()
    last = []
    with torch.inference_mode():
        for k in range(4):
            state = gpu.new_state()
            last.append(int(gpu.prefill_chunked(state, gpu.check_prompt(view[: n - k]), 0).argmax()))
            batch.join(state)
        got = [[t] for t in last]
        for _ in range(23):
            last = batch.decode(last).argmax(-1).tolist()
            for g, t in zip(got, last, strict=True):
                g.append(t)
    for g, al in zip(got, alone, strict=True):
        assert g[: len(al)] == al, "batched decoding on the GPU differs from decoding alone"
    print("ok: 4 sequences decoded in one batch on cuda equal each decoded alone")
    plan = Planner(gpu.device, 512 << 20, gpu.activation_bytes_per_token + gpu.kv_bytes_per_token, 0, 16)
    free, total = torch.cuda.mem_get_info(gpu.device)
    print(f"ok: planner chunk {plan.chunk()} tokens from {free >> 20} MiB free of {total >> 20} MiB")


def check_placement() -> None:
    import os

    from zccp.process import numa
    from zccp.config import PlacementConfig
    from zccp.ops.placement_status import arena_numa
    from zccp.process.placement import EngineAsk, plan, read_topology

    topo = read_topology()
    assert topo.gpus, "sysfs lists no NVIDIA PCI device"
    gpu = topo.gpus[0]
    p = plan(topo, [EngineAsk("gpu0", PlacementConfig(mode="auto"), gpu=0)], 1).engines["gpu0"]
    assert p is not None and set(p.cpus) <= set(gpu.local_cpus or topo.online), (p, gpu)
    assert gpu.numa_node < 0 or p.numa_node == gpu.numa_node, (p, gpu)
    print(f"ok: placement auto for GPU {gpu.pci} (node {gpu.numa_node}): CPUs {p.cpulist}, node {p.numa_node}")
    numa.pin_threads(set(p.cpus))
    assert os.sched_getaffinity(0) == set(p.cpus)
    node = p.numa_node if p.numa_node is not None else 0
    assert numa.prefer_node(node), "set_mempolicy refused"
    name = f"/zccp.gpucheck.p{uuid.uuid4().hex[:8]}"
    layout = SlotLayout.build(2, 1 << 20, 256 << 10, 64 << 10)
    arena = Arena(name, layout)
    try:
        assert numa.bind_range(arena.address(), layout.arena_size, node), "mbind refused"
        where = arena_numa(os.getpid(), name)
        assert where is not None and where.policy == f"prefer:{node}" and set(where.pages) == {node}, where
        d = select_device(GpuConfig(enabled="on"), arena.mapping())
        assert isinstance(d, CudaMappedDevice), d
        print(f"ok: the arena's pages on node {node} ({sum(where.pages.values())}), registered on {d.name}")
        d.close()
    finally:
        arena.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hf", help="an hf checkpoint directory (default: build the tests' small one)")
    args = ap.parse_args()
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
        check_hf(d, tokens, args.hf)
        del on_gpu, tokens
        d.close()
        check_placement()
        return 0
    finally:
        arena.close()


if __name__ == "__main__":
    sys.exit(main())
