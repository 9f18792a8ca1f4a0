"""config.yaml: unknown keys and bad values are refused by name, with the file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zccp.config import runtime
from zccp.config import ConfigError, load_config, mask_state_path, parse_config

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_config_loads():
    cfg = load_config(ROOT / "config.yaml")
    assert cfg.shared_memory.segment_count == 128
    assert cfg.shared_memory.segment_size_kb == 1024
    assert cfg.shared_memory.cleanup_interval_ms == 30000
    assert (cfg.cache.scope, cfg.cache.tenant_source, cfg.cache.tenant_header) == ("tenant", "api_key", None)
    assert cfg.cache.l1.enabled and cfg.cache.l1.size_mb == 64 and cfg.cache.l1.max_entries == 10000


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
        ({"cache": {"l1": {"size": 8}}}, "cache.l1.size: unknown key"),
        ({"cache": {"l1": {"ttl_s": 0}}}, "cache.l1.ttl_s: 0 is outside"),
        ({"cache": {"l1": {"max_entries": "many"}}}, "cache.l1.max_entries: expected an integer"),
        ({"cache": {"l1": {"enabled": "yes"}}}, "cache.l1.enabled: expected true or false"),
        ({"cache": {"l1": 64}}, "cache.l1: expected a mapping"),
        ({"server": {"metrics_allow": "127.0.0.1; deny all"}}, "server.metrics_allow: '127.0.0.1;' is not"),
        ({"server": {"metrics_allow": "localhost"}}, "server.metrics_allow: 'localhost' is not"),
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


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """python -m zccp.ops.cli from this checkout (not whatever zccp the interpreter has installed)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "engine"))
    out = subprocess.run([sys.executable, "-c",
                          "import sys, zccp, zccp.ops.cli; print(zccp.__file__, file=sys.stderr); "
                          "sys.argv[0] = 'zccp'; zccp.ops.cli.main()", *args], capture_output=True, text=True, env=env)
    assert out.stderr.splitlines()[0] == str(ROOT / "engine" / "zccp" / "__init__.py"), out.stderr
    return out


