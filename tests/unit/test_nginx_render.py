"""`zccp-nginx render` (the documented form) and the bare `zccp-nginx` (its alias) write
the same includes; only --standalone adds a complete nginx.conf."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from zccp.ops.cli import nginx_main


def test_render_and_its_alias_write_the_same_includes(tmp_path: Path, capsys) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"server": {"socket_path": str(tmp_path / "run" / "doorbell.sock")},
                                   "shared_memory": {"group": "www-data"}}))
    nginx_main(["render", "--config", str(cfg), "--out", str(tmp_path / "a")])
    nginx_main(["--config", str(cfg), "--out", str(tmp_path / "b")])
    names = ["zccp_admin.conf", "zccp_http.conf", "zccp_server.conf"]
    printed = ["zccp_http.conf", "zccp_server.conf", "zccp_admin.conf"]
    assert capsys.readouterr().out.split() == [str(tmp_path / d / n) for d in "ab" for n in printed]
    for d in "ab":
        assert sorted(p.name for p in (tmp_path / d).iterdir()) == names
    for n in names:
        assert (tmp_path / "a" / n).read_text() == (tmp_path / "b" / n).read_text()
    http = (tmp_path / "a" / "zccp_http.conf").read_text()
    assert not re.search(r"\{\{\w+\}\}", http) and f'socket_path = "{tmp_path / "run" / "doorbell.sock"}"' in http
    # load_module belongs to the main context (Debian's modules-enabled has it): never here
    assert not [ln for ln in http.splitlines() if ln.strip().startswith("load_module")]

    nginx_main(["render", "--config", str(cfg), "--out", str(tmp_path / "c"), "--standalone",
                "--prefix", str(tmp_path / "p")])
    assert (tmp_path / "c" / "nginx.conf").is_file()


def test_tls_and_http2_reach_the_standalone_listen_line(tmp_path: Path) -> None:
    import subprocess

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "1", "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    server = {"socket_path": str(tmp_path / "run" / "doorbell.sock"), "listen": "127.0.0.1:18443"}
    for extra, listen in [({}, "listen 127.0.0.1:18443;"),
                          ({"tls": {"certificate": str(cert), "key": str(key)}}, "listen 127.0.0.1:18443 ssl http2;"),
                          ({"tls": {"certificate": str(cert), "key": str(key)}, "http2": False},
                           "listen 127.0.0.1:18443 ssl;")]:
        cfg = tmp_path / "config.yaml"
        cfg.write_text(yaml.safe_dump({"server": {**server, **extra}}))
        out = tmp_path / f"out{len(listen)}"
        nginx_main(["render", "--config", str(cfg), "--out", str(out), "--standalone", "--prefix", str(out)])
        conf = (out / "nginx.conf").read_text()
        assert listen in conf
        assert (f'ssl_certificate_key "{key}";' in conf) == ("tls" in extra)
        # the includes never carry TLS: an existing nginx's own server block does
        assert "ssl" not in (out / "zccp_server.conf").read_text()


def test_the_standalone_access_log_is_buffered_as_logging_access_flush_ms_says(tmp_path: Path) -> None:
    server = {"socket_path": str(tmp_path / "run" / "doorbell.sock")}
    for logging, line in [({}, "zccp_json buffer=64k flush=1000ms;"),   # the default
                          ({"access_flush_ms": 250}, "zccp_json buffer=64k flush=250ms;"),
                          ({"access_flush_ms": 0}, "nginx-access.log zccp_json;")]:
        cfg = tmp_path / "config.yaml"
        cfg.write_text(yaml.safe_dump({"server": server, "logging": logging}))
        out = tmp_path / f"out{len(line)}"
        nginx_main(["render", "--config", str(cfg), "--out", str(out), "--standalone", "--prefix", str(out)])
        (access,) = [ln for ln in (out / "nginx.conf").read_text().splitlines() if ln.strip().startswith("access_log")]
        assert access.endswith(line), access


def test_a_redis_host_name_for_keys_gets_a_resolver_from_resolv_conf(tmp_path: Path) -> None:
    # A Lua cosocket resolves names only through nginx's `resolver`: without one, keys on with
    # auth.redis_url redis://redis:6379 (compose) fail closed on every request.
    import pytest

    from zccp.config import load_config
    from zccp.ops.nginx_conf import resolver_line

    resolv = tmp_path / "resolv.conf"
    resolv.write_text("# docker\nsearch local\nnameserver 127.0.0.11\nnameserver fe80::1%eth0\noptions ndots:0\n")

    def cfg(url: str, mode: str = "keys"):
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump({"auth": {"mode": mode, "redis_url": url}}))
        return load_config(path)

    line = resolver_line(cfg("redis://redis:6379/0"), resolv)
    assert line.startswith("resolver 127.0.0.11 [fe80::1] valid=10s ipv6=off;"), line
    assert resolver_line(cfg("redis+cluster://node-a:7000,node-b:7001"), resolv).startswith("resolver 127.0.0.11 ")
    for url in ("redis://127.0.0.1:6379/0", "redis://[::1]:6379/0", "unix:///run/redis.sock"):
        assert resolver_line(cfg(url), resolv).startswith("#"), url
    assert resolver_line(cfg("redis://redis:6379/0", mode="off"), resolv).startswith("#")
    resolv.write_text("search local\n")
    with pytest.raises(ValueError, match="lists no nameserver"):
        resolver_line(cfg("redis://redis:6379/0"), resolv)
