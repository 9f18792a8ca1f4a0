"""config.yaml's engines: and routing: (docs/engines.md): each entry an overlay of the top-level
model / shared_memory / gpu, refused with the key named when it cannot work; what one engine
process runs with (for_engine, zccp-engine --engine); its derived doorbell; nginx's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from zccp.config import ConfigError, for_engine, model_names, parse_config
from zccp.ops.cli import _one_engine
from zccp.ops.nginx_conf import render
from zccp.config.runtime import resolve

TWO = {
    "model": {"backend": "null", "name": "base", "max_context": 2048},
    "shared_memory": {"name": "/zccp.t", "segment_count": 16},
    "engines": [
        {"name": "a", "model": {"name": "m1"}},
        {"name": "b", "model": {"name": "m1"}, "shared_memory": {"segment_count": 4}, "gpu": {"enabled": "off"}},
        {"name": "c", "model": {"name": "m2", "backend": "tiny"}, "shared_memory": {"name": "/zccp.other"}},
    ],
}


def parse(raw: dict[str, Any]):
    return parse_config(raw, "config.yaml")


def test_without_engines_one_engine_as_before() -> None:
    cfg = parse({"model": {"name": "solo"}})
    assert cfg.engines == () and model_names(cfg) == ["solo"]
    assert _one_engine(cfg, None) is cfg
    assert cfg.routing.policy == "affinity" and cfg.routing.spill_load == 0.75


def test_entries_overlay_the_top_level_sections() -> None:
    cfg = parse(TWO)
    a, b, c = cfg.engines
    assert (a.model.name, a.model.backend, a.model.max_context) == ("m1", "null", 2048)
    assert (c.model.name, c.model.backend) == ("m2", "tiny")
    assert (a.shared_memory.name, a.shared_memory.segment_count) == ("/zccp.t.a", 16)
    assert (b.shared_memory.name, b.shared_memory.segment_count) == ("/zccp.t.b", 4)
    assert c.shared_memory.name == "/zccp.other"
    assert b.gpu.enabled == "off" and a.gpu.enabled == "auto"
    assert model_names(cfg) == ["m1", "m2"]
    one = for_engine(cfg, "b")
    assert one.model == b.model and one.shared_memory == b.shared_memory and one.engines == cfg.engines


@pytest.mark.parametrize("engines, message", [
    ([], "engines: expected a non-empty list"),
    ([{"name": "A"}], "engines[0].name"),
    ([{"name": "a"}, {"name": "a"}], "listed twice"),
    ([{"name": "a", "port": 1}], "engines[0].port: unknown key"),
    ([{"name": "a", "model": {"nme": "x"}}], "engines.a.model.nme: unknown key"),
    ([{"name": "a", "shared_memory": {"name": "/x"}}, {"name": "b", "shared_memory": {"name": "/x"}}],
     "engines.b.shared_memory.name"),
    ([{"name": "a", "shared_memory": {"segment_size_kb": 64}}], "engines.a: shared_memory.segment_size_kb"),
    ([{"name": "a", "model": {"backend": "hf"}}], "model.path: required"),
])
def test_an_entry_that_cannot_work_is_refused_by_name(engines: list, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse({"engines": engines})
    assert message in str(e.value)


def test_an_unknown_routing_policy_is_refused() -> None:
    with pytest.raises(ConfigError, match="routing.policy"):
        parse({"routing": {"policy": "random"}})


def test_the_engine_process_must_name_its_entry(tmp_path: Path) -> None:
    cfg = parse(TWO)
    with pytest.raises(ConfigError, match="--engine"):
        _one_engine(cfg, None)
    with pytest.raises(ConfigError, match="no engine named 'z'"):
        _one_engine(cfg, "z")
    assert _one_engine(cfg, "c").model.backend == "tiny"


def test_each_engine_gets_a_doorbell_beside_the_stacks(tmp_path: Path) -> None:
    cfg = resolve(parse({**TWO, "server": {"socket_path": str(tmp_path / "s" / "doorbell.sock")}}), tmp_path)
    assert [e.socket_path for e in cfg.engines] == [str(tmp_path / "s" / f"doorbell-{n}.sock") for n in "abc"]
    assert for_engine(cfg, "b").server.socket_path == str(tmp_path / "s" / "doorbell-b.sock")


def test_nginx_gets_the_engine_list_and_every_models_location(tmp_path: Path) -> None:
    cfg = resolve(parse({**TWO, "server": {"socket_path": str(tmp_path / "doorbell.sock")},
                         "routing": {"policy": "round_robin", "spill_load": 0.5}}), tmp_path)
    out = render(cfg, tmp_path / "out")
    http = out.http_conf.read_text()
    assert (f'{{ name = "b", model = "m1", shm_name = "/zccp.t.b", socket_path = "{tmp_path}/doorbell-b.sock" }}'
            in http)
    assert 'routing = { policy = "round_robin", spill_load = 0.5 }' in http
    assert "/v1/models/m1 1; /v1/models/m2 1;" in http
    server = out.server_conf.read_text()
    assert "location = /v1/models/m1 {" in server and "location = /v1/models/m2 {" in server
    solo = render(resolve(parse({"server": {"socket_path": str(tmp_path / "doorbell.sock")}}), tmp_path),
                  tmp_path / "solo")
    assert "engines = nil," in solo.http_conf.read_text()


def test_the_shipped_config_still_loads(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    raw = yaml.safe_load((root / "config.yaml").read_text())
    assert parse(raw).engines == ()


def test_an_engine_entry_may_forward_to_its_own_upstream(tmp_path) -> None:
    import yaml

    from zccp.config import ConfigError, for_engine, load_config

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "upstream": {"api": "anthropic", "read_timeout_ms": 9000},
        "engines": [{"name": "local", "model": {"backend": "null", "name": "m-local"}},
                    {"name": "up", "model": {"backend": "upstream", "name": "m-up"},
                     "upstream": {"urls": ["http://10.0.0.5:8000/v1"]}}]}))
    cfg = for_engine(load_config(path), "up")
    assert cfg.model.backend == "upstream" and cfg.upstream.urls == ("http://10.0.0.5:8000/v1",)
    assert cfg.upstream.api == "anthropic" and cfg.upstream.read_timeout_ms == 9000   # the top level's, overlaid
    path.write_text(yaml.safe_dump({"engines": [{"name": "up", "model": {"backend": "upstream"}}]}))
    import pytest

    with pytest.raises(ConfigError, match="engines.up.upstream.urls: required"):
        load_config(path)