def test_engine_cli_refuses_a_bad_config(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("server:\n  prot: 1\n")
    out = _cli("engine", "--config", str(p))
    assert out.returncode == 2
    assert "server.prot: unknown key" in out.stderr and str(p) in out.stderr


def test_yaml_booleans_are_accepted_where_a_switch_is_meant(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("gpu:\n  enabled: on\n")            # YAML 1.1 reads a bare `on` as true
    assert load_config(p).gpu.enabled == "on"
    p.write_text("gpu:\n  enabled: off\n")
    assert load_config(p).gpu.enabled == "off"
    p.write_text("gpu:\n  enabled: 'auto'\n")
    assert load_config(p).gpu.enabled == "auto"
    with pytest.raises(ConfigError, match="model.backend: True is not one of"):
        parse_config({"model": {"backend": True}}, "my.yaml")   # not a switch: refused by name


@pytest.mark.parametrize("raw,key", [
    ({"shared_memory": {"tokens_kb": 1000}}, "shared_memory.tokens_kb"),
    ({"shared_memory": {"response_kb": 1000}}, "shared_memory.response_kb"),
    ({"shared_memory": {"tokens_kb": 700, "response_kb": 400}}, "shared_memory.tokens_kb"),
    ({"shared_memory": {"segment_size_kb": 256}}, "shared_memory.segment_size_kb"),
])
def test_a_slot_too_small_blames_the_key_that_was_set(raw, key):
    with pytest.raises(ConfigError) as exc:
        parse_config(raw, "my.yaml")
    assert str(exc.value).startswith(f"my.yaml: {key}: ")
    assert "no room for a payload" in str(exc.value)


def test_check_refuses_what_this_host_lacks(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(f"logging:\n  file: {tmp_path}/missing/engine.log\n")
    out = _cli("engine", "--config", str(p), "--check")
    assert out.returncode == 2
    assert f"logging.file: directory {tmp_path}/missing does not exist" in out.stderr
    p.write_text("shared_memory:\n  group: no-such-group-zccp\n")
    out = _cli("engine", "--config", str(p), "--check")
    assert out.returncode == 2 and "shared_memory.group: no group 'no-such-group-zccp'" in out.stderr
    p.write_text(f"logging:\n  file: {tmp_path}/engine.log\n")
    out = _cli("engine", "--config", str(p), "--check", "--run-dir", str(tmp_path / "run"))
    assert out.returncode == 0, out.stderr


def test_socket_and_last_good_file_come_from_the_run_directory(tmp_path):
    cfg = parse_config({}, str(tmp_path / "config.yaml"))
    a, b = runtime.resolve(cfg, tmp_path / "a" / ".run"), runtime.resolve(cfg, tmp_path / "b" / ".run")
    assert a.server.socket_path != b.server.socket_path       # two checkouts never share them
    assert mask_state_path(a) != mask_state_path(b)
    assert mask_state_path(a).parent == Path(a.server.socket_path).parent
    if os.geteuid() != 0:
        assert a.server.socket_path == str(tmp_path / "a" / ".run" / "doorbell.sock")
    explicit = runtime.resolve(parse_config({"server": {"socket_path": "/run/x/d.sock"}}), tmp_path)
    assert explicit.server.socket_path == "/run/x/d.sock"


@pytest.mark.skipif(os.geteuid() != 0, reason="nginx drops to another user only when started as root")
def test_as_root_the_workers_user_and_group_are_derived(tmp_path):
    import grp
    import pwd

    cfg = runtime.resolve(parse_config({}, "c.yaml"), tmp_path)
    user = runtime.worker_user(cfg)
    assert user in runtime.DEFAULT_WORKER_USERS
    assert cfg.shared_memory.group == grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name
    # A run directory the workers cannot enter: the socket moves to /run/zccp/<digest>/.
    private = tmp_path / "private"
    (private / "run").mkdir(parents=True)
    private.chmod(0o700)
    moved = runtime.resolve(parse_config({}, "c.yaml"), private / "run")
    assert moved.server.socket_path.startswith(str(runtime.ROOT_SOCKET_BASE) + "/")
    assert runtime.can_traverse(user, cfg.shared_memory.group, Path(moved.server.socket_path).parent.parent)


def _pem(path: Path, kind: str) -> str:
    path.write_text(f"-----BEGIN {kind}-----\nAAAA\n-----END {kind}-----\n")
    return str(path)


def test_tls_and_http2_are_checked_by_name(tmp_path):
    from zccp.config import check_tls_files

    cert, key = _pem(tmp_path / "c.pem", "CERTIFICATE"), _pem(tmp_path / "k.pem", "PRIVATE KEY")
    cfg = parse_config({"server": {"tls": {"certificate": cert, "key": key}}}, "c.yaml")
    assert cfg.server.speaks_http2 and cfg.server.tls is not None and cfg.server.tls.key == key
    check_tls_files(cfg)
    assert not parse_config({"server": {"tls": {"certificate": cert, "key": key}, "http2": False}}).server.speaks_http2
    assert not parse_config({}).server.speaks_http2
    with pytest.raises(ConfigError, match="server.http2: true needs server.tls"):
        parse_config({"server": {"http2": True}})
    with pytest.raises(ConfigError, match="server.tls.key: required"):
        parse_config({"server": {"tls": {"certificate": cert}}})
    for bad, needle in [
        ({"certificate": "rel/c.pem", "key": key}, "server.tls.certificate: rel/c.pem: must be an absolute path"),
        ({"certificate": cert, "key": str(tmp_path / "none.pem")}, "server.tls.key: .*none.pem: cannot read"),
        ({"certificate": cert, "key": str(tmp_path)}, "server.tls.key: .*cannot read|not a regular file"),
        ({"certificate": key, "key": key}, "server.tls.certificate: .*not a PEM file holding a certificate"),
        ({"certificate": cert, "key": cert}, "server.tls.key: .*not a PEM file holding a private key"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            check_tls_files(parse_config({"server": {"tls": bad}}, "c.yaml"))


def test_an_empty_usage_log_turns_it_off_and_other_strings_stay_non_empty(tmp_path):
    """auth.usage_log: "" is documented as no usage log (nginx writes no line); elsewhere an
    empty string is still refused, and the default puts the log beside the doorbell."""
    off = runtime.resolve(parse_config({"auth": {"usage_log": ""}}), tmp_path)
    assert off.auth.usage_log == ""
    assert runtime.resolve(parse_config({}), tmp_path).auth.usage_log.endswith("usage.jsonl")
    with pytest.raises(ConfigError, match="auth.keys_file: expected a non-empty string"):
        parse_config({"auth": {"keys_file": ""}})
