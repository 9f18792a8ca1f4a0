"""`zccp-nginx vendor-lua` (zccp.ops.lua_vendor): Debian's lua-resty-redis, its connector and
lua-resty-dns unpacked from their real .debs (apt-get download, dpkg-deb -x) into ZCCP's
lua-vendor/, and a real nginx that loads them from there through the lua_package_path that
`zccp-nginx render` writes: its searchpath names the vendored files, not a system copy (this
host may also have Debian's packages installed), and zccp.lib.redis talks to a real Redis
through them. Without the directory, render says so."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from tests.support.fp_nginx import MODULES, NGINX, require_nginx_lua
from tests.support.harness import Stack, free_port
from zccp.ops.stack import redis_service

REPO = Path(__file__).resolve().parents[2]
CHECK = """
content_by_lua_block {
    for _, m in ipairs({ "nginx.redis", "nginx.redis.connector", "nginx.redis.sentinel", "nginx.dns.resolver" }) do
        ngx.say(m, " ", package.searchpath(m, package.path) or "not found")
    end
    ngx.say("loaded ", debug.getinfo(require("nginx.redis").new, "S").source)
    local t = require("zccp.lib.redis").target({ host = "127.0.0.1", port = REDIS_PORT, db = 0, timeout_ms = 1000 })
    local ok, err = t:call("SET", "zccp-vendor-test", "through the vendored client")
    ngx.say("set ", tostring(ok), " ", tostring(err))
    ngx.say("get ", tostring((t:call("GET", "zccp-vendor-test"))))
}
"""


def _cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zccp.ops.cli", "nginx", *args], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO / "engine"), ZCCP_HOME=str(home)))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A data root of its own (ZCCP_HOME), as `pip install` makes one: lua/, nginx/, shm_abi/."""
    h = tmp_path / "share-zccp"
    for d in ("lua", "nginx"):
        shutil.copytree(REPO / d, h / d)
    (h / "shm_abi").mkdir()
    shutil.copy(REPO / "shm_abi" / "zccp_abi.h", h / "shm_abi")
    return h


def _nginx(prefix: Path, package_path: str, port: int, redis_port: int) -> subprocess.Popen[bytes]:
    require_nginx_lua()
    (prefix / "logs").mkdir(parents=True)
    user = "user root;\n" if os.geteuid() == 0 else ""
    conf = prefix / "nginx.conf"
    conf.write_text(f"""{user}worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log notice;
load_module {MODULES[0]};
load_module {MODULES[1]};
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    lua_package_path "{package_path}";
    server {{
        listen 127.0.0.1:{port};
        location = /which {{ {CHECK.replace("REDIS_PORT", str(redis_port))} }}
    }}
}}
""")
    return subprocess.Popen([NGINX, "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def test_render_loads_debians_libraries_from_the_vendored_directory(tmp_path: Path, home: Path) -> None:
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        pytest.skip("not a Debian host (apt-get, dpkg-deb)")
    r = _cli("vendor-lua", home=home)
    assert r.returncode == 0, r.stderr
    vendor = home / "lua-vendor"
    assert r.stdout.splitlines()[-1] == str(vendor)
    assert "lua-nginx-redis 0.27" in r.stdout and "nginx/redis/connector.lua" in r.stdout, r.stdout
    assert sorted(p.name for p in (vendor / "copyright").iterdir()) == [
        "lua-nginx-dns", "lua-nginx-redis", "lua-nginx-redis-connector"]
    check = _cli("vendor-lua", "--check", home=home)
    assert check.returncode == 0, check.stdout + check.stderr
    # a manifest that lags apt's candidate is reported, exit 1
    manifest = vendor / "packages.txt"
    manifest.write_text(manifest.read_text().replace("lua-nginx-dns 0.20-1", "lua-nginx-dns 0.19-1"))
    stale = _cli("vendor-lua", "--check", home=home)
    assert stale.returncode == 1 and "lua-nginx-dns: 0.19-1" in stale.stdout, stale.stdout

    cfg = Stack(tmp_path / "cfg")
    r = _cli("render", "--config", str(cfg.config_path), "--out", str(tmp_path / "out"), home=home)
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr, r.stderr
    http_conf = (tmp_path / "out" / "zccp_http.conf").read_text()
    m = re.search(r'^lua_package_path "([^"]*)";$', http_conf, re.M)
    assert m and m.group(1) == f"{home}/lua/?.lua;{vendor}/?.lua;;", http_conf[:600]

    redis_port, port = free_port(), free_port()
    redis = redis_service(f"redis://127.0.0.1:{redis_port}/0", tmp_path / "redis-run")
    proc = _nginx(tmp_path / "ngx", m.group(1), port, redis_port)
    try:
        body = ""
        end = time.monotonic() + 15
        while time.monotonic() < end and not body:
            assert proc.poll() is None, (tmp_path / "ngx" / "logs" / "error.log").read_text()
            try:
                body = httpx.get(f"http://127.0.0.1:{port}/which", timeout=5).text
            except httpx.HTTPError:
                time.sleep(0.1)
        lines = dict(line.split(" ", 1) for line in body.splitlines())
        assert lines["nginx.redis"] == f"{vendor}/nginx/redis.lua", body
        assert lines["nginx.redis.connector"] == f"{vendor}/nginx/redis/connector.lua", body
        assert lines["nginx.redis.sentinel"] == f"{vendor}/nginx/redis/sentinel.lua", body
        assert lines["nginx.dns.resolver"] == f"{vendor}/nginx/dns/resolver.lua", body
        assert lines["loaded"] == f"@{vendor}/nginx/redis.lua", body
        assert lines["set"] == "OK nil" and lines["get"] == "through the vendored client", body
    finally:
        os.killpg(proc.pid, signal.SIGQUIT)
        proc.wait(15)
        redis.stop()

    # without the directory, render still writes the files and says what nginx will lack
    shutil.rmtree(vendor)
    r = _cli("render", "--config", str(cfg.config_path), "--out", str(tmp_path / "out2"), home=home)
    assert r.returncode == 0 and "no vendored lua-resty-redis" in r.stderr, r.stderr
