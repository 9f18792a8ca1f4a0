"""zccp-nginx check-site on an `nginx -T` output: the operator's locations ZCCP's exact
paths would shadow, by file and line (the includes' paths from a real config)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from zccp.ops.nginx_dump import parse_dump
from zccp.ops.site_check import check_site

REPO = Path(__file__).resolve().parents[2]
PATHS = ["/v1/messages", "/v1/chat/completions", "/v1/models", "/zccp/health"]

DUMP = """\
# configuration file /etc/nginx/nginx.conf:
user www-data;
events {
    worker_connections 768;
}
http {
    client_max_body_size 1m;
    include /etc/nginx/conf.d/*.conf;
    include /etc/nginx/sites-enabled/*;
}

# configuration file /etc/nginx/conf.d/limits.conf:
limit_req_zone $binary_remote_addr zone=site:10m rate=10r/s;
map $http_upgrade $conn { default upgrade; '' close; }

# configuration file /etc/nginx/sites-enabled/example:
server {
    listen 443 ssl http2 default_server;
    server_name example.com;
    limit_req zone=site burst=20;
    add_header Strict-Transport-Security "max-age=63072000" always;
    location / {
        proxy_pass http://127.0.0.1:3000;
    }
    location /static/ {
        alias /srv/static/;
    }
    location = /v1/models { return 200 "theirs"; }
    location ~ ^/v1/chat/ {
        content_by_lua_block { ngx.say("{ not a } nginx block") }
    }
}
server {
    listen 8081;
    server_name other.example;
    location /static/ { root /srv; }
}
"""


def test_shadowed_locations_are_named_with_file_and_line():
    found, notes = check_site(DUMP, PATHS)
    by_where = {s.location.where(): s for s in found}
    assert set(by_where) == {"/etc/nginx/sites-enabled/example:6", "/etc/nginx/sites-enabled/example:12",
                             "/etc/nginx/sites-enabled/example:13"}
    root = by_where["/etc/nginx/sites-enabled/example:6"]     # the backend behind location /
    assert root.paths == tuple(PATHS) and not root.duplicate
    assert by_where["/etc/nginx/sites-enabled/example:12"].duplicate            # = /v1/models: nginx -t fails
    assert by_where["/etc/nginx/sites-enabled/example:13"].paths == ("/v1/chat/completions",)   # the regex
    assert "example.com" in root.line() and "/zccp/health" in root.line()
    # the other server has nothing on ZCCP's paths; --server picks one server
    assert check_site(DUMP, PATHS, server="other.example")[0] == []
    # what ZCCP's locations inherit or override, said
    assert any("limit_req zone=site burst=20" in n and "API-shaped" in n for n in notes)
    assert any("http-level client_max_body_size 1m" in n for n in notes)


def test_includes_and_lua_blocks_are_read_in_place():
    tree = parse_dump(DUMP)
    http = next(d for d in tree if d.name == "http")
    assert [d.name for d in http.children or []][:3] == ["client_max_body_size", "limit_req_zone", "map"]
    assert len(http.blocks("server")) == 2


def test_check_site_command_exits_1_on_a_collision(tmp_path):
    dump = tmp_path / "nginx-T.txt"
    dump.write_text(DUMP)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"server:\n  socket_path: {tmp_path}/s/doorbell.sock\n")
    env = dict(os.environ, PYTHONPATH=str(REPO / "engine"))
    r = subprocess.run([sys.executable, "-m", "zccp.ops.cli", "nginx", "check-site", "--config", str(cfg),
                        "--run-dir", str(tmp_path / "run"), "--dump", str(dump)],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "/etc/nginx/sites-enabled/example:6: location / " in r.stdout
    ok = subprocess.run([sys.executable, "-m", "zccp.ops.cli", "nginx", "check-site", "--config", str(cfg),
                         "--run-dir", str(tmp_path / "run"), "--dump", str(dump), "--server", "other.example"],
                        capture_output=True, text=True, timeout=60, env=env)
    assert ok.returncode == 0 and "no location of this nginx is shadowed" in ok.stdout, ok.stdout + ok.stderr
