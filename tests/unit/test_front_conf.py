"""The front tier's config (engine/zccp/ops/front_conf.py) and its rendered nginx.conf."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from zccp.config import ConfigError
from zccp.ops.front_conf import FrontConfig, parse_front, render_front, resolver_address


def front(**kw) -> FrontConfig:
    return parse_front({"front": {"hosts": "zccp-hosts.ns.svc.cluster.local", **kw}}, "front.yaml")


def test_defaults_and_strictness() -> None:
    f = front()
    assert (f.port, f.resolve_interval_s, f.tries, f.down_s) == (8080, 5.0, 3, 10.0)
    with pytest.raises(ConfigError, match="front.prot: unknown key"):
        front(prot=1)
    with pytest.raises(ConfigError, match="front.hosts: required"):
        parse_front({"front": {}}, "front.yaml")
    with pytest.raises(ConfigError, match="exactly one section"):
        parse_front({"front": {"hosts": "x"}, "server": {}}, "front.yaml")
    with pytest.raises(ConfigError, match="not a DNS name"):
        front(hosts="zccp-hosts.ns.svc.cluster.local.")
    with pytest.raises(ConfigError, match=r"outside \[0.2, 3600\]"):
        front(resolve_interval_s=0)


def test_resolver_from_the_config_or_resolv_conf(tmp_path: Path) -> None:
    assert resolver_address(front(resolver="10.96.0.10")) == ("10.96.0.10", 53)
    assert resolver_address(front(resolver="127.0.0.1:5353")) == ("127.0.0.1", 5353)
    for bad in ("dns.local", "10.0.0.1:0", "::1"):
        with pytest.raises(ConfigError, match="front.resolver"):
            front(resolver=bad)
    rc = tmp_path / "resolv.conf"
    rc.write_text("search ns.svc.cluster.local svc.cluster.local\nnameserver fd00::a\nnameserver 10.96.0.10\n"
                  "options ndots:5\n")
    assert resolver_address(front(), resolv_conf=rc) == ("10.96.0.10", 53)
    rc.write_text("nameserver fd00::a\n")
    with pytest.raises(ConfigError, match="no IPv4 nameserver"):
        resolver_address(front(), resolv_conf=rc)


def test_rendered_conf_streams_keeps_alive_retries_and_passes_nginx_t(tmp_path: Path) -> None:
    conf = render_front(front(resolver="127.0.0.1:5353", listen="127.0.0.1:18099", max_body_kb=300), tmp_path / "f")
    text = conf.read_text()
    assert "{{" not in text
    upstream = text[text.index("upstream zccp_hosts"):]
    # the keepalive module must wrap the Lua balancer: its directive comes after
    assert upstream.index("balancer_by_lua_block") < upstream.index("keepalive 64;")
    for line in ("proxy_buffering off;", "proxy_http_version 1.1;", 'proxy_set_header Connection "";',
                 "client_max_body_size 307200;", "client_body_buffer_size 307200;",
                 "proxy_next_upstream error timeout http_502 http_503 http_504 non_idempotent;",
                 "proxy_next_upstream_tries 3;", 'resolver = "127.0.0.1"', "resolver_port = 5353"):
        assert line in text, line
    exe = shutil.which("nginx") or "/usr/sbin/nginx"
    r = subprocess.run([exe, "-t", "-q", "-e", "stderr", "-p", str(conf.parent), "-c", str(conf)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_unsafe_values_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="front.listen"):
        render_front(front(resolver="127.0.0.1", listen='0.0.0.0:80; include "/etc/x"'), tmp_path / "f")


def test_the_cli_renders_the_front_and_still_needs_config_otherwise(tmp_path: Path, capsys) -> None:
    from zccp.ops.cli import nginx_main

    f = tmp_path / "front.yaml"
    f.write_text("front:\n  hosts: zccp-hosts.ns.svc.cluster.local\n  resolver: 10.96.0.10\n")
    nginx_main(["render", "--front", str(f), "--out", str(tmp_path / "out")])
    assert capsys.readouterr().out.strip() == str((tmp_path / "out" / "nginx.conf").resolve())
    assert 'name = "zccp-hosts.ns.svc.cluster.local"' in (tmp_path / "out" / "nginx.conf").read_text()
    f.write_text("front:\n  hosts: zccp-hosts.ns.svc.cluster.local\n  resolver: nameserver\n")
    with pytest.raises(SystemExit) as e:
        nginx_main(["render", "--front", str(f), "--out", str(tmp_path / "out2")])
    assert e.value.code == 2 and "front.resolver" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        nginx_main(["render", "--out", str(tmp_path / "out3")])
    assert e.value.code == 2 and "--config is required" in capsys.readouterr().err
