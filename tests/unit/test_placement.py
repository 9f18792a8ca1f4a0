"""zccp.process.placement over fake sysfs trees: two nodes with four GPUs each, GPUs on node 1
only, a CPU-only host, offline CPUs; the config's placement key; nginx's masks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from zccp.config import ConfigError, parse_config
from zccp.process.placement import (
    EngineAsk,
    format_cpulist,
    parse_cpulist,
    plan,
    read_topology,
    worker_cpu_affinity,
)
from zccp.config.sections import PlacementConfig

AUTO = PlacementConfig(mode="auto")


def fake_sysfs(root: Path, nodes: dict[int, str], online: str, gpus: list[tuple[int, str]] = ()) -> Path:
    """nodes: node -> cpulist; gpus: (numa_node, local_cpulist) of each NVIDIA device."""
    (root / "devices/system/cpu").mkdir(parents=True)
    (root / "devices/system/cpu/online").write_text(online + "\n")
    for n, cpus in nodes.items():
        d = root / f"devices/system/node/node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    pci = root / "bus/pci/devices"
    pci.mkdir(parents=True)
    nic = pci / "0000:00:1f.6"          # not a GPU: ignored
    nic.mkdir()
    (nic / "vendor").write_text("0x8086\n")
    (nic / "class").write_text("0x020000\n")
    for i, (node, local) in enumerate(gpus):
        d = pci / f"0000:{0x18 + i:02x}:00.0"
        d.mkdir()
        (d / "vendor").write_text("0x10de\n")
        (d / "class").write_text("0x030200\n")
        (d / "numa_node").write_text(f"{node}\n")
        (d / "local_cpulist").write_text(local + "\n")
    return root


def test_cpulists_round_trip():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert parse_cpulist("") == []
    for bad in ("3-1", "a", "1,,2", "-1"):
        with pytest.raises(ValueError):
            parse_cpulist(bad)


def test_two_nodes_four_gpus_each_engine_beside_its_gpu(tmp_path):
    gpus = [(0, "0-7")] * 4 + [(1, "8-15")] * 4
    topo = read_topology(fake_sysfs(tmp_path, {0: "0-7", 1: "8-15"}, "0-15", gpus))
    assert [g.numa_node for g in topo.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    asks = [EngineAsk("a", AUTO, gpu=0), EngineAsk("b", AUTO, gpu=5)]
    p = plan(topo, asks, nginx_workers=2)
    # each node keeps ceil(0.25 * 8) = 2 CPUs for nginx, the last two
    assert p.engines["a"].numa_node == 0 and p.engines["a"].cpulist == "0-5"
    assert p.engines["b"].numa_node == 1 and p.engines["b"].cpulist == "8-13"
    assert p.nginx_workers == [(6, 7), (14, 15)]      # one worker per node, beside its engine
    assert worker_cpu_affinity(p.nginx_workers) == "0000000011000000 1100000000000000"


def test_engines_sharing_a_node_split_its_cpus(tmp_path):
    gpus = [(0, "0-7")] * 4 + [(1, "8-15")] * 4
    topo = read_topology(fake_sysfs(tmp_path, {0: "0-7", 1: "8-15"}, "0-15", gpus))
    p = plan(topo, [EngineAsk(n, AUTO, gpu=4 + i) for i, n in enumerate("abcd")], nginx_workers=1)
    assert [p.engines[n].cpulist for n in "abcd"] == ["8-9", "10-11", "12", "13"]
    assert {p.engines[n].numa_node for n in "abcd"} == {1}


def test_gpus_on_node_1_only(tmp_path):
    topo = read_topology(fake_sysfs(tmp_path, {0: "0-3", 1: "4-7"}, "0-7", [(1, "4-7"), (1, "4-7")]))
    p = plan(topo, [EngineAsk("a", AUTO, gpu=0), EngineAsk("b", AUTO, gpu=1)], nginx_workers=2)
    assert p.engines["a"].numa_node == p.engines["b"].numa_node == 1
    # node 1 keeps ceil(0.25 * 4) = 1 CPU for nginx; its other three split between the engines
    assert p.engines["a"].cpulist == "4-5" and p.engines["b"].cpulist == "6"
    # nginx's workers beside the engines (node 1), not on the idle node 0
    assert p.nginx_workers == [(7,), (7,)]


def test_a_gpu_without_a_numa_node_goes_by_its_local_cpus(tmp_path):
    topo = read_topology(fake_sysfs(tmp_path, {0: "0-3", 1: "4-7"}, "0-7", [(-1, "4-7")]))
    assert plan(topo, [EngineAsk("a", AUTO, gpu=0)], 1).engines["a"].numa_node == 1


def test_cpu_only_host_splits_between_nginx_and_engines(tmp_path):
    topo = read_topology(fake_sysfs(tmp_path, {0: "0-7"}, "0-7"))
    assert topo.gpus == ()
    p = plan(topo, [EngineAsk("a", AUTO, gpu=0), EngineAsk("b", AUTO, gpu=0)], nginx_workers=2)
    assert p.engines["a"].cpulist == "0-2" and p.engines["b"].cpulist == "3-5"
    assert p.nginx_workers == [(6, 7), (6, 7)]
    share = PlacementConfig(mode="auto", nginx_share=0.5)
    assert plan(topo, [EngineAsk("a", share)], 1).engines["a"].cpulist == "0-3"


def test_two_cores_one_each(tmp_path):
    topo = read_topology(fake_sysfs(tmp_path, {0: "0-1"}, "0-1"))
    p = plan(topo, [EngineAsk("default", AUTO)], nginx_workers=2)
    assert p.engines["default"].cpulist == "0" and p.nginx_workers == [(1,), (1,)]
    assert worker_cpu_affinity(p.nginx_workers) == "10 10"


def test_offline_cpus_are_never_used(tmp_path):
    topo = read_topology(fake_sysfs(tmp_path, {0: "0-3", 1: "4-7"}, "0-2,4-5,7", [(1, "4-7")]))
    assert topo.nodes == {0: (0, 1, 2), 1: (4, 5, 7)}
    assert topo.gpus[0].local_cpus == (4, 5, 7)
    p = plan(topo, [EngineAsk("a", AUTO, gpu=0)], 1)
    assert p.engines["a"].cpulist == "4-5" and 3 not in p.nginx_workers[0] and 6 not in p.nginx_workers[0]
    fixed = PlacementConfig(mode="fixed", cpus="2-3")
    with pytest.raises(ConfigError, match=r"c.yaml: engines.a.placement.cpus: '2-3': CPU\(s\) 3 not online"):
        plan(topo, [EngineAsk("a", fixed, where="engines.a.placement")], 1, "c.yaml")


def test_fixed_placement_and_none(tmp_path):
    topo = read_topology(fake_sysfs(tmp_path, {0: "0-3", 1: "4-7"}, "0-7"))
    p = plan(topo, [EngineAsk("a", PlacementConfig(mode="fixed", cpus="5-6")),
                    EngineAsk("b", PlacementConfig(mode="fixed", numa_node=0)),
                    EngineAsk("c", PlacementConfig())], nginx_workers=2)
    assert p.engines["a"].cpulist == "5-6" and p.engines["a"].numa_node == 1
    assert p.engines["b"].cpulist == "0-3" and p.engines["b"].numa_node == 0
    assert p.engines["c"] is None
    assert p.nginx_workers == [(4, 7), (4, 7)]
    with pytest.raises(ConfigError, match="numa_node: 3 is not a node"):
        plan(topo, [EngineAsk("a", PlacementConfig(mode="fixed", numa_node=3))], 1)


def test_nothing_placed_no_affinity(tmp_path):
    topo = read_topology(fake_sysfs(tmp_path, {0: "0-7"}, "0-7"))
    p = plan(topo, [EngineAsk("a", PlacementConfig())], nginx_workers=2)
    assert p.engines == {"a": None} and p.nginx_workers == [] and worker_cpu_affinity([]) is None


def test_host_without_node_directories(tmp_path):
    (tmp_path / "devices/system/cpu").mkdir(parents=True)
    (tmp_path / "devices/system/cpu/online").write_text("0-3\n")
    topo = read_topology(tmp_path)
    assert topo.nodes == {0: (0, 1, 2, 3)} and topo.gpus == ()


@pytest.mark.parametrize("raw, message", [
    ({"placement": "sometimes"}, "c.yaml: placement: expected auto, none or a mapping"),
    ({"placement": {"cpu": "1"}}, "c.yaml: placement.cpu: unknown key"),
    ({"placement": {"mode": "auto", "cpus": "1"}}, "c.yaml: placement.mode: 'auto' with cpus"),
    ({"placement": {"nginx_share": 0.5}}, "c.yaml: placement: a mapping names cpus or numa_node"),
    ({"placement": {"mode": "auto", "nginx_share": 0.95}}, r"c.yaml: placement.nginx_share: 0.95 is outside"),
    ({"engines": [{"name": "a", "placement": {"numa_node": "x"}}]}, "c.yaml: engines.a.placement.numa_node"),
])
def test_config_refuses_bad_placement(raw, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(raw, "c.yaml")


def test_config_placement_per_engine_and_inherited():
    cfg = parse_config({"placement": "auto", "engines": [{"name": "a", "placement": {"cpus": "0"}}, {"name": "b"}]},
                       "c.yaml")
    assert cfg.engines[0].placement == PlacementConfig(mode="fixed", cpus="0")
    assert cfg.engines[1].placement.mode == "auto"
    assert parse_config({}, "c.yaml").placement.mode == "none"


def test_locality_gives_routing_each_engine_and_worker_node(tmp_path):
    from zccp.ops.nginx_conf import engines_settings
    from zccp.process.placement import locality
    from zccp.config.runtime import resolve

    sysfs = fake_sysfs(tmp_path / "sys", {0: "0-3", 1: "4-7"}, "0-7")
    cfg = parse_config({"server": {"workers": 2},
                        "engines": [{"name": "a", "placement": {"cpus": "0-2"}},
                                    {"name": "b", "placement": {"cpus": "4-6"}},
                                    {"name": "c"}]}, "c.yaml")
    engine_nodes, workers = locality(cfg, sysfs)
    assert engine_nodes == {"a": 0, "b": 1, "c": None}
    assert workers == [0, 1]          # worker 0 on CPU 3 (node 0), worker 1 on CPU 7 (node 1)
    rows = engines_settings(resolve(cfg, tmp_path / "run"), engine_nodes)
    assert re.search(r'name = "a",[^}]*, node = 0 }', rows) and re.search(r'name = "b",[^}]*, node = 1 }', rows)
    assert "node" not in rows.split('name = "c"')[1]   # placement none: no node, no locality
