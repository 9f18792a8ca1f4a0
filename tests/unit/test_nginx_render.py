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
    names = ["zccp_http.conf", "zccp_server.conf"]
    assert capsys.readouterr().out.split() == [str(tmp_path / d / n) for d in "ab" for n in names]
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
