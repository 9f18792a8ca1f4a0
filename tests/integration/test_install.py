"""`pip install .` then `zccp-stack up` from a directory outside the checkout: the
installed package finds its Lua modules, nginx templates and ABI header under
<prefix>/share/zccp (zccp.config.paths), not in the checkout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import httpx
from tests.support.harness import Stack, anthropic_body

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "engine", "lua", "nginx", "shm_abi")


def _copy_sources(dst: Path) -> None:
    files = subprocess.run(["git", "ls-files", "--", *SOURCES], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    for f in files:
        (dst / f).parent.mkdir(parents=True, exist_ok=True)
        (dst / f).write_bytes((REPO / f).read_bytes())


def test_installed_package_runs_the_stack_from_anywhere(tmp_path):
    src, prefix, elsewhere = tmp_path / "src", tmp_path / "prefix", tmp_path / "elsewhere"
    _copy_sources(src)
    # --ignore-installed: never touch the environment running the tests (its editable zccp)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--ignore-installed",
                    "--prefix", str(prefix), str(src)], check=True, capture_output=True)
    site = prefix / Path(sysconfig.get_path("purelib")).relative_to(sysconfig.get_path("data"))
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("ZCCP_HOME", None)
    elsewhere.mkdir()

    where = subprocess.run([sys.executable, "-c", "import zccp, zccp.config.paths; print(zccp.__file__); "
                            "print(zccp.config.paths.data_root())"], cwd=elsewhere, env=env, capture_output=True,
                           text=True, check=True).stdout.split()
    assert where == [str(site / "zccp" / "__init__.py"), str(prefix / "share" / "zccp")]
    # every Lua module of the checkout is installed (a room missing from pyproject's
    # data-files would fail only when nginx requires it), the engine's word list beside its reader
    lua_src, lua_dst = src / "lua", prefix / "share" / "zccp" / "lua"
    shipped = {p.relative_to(lua_src) for p in lua_src.rglob("*.lua")}
    installed = {p.relative_to(lua_dst) for p in lua_dst.rglob("*.lua")}
    assert shipped and shipped <= installed, sorted(map(str, shipped - installed))
    assert (site / "zccp" / "cache" / "near_words.lua").is_file()
    # Debian's Lua clients beside the installed package, as docs/existing-nginx.md's step 2
    vendored = subprocess.run([str(prefix / "bin" / "zccp-nginx"), "vendor-lua"], cwd=elsewhere, env=env,
                              capture_output=True, text=True, timeout=300)
    assert vendored.returncode == 0, vendored.stderr
    vendor = prefix / "share" / "zccp" / "lua-vendor"
    assert vendored.stdout.splitlines()[-1] == str(vendor) and (vendor / "nginx" / "redis.lua").is_file()

    cfg = Stack(tmp_path / "cfg")           # only for its isolated config (ports, shm name, socket)
    proc = subprocess.Popen([str(prefix / "bin" / "zccp-stack"), "up", "--config", str(cfg.config_path),
                             "--run-dir", str(elsewhere / "run")], cwd=elsewhere, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        end = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.stdout.read().decode(errors="replace")
            try:
                if httpx.get(cfg.url("/health"), timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < end, "stack not healthy"
            time.sleep(0.2)
        r = httpx.post(cfg.url("/v1/messages"), json=anthropic_body("Hello", max_tokens=4), timeout=30)
        assert r.status_code == 200 and r.json()["type"] == "message"
        http_conf = (elsewhere / "run" / "nginx" / "zccp_http.conf").read_text()
        assert f'lua_package_path "{prefix / "share" / "zccp" / "lua"}/?.lua;{vendor}/?.lua;;"' in http_conf
        # the front tier's nginx.conf, from the installed template and Lua modules
        (elsewhere / "front.yaml").write_text("front:\n  hosts: zccp-hosts.ns.svc.cluster.local\n"
                                              "  resolver: 127.0.0.1:5353\n  listen: 127.0.0.1:1\n")
        subprocess.run([str(prefix / "bin" / "zccp-nginx"), "render", "--front", "front.yaml", "--out", "front"],
                       cwd=elsewhere, env=env, check=True, capture_output=True)
        front_conf = (elsewhere / "front" / "nginx.conf").read_text()
        assert f'lua_package_path "{prefix / "share" / "zccp" / "lua"}/?.lua;{vendor}/?.lua;;"' in front_conf
        assert (prefix / "share" / "zccp" / "lua" / "zccp" / "front" / "dns.lua").is_file()
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(30)
