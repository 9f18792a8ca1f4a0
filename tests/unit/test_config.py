"""config.yaml: unknown keys and bad values are refused by name, with the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from zccp.config import ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_config_loads():
    cfg = load_config(ROOT / "config.yaml")
    assert cfg.shared_memory.segment_count == 128
    assert cfg.shared_memory.segment_size_kb == 1024
    assert cfg.shared_memory.cleanup_interval_ms == 30000
    assert (cfg.cache.scope, cfg.cache.tenant_source, cfg.cache.tenant_header) == ("tenant", "api_key", None)


@pytest.mark.parametrize(
    "raw,needle",
    [
        ({"bogus": {}}, "bogus: unknown section"),
        ({"server": {"listn": "x"}}, "server.listn: unknown key"),
        ({"server": {"workers": "2"}}, "server.workers: expected an integer"),
        ({"server": {"workers": 0}}, "server.workers: 0 is outside"),
        ({"cache": {"enabled": "yes"}}, "cache.enabled: expected true or false"),
        ({"cache": {"similarity_threshold": 2}}, "cache.similarity_threshold"),
        ({"gpu": {"enabled": "maybe"}}, "gpu.enabled: 'maybe' is not one of"),
        ({"model": {"backend": None}}, "write 'null' in quotes"),
        ({"shared_memory": {"segment_size_kb": 1023}}, "not a multiple of 4"),
        ({"shared_memory": {"segment_size_kb": 256}}, "no room for a payload"),
        ({"limits": {"max_body_kb": 900}}, "exceeds the slot payload"),
        ({"shared_memory": {"name": "no-slash"}}, "shared_memory.name"),
        ({"server": {"socket_path": "/" + "x" * 120}}, "server.socket_path"),
        ({"model": {"d_model": 100, "n_heads": 3}}, "model.d_model"),
        ({"cache": {"scope": "per_user"}}, "cache.scope: 'per_user' is not one of"),
        ({"cache": {"tenant_source": "cookie"}}, "cache.tenant_source: 'cookie' is not one of"),
        ({"cache": {"tenant_source": "header"}}, "cache.tenant_header: required"),
        ({"cache": {"tenant_header": "X-Team"}}, "cache.tenant_header: set, but cache.tenant_source is 'api_key'"),
        ({"cache": {"tenant_source": "header", "tenant_header": "X Team"}}, "cache.tenant_header: 'X Team' is not"),
        ([1, 2], "top level must be a mapping"),
    ],
)
def test_bad_values_are_named(raw, needle):
    with pytest.raises(ConfigError) as exc:
        parse_config(raw, "my.yaml")
    assert needle in str(exc.value)
    assert str(exc.value).startswith("my.yaml:")


def test_missing_and_unparsable_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("server: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_engine_cli_refuses_a_bad_config(tmp_path):
    import subprocess
    import sys

    p = tmp_path / "c.yaml"
    p.write_text("server:\n  prot: 1\n")
    out = subprocess.run([sys.executable, "-m", "zccp.cli", "engine", "--config", str(p)], capture_output=True, text=True)
    assert out.returncode == 2
    assert "server.prot: unknown key" in out.stderr and str(p) in out.stderr
