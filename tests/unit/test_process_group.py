"""The pieces of an engine of several processes (zccp.process.group) that need no stack: how
many processes a config gets, the config check, the arena a prep process attaches, the
doorbell socket it adopts, and the one /metrics page summed from every process's state."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid

import pytest

from tests.support.prom_text import histograms, samples
from zccp.transport.abi import SlotLayout
from zccp.transport.arena import Arena, ArenaError
from zccp.config import ConfigError, parse_config
from zccp.transport.doorbell import DoorbellServer
from zccp.observe.metrics import EngineMetrics
from zccp.observe.metrics_merge import merged, state
from zccp.process.group import MAX_AUTO, process_count


NO_QUOTA = "/nonexistent/cpu.max"


def _cfg(backend: str, n: int, **model: object):
    return parse_config({"model": {"backend": backend, **model}, "server": {"engine_processes": n},
                         **({"upstream": {"urls": ["http://127.0.0.1:9/v1"]}} if backend == "upstream" else {})})


@pytest.mark.parametrize("cpus, expected", [(1, 1), (2, 1), (4, 2), (7, 3), (64, MAX_AUTO)])
def test_an_unset_count_is_half_the_cpus_this_engine_may_use(monkeypatch, cpus: int, expected: int) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cpus)))
    assert process_count(_cfg("null", 0), NO_QUOTA) == expected
    assert process_count(_cfg("upstream", 0), NO_QUOTA) == expected
    # a model's prep processes hand their misses to it (zccp.process.handoff): sized alike
    assert process_count(_cfg("tiny", 0), NO_QUOTA) == expected


def test_a_cpu_quota_bounds_an_unset_count(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(32)))
    quota = tmp_path / "cpu.max"
    for text, expected in (("max 100000", MAX_AUTO), ("400000 100000", 2), ("150000 100000", 1), ("junk", MAX_AUTO)):
        quota.write_text(text + "\n")
        assert process_count(_cfg("null", 0), str(quota)) == expected, text


def test_a_set_count_is_kept_for_every_backend() -> None:
    assert process_count(_cfg("null", 3)) == 3
    assert process_count(_cfg("tiny", 1)) == 1
    assert process_count(_cfg("tiny", 4)) == 4
    assert process_count(parse_config({"model": {"backend": "null"}, "server": {"engine_processes": 2},
                                       "engines": [{"name": "a"}, {"name": "b", "model": {"backend": "tiny"}}]})) == 2


def test_an_out_of_range_count_is_refused_with_the_setting_named() -> None:
    for bad in (65, -1):
        with pytest.raises(ConfigError, match="engine_processes"):
            _cfg("null", bad)


def test_a_prep_process_attaches_the_published_arena_only() -> None:
    name = f"/zccp.unit.{uuid.uuid4().hex[:8]}"
    layout = SlotLayout.build(2, 64 * 1024, 8192, 8192)
    owner = Arena(name, layout)
    try:
        with pytest.raises(ArenaError, match="not the published arena"):
            Arena.attach(name, layout, owner.epoch)      # made, not yet published
        owner.publish("/tmp/unused.sock")
        with pytest.raises(ArenaError, match="not the published arena"):
            Arena.attach(name, layout, owner.epoch ^ 2)  # another engine's epoch
        with pytest.raises(ArenaError, match="bytes, expected"):
            Arena.attach(name, SlotLayout.build(3, 64 * 1024, 8192, 8192), owner.epoch)
        prep = Arena.attach(name, layout, owner.epoch)
        prep.slot(1).header.generation = 7               # one memory: the owner sees the write
        assert owner.slot(1).header.generation == 7
        prep.close()
        # the prep process's close leaves the arena published and its name in place
        again = Arena.attach(name, layout, owner.epoch)
        again.close()
    finally:
        owner.close()


def test_a_doorbell_adopts_only_a_unix_stream_socket() -> None:
    async def adopt(fd: int) -> None:
        await DoorbellServer("/nonexistent/doorbell.sock", lambda c, r: None, lambda c: None, lambda c: None).adopt(fd)

    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        with pytest.raises(ValueError, match="not a unix stream socket"):
            asyncio.run(adopt(udp.fileno()))
        assert udp.fileno() >= 0     # refused, not taken: the caller's socket is still open
    finally:
        udp.close()


def _metrics(rings: int, info_model: str = "m") -> EngineMetrics:
    m = EngineMetrics()
    m.info.set(1, backend="null", model=info_model, device="cpu")
    m.rings.inc(rings)
    m.requests.inc(rings, api="anthropic", status="200")
    m.latency.for_model(info_model)
    m.latency.ttft_s.observe(0.003, trace=(2**127 + 5, 9))
    m.latency.ttft_s.observe(0.3)
    return m


def test_one_page_sums_every_process() -> None:
    rank0, prep1, prep2 = _metrics(5), _metrics(7), _metrics(11)
    wire = [json.loads(json.dumps(state(p.registry))) for p in (prep1, prep2)]   # as the socket carries it
    page = merged(rank0.registry, wire)
    text = page.render()
    got = {(n, tuple(sorted(labels.items()))): v for n, labels, v in samples(text) if not n.endswith("_bucket")}
    assert got[("zccp_engine_rings_total", ())] == 23
    assert got[("zccp_engine_requests_total", (("api", "anthropic"), ("status", "200")))] == 23
    info = (("backend", "null"), ("device", "cpu"), ("model", "m"))
    assert got[("zccp_engine_info", info)] == 1       # the same in every process: not summed
    h = histograms(text, "gen_ai_server_time_to_first_token_seconds")
    (series,) = h.values()
    assert series["count"] == 6
    assert f"{2**127 + 5:032x}" in page.render(om=True)   # a prep process's exemplar kept (128-bit trace id)
    # rank 0's own registry is untouched by a page
    assert rank0.rings.get() == 5


@pytest.mark.parametrize("bad", [
    None, [], "x", {"zccp_engine_rings_total": "x"},
    {"zccp_engine_rings_total": [[[["a"]], 1]]},                      # a label that is not a pair
    {"zccp_engine_rings_total": [[[], float("nan")]]},
    {"zccp_engine_rings_total": [[[], True]]},
    {"zccp_engine_rings_total": [[[["k", "v" * 300]], 1]]},          # a label value past its bound
    {"gen_ai_server_time_to_first_token_seconds": [[[], [1, 2], 0.5, None]]},          # wrong bucket count
    {"gen_ai_server_time_to_first_token_seconds": [[[], [-1] * 19, 0.5, None]]},       # a negative count
    {"a_metric_rank0_does_not_define": [[[], 5]]},
])
def test_a_malformed_state_is_skipped(bad: object) -> None:
    rank0 = _metrics(5)
    text = merged(rank0.registry, [bad]).render()
    assert ("zccp_engine_rings_total", {}, 5.0) in samples(text)
    assert "a_metric_rank0_does_not_define" not in text


def test_an_own_doorbell_that_would_not_fit_a_socket_address_is_none() -> None:
    from zccp.process.group import own_doorbell

    short = "/run/zccp/doorbell.sock"
    assert own_doorbell(short, 3) == short + ".p3"
    longest = "/" + "d" * 102           # 103 bytes: ".p1" makes 106, the most sun_path holds with its NUL
    assert own_doorbell(longest + "dd", 1) is None and own_doorbell(longest, 1) == longest + ".p1"
