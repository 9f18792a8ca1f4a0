"""deploy/systemd/*.service through `systemd-analyze verify`, offline (no running systemd
needed), in a throwaway root that holds the distribution's units and the programs the
units start. A misspelt key or value only warns there: any output fails the test."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))
ANALYZE = shutil.which("systemd-analyze")
SYSTEM_UNITS = Path("/usr/lib/systemd/system")

# scripts/setup.sh installs Debian's systemd package for this (nothing is started).
assert ANALYZE and SYSTEM_UNITS.is_dir(), "systemd-analyze not installed: run scripts/setup.sh"


def _exec_paths(unit: Path) -> list[str]:
    out = []
    for line in unit.read_text().splitlines():
        if line.startswith(("ExecStart=", "ExecStartPre=", "ExecStartPost=", "ExecReload=")):
            out.append(line.split("=", 1)[1].lstrip("-+!@:").split()[0])
    return out


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_verifies_cleanly(unit: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr/lib/systemd").mkdir(parents=True)
    shutil.copytree(SYSTEM_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    for link in ("lib", "bin", "sbin"):
        (root / link).symlink_to(f"usr/{link}")
    (root / "usr/bin").mkdir()
    (root / "usr/sbin").mkdir()
    for exe in _exec_paths(unit):  # stand-ins: verify checks that they are executable
        stub = root / exe.lstrip("/")
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.write_text("#!/bin/sh\n")
        stub.chmod(0o755)
    (root / "etc/systemd/system").mkdir(parents=True)
    shutil.copy(unit, root / "etc/systemd/system" / unit.name)
    r = subprocess.run([ANALYZE, "verify", "--man=no", f"--root={root}", unit.name],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr


def test_sysusers_creates_zccp_and_puts_www_data_in_its_group(tmp_path: Path) -> None:
    sysusers = shutil.which("systemd-sysusers")
    assert sysusers, "systemd-sysusers not installed: run scripts/setup.sh (systemd)"
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n"
                                         "www-data:x:33:33::/var/www:/usr/sbin/nologin\n")
    (tmp_path / "etc/group").write_text("root:x:0:\nwww-data:x:33:\n")
    conf = ROOT / "deploy/systemd/zccp.sysusers.conf"
    r = subprocess.run([sysusers, f"--root={tmp_path}", str(conf)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    users = {line.split(":")[0]: line.split(":") for line in (tmp_path / "etc/passwd").read_text().splitlines()}
    groups = {line.split(":")[0]: line.split(":") for line in (tmp_path / "etc/group").read_text().splitlines()}
    assert users["zccp"][3] == groups["zccp"][2]            # primary group zccp
    assert "www-data" in groups["zccp"][3].split(",")       # nginx's workers may open the arena
