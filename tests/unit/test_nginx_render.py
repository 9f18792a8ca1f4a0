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
