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
    _verify(unit, unit.name, tmp_path)


def _verify(unit: Path, name: str, tmp_path: Path, dropin: str | None = None) -> None:
    """systemd-analyze verify of instance `name` of unit (with a drop-in's text, if any)."""
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
    if dropin is not None:
        (root / f"etc/systemd/system/{name}.d").mkdir()
        (root / f"etc/systemd/system/{name}.d/placement.conf").write_text(dropin)
    r = subprocess.run([ANALYZE, "verify", "--man=no", f"--root={root}", name],
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


def test_the_documented_sysusers_step_works_where_etc_sysusers_d_is_missing(tmp_path: Path) -> None:
    """docs/existing-nginx.md step 3 on a root like Debian 12's (no /etc/sysusers.d): the
    `install -D` there creates the directory, and a plain `systemd-sysusers` reads it."""
    sysusers = shutil.which("systemd-sysusers")
    assert sysusers, "systemd-sysusers not installed: run scripts/setup.sh (systemd)"
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n"
                                         "www-data:x:33:33::/var/www:/usr/sbin/nologin\n")
    (tmp_path / "etc/group").write_text("root:x:0:\nwww-data:x:33:\n")
    assert not (tmp_path / "etc/sysusers.d").exists()
    doc = (ROOT / "docs/existing-nginx.md").read_text()
    [step] = [ln.strip() for ln in doc.splitlines() if "zccp.sysusers.conf" in ln and ln.strip().startswith("install")]
    args = step.split("#")[0].split()
    assert args[:2] == ["install", "-D"] and args[-1] == "/etc/sysusers.d/zccp.conf", step
    subprocess.run([*args[:-2], str(ROOT / "deploy/systemd/zccp.sysusers.conf"), str(tmp_path) + args[-1]],
                   check=True, timeout=60)
    r = subprocess.run([sysusers, f"--root={tmp_path}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert any(ln.startswith("zccp:") for ln in (tmp_path / "etc/passwd").read_text().splitlines())
    zccp = next(ln for ln in (tmp_path / "etc/group").read_text().splitlines() if ln.startswith("zccp:"))
    assert "www-data" in zccp.split(":")[3].split(",")


def test_the_runtime_directory_is_setgid() -> None:
    """nginx's master (root) writes the masks' last-good copy into /run/zccp: setgid keeps
    it in group zccp, which the engine (user zccp) reads it through."""
    unit = (ROOT / "deploy/systemd/zccp-engine.service").read_text()
    assert "RuntimeDirectoryMode=2770" in unit.splitlines()


def test_the_placement_drop_in_verifies(tmp_path: Path) -> None:
    """`zccp-engine --systemd-placement` for an engine with a fixed placement: its drop-in
    (CPUAffinity=, NUMAPolicy=, NUMAMask=) on zccp-engine@a.service verifies cleanly."""
    from zccp.config import for_engine, parse_config
    from zccp.process.placement import placement_for, systemd_dropin

    cfg = parse_config({"engines": [{"name": "a", "placement": {"cpus": "0", "numa_node": 0}}]}, "c.yaml")
    dropin = systemd_dropin(placement_for(for_engine(cfg, "a")))
    assert dropin == "[Service]\nCPUAffinity=0\nNUMAPolicy=preferred\nNUMAMask=0\n"
    _verify(ROOT / "deploy/systemd/zccp-engine@.service", "zccp-engine@a.service", tmp_path, dropin)
    unit = (ROOT / "deploy/systemd/zccp-engine@.service").read_text().splitlines()
    assert "Slice=zccp-%i.slice" in unit and "RestartSec=100ms" in unit and "MemoryMax=90%" in unit
