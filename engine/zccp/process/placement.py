"""Where each engine and nginx's workers run: CPUs and a memory node per engine, from the
host's topology in sysfs (pure functions over a sysfs root, so fake trees test them).

`auto` with a GPU: the engine takes the CPUs local to its GPU's PCI device and that
device's NUMA node; without one, the online CPUs are split: nginx's share of each node
(`nginx_share`) first, the rest among the engines of that node, engines spread over the
nodes in turn. A fixed placement (`cpus`, `numa_node`) is checked against the host.
nginx's workers go on the CPUs no engine holds on the engines' nodes (else on any node's;
when the engines take them all, on everything), one node's CPUs per worker in turn, so a
worker sits beside the engines it rings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from zccp.config.sections import Config, ConfigError, GpuConfig, PlacementConfig

NVIDIA = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")       # VGA, 3D controller


def parse_cpulist(text: str) -> list[int]:
    """A kernel cpulist ("0-3,8,10-11") as sorted CPU numbers; ValueError when malformed."""
    out: set[int] = set()
    text = text.strip()
    if not text:
        return []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        a, b = int(lo), int(hi) if sep else int(lo)
        if a < 0 or b < a or b > 65535:
            raise ValueError(f"bad CPU range {part!r}")
        out.update(range(a, b + 1))
    return sorted(out)


def format_cpulist(cpus: Sequence[int]) -> str:
    """Sorted CPU numbers as a cpulist, ranges folded ("0-3,8")."""
    out: list[str] = []
    s = sorted(set(cpus))
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        out.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(out)


@dataclass(frozen=True)
class Gpu:
    pci: str                 # 0000:3b:00.0
    numa_node: int           # -1: the firmware does not say
    local_cpus: tuple[int, ...]


@dataclass(frozen=True)
class Topology:
    online: tuple[int, ...]
    nodes: dict[int, tuple[int, ...]]     # node -> its online CPUs (a host without NUMA: node 0 holds all)
    gpus: tuple[Gpu, ...]                 # NVIDIA devices in PCI bus order (nvidia-smi's order)

    def node_of(self, cpus: Sequence[int]) -> int | None:
        """The node holding most of `cpus`."""
        best, count = None, 0
        for node, held in self.nodes.items():
            n = len(set(held) & set(cpus))
            if n > count:
                best, count = node, n
        return best


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def read_topology(sysfs: Path = Path("/sys")) -> Topology:
    online = parse_cpulist(_read(sysfs / "devices/system/cpu/online") or "")
    nodes: dict[int, tuple[int, ...]] = {}
    node_dir = sysfs / "devices/system/node"
    for d in sorted(node_dir.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpus = [c for c in parse_cpulist(_read(d / "cpulist") or "") if c in online]
        if cpus:
            nodes[int(d.name[4:])] = tuple(cpus)
    if not nodes:
        nodes = {0: tuple(online)}
    gpus = []
    for dev in sorted((sysfs / "bus/pci/devices").glob("*")):
        if _read(dev / "vendor") != NVIDIA or not (_read(dev / "class") or "").startswith(GPU_CLASSES):
            continue
        node = int(_read(dev / "numa_node") or "-1")
        local = [c for c in parse_cpulist(_read(dev / "local_cpulist") or "") if c in online]
        gpus.append(Gpu(dev.name, node, tuple(local)))
    return Topology(tuple(online), nodes, tuple(gpus))


@dataclass(frozen=True)
class EnginePlacement:
    cpus: tuple[int, ...]
    numa_node: int | None

    @property
    def cpulist(self) -> str:
        return format_cpulist(self.cpus)


@dataclass(frozen=True)
class EngineAsk:
    """What one engine asks for: its name, placement config, and its GPU (index among the
    host's NVIDIA devices) when it runs on one."""
    name: str
    placement: PlacementConfig
    gpu: int | None = None
    where: str = "placement"           # the config key, for errors


@dataclass
class Plan:
    engines: dict[str, EnginePlacement | None] = field(default_factory=dict)   # None: not placed
    nginx_workers: list[tuple[int, ...]] = field(default_factory=list)         # one CPU set per worker; []: none


def _fixed(topo: Topology, ask: EngineAsk, path: str) -> EnginePlacement:
    p = ask.placement
    if p.cpus is not None:
        try:
            cpus = parse_cpulist(p.cpus)
        except ValueError as exc:
            raise ConfigError(f"{path}: {ask.where}.cpus: {p.cpus!r}: {exc}") from None
        off = [c for c in cpus if c not in topo.online]
        if off or not cpus:
            raise ConfigError(f"{path}: {ask.where}.cpus: {p.cpus!r}: CPU(s) {format_cpulist(off) or 'none'} not "
                              f"online here (online: {format_cpulist(topo.online)})")
    else:
        cpus = list(topo.nodes.get(p.numa_node, ())) if p.numa_node is not None else list(topo.online)
    node = p.numa_node
    if node is not None and node not in topo.nodes:
        raise ConfigError(f"{path}: {ask.where}.numa_node: {node} is not a node with online CPUs here "
                          f"(nodes: {', '.join(map(str, topo.nodes))})")
    return EnginePlacement(tuple(cpus), node if node is not None else topo.node_of(cpus))


def _split(cpus: Sequence[int], parts: int) -> list[tuple[int, ...]]:
    """cpus in `parts` contiguous runs as even as can be; fewer CPUs than parts: shared."""
    if len(cpus) < parts:
        return [(cpus[i % len(cpus)],) for i in range(parts)] if cpus else [() for _ in range(parts)]
    base, extra = divmod(len(cpus), parts)
    out, at = [], 0
    for i in range(parts):
        n = base + (1 if i < extra else 0)
        out.append(tuple(cpus[at:at + n]))
        at += n
    return out


def plan(topo: Topology, asks: Sequence[EngineAsk], nginx_workers: int, path: str = "config") -> Plan:
    out = Plan()
    autos = [a for a in asks if a.placement.mode == "auto"]
    share = max((a.placement.nginx_share for a in autos), default=0.0)
    # nginx's CPUs on each node, taken first when an engine is placed automatically
    reserved: dict[int, list[int]] = {}
    if autos:
        for node, cpus in topo.nodes.items():
            n = min(len(cpus) - 1, max(1, math.ceil(share * len(cpus)))) if share > 0 else 0
            reserved[node] = list(cpus[len(cpus) - n:]) if n > 0 else []
    # auto engines: by their GPU's node, or spread over the nodes in turn
    by_node: dict[int, list[EngineAsk]] = {}
    node_ids = list(topo.nodes)
    spread = 0
    for a in autos:
        gpu = topo.gpus[a.gpu] if a.gpu is not None and a.gpu < len(topo.gpus) else None
        if gpu is not None and gpu.numa_node in topo.nodes:
            node = gpu.numa_node
        elif gpu is not None and gpu.local_cpus:
            node = topo.node_of(gpu.local_cpus) or node_ids[0]
        else:
            node = node_ids[spread % len(node_ids)]
            spread += 1
        by_node.setdefault(node, []).append(a)
    for node, group in by_node.items():
        free = [c for c in topo.nodes[node] if c not in reserved.get(node, [])]
        for a, cpus in zip(group, _split(free, len(group)), strict=True):
            out.engines[a.name] = EnginePlacement(cpus, node)
    for a in asks:
        if a.placement.mode == "fixed":
            out.engines[a.name] = _fixed(topo, a, path)
        elif a.placement.mode == "none":
            out.engines[a.name] = None
    held = {c for p in out.engines.values() if p is not None for c in p.cpus}
    if held:
        # the nodes the engines sit on first: a worker beside the engines it rings
        near = {p.numa_node for p in out.engines.values() if p is not None}
        left = {node: tuple(c for c in cpus if c not in held) for node, cpus in topo.nodes.items()}
        per_node = [cpus for node, cpus in left.items() if cpus and node in near] or \
            [cpus for cpus in left.values() if cpus] or [tuple(topo.online)]
        out.nginx_workers = [per_node[i % len(per_node)] for i in range(nginx_workers)]
    return out


def worker_cpu_affinity(workers: Sequence[Sequence[int]]) -> str | None:
    """nginx's `worker_cpu_affinity` argument: one bitmask per worker, CPU 0 rightmost."""
    if not workers:
        return None
    width = max(c for w in workers for c in w) + 1
    return " ".join("".join("1" if c in set(w) else "0" for c in reversed(range(width))) for w in workers)


def asks(cfg: Config) -> list[EngineAsk]:
    """Every engine of the stack as the planner sees it (the same list in each engine
    process and in nginx's rendering, so all agree on the split)."""
    def gpu(g: GpuConfig) -> int | None:
        return None if g.enabled == "off" else g.device_id

    if not cfg.engines:
        return [EngineAsk("default", cfg.placement, gpu(cfg.gpu))]
    return [EngineAsk(e.name, e.placement, gpu(e.gpu), f"engines.{e.name}.placement") for e in cfg.engines]


def this_engine(cfg: Config) -> str:
    """The name of the engine cfg (for_engine's) is: the entry whose arena it has."""
    for e in cfg.engines:
        if e.shared_memory.name == cfg.shared_memory.name:
            return e.name
    return "default"


def placement_for(cfg: Config, sysfs: Path = Path("/sys")) -> EnginePlacement | None:
    return plan(read_topology(sysfs), asks(cfg), cfg.server.workers, cfg.path).engines.get(this_engine(cfg))


def nginx_affinity(cfg: Config, sysfs: Path = Path("/sys")) -> str | None:
    """The `worker_cpu_affinity` argument for cfg's nginx (None: no engine is placed)."""
    return worker_cpu_affinity(plan(read_topology(sysfs), asks(cfg), cfg.server.workers, cfg.path).nginx_workers)


def locality(cfg: Config, sysfs: Path = Path("/sys")) -> tuple[dict[str, int | None], list[int | None]]:
    """Routing's view of the plan: each engine's NUMA node (None: not placed) and each nginx
    worker's, in worker order ([]: the workers are not placed)."""
    topo = read_topology(sysfs)
    p = plan(topo, asks(cfg), cfg.server.workers, cfg.path)
    engine_nodes = {name: (e.numa_node if e is not None else None) for name, e in p.engines.items()}
    return engine_nodes, [topo.node_of(w) for w in p.nginx_workers]


def systemd_dropin(p: EnginePlacement | None) -> str:
    """The unit drop-in that applies placement p before the engine starts (systemd's own
    CPUAffinity= and NUMAPolicy=; the engine applies the same again, a no-op then)."""
    if p is None:
        return "# placement: none (nothing to add)\n"
    lines = ["[Service]", f"CPUAffinity={p.cpulist}"]
    if p.numa_node is not None:
        lines += ["NUMAPolicy=preferred", f"NUMAMask={p.numa_node}"]
    return "\n".join(lines) + "\n"
