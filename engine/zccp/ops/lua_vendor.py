"""Debian's OpenResty libraries without their nginx dependency (`zccp-nginx vendor-lua`).

Debian 12 packages lua-resty-redis (`lua-nginx-redis`), its Sentinel connector
(`lua-nginx-redis-connector`) and lua-resty-dns (`lua-nginx-dns`), but `lua-nginx-redis`
Depends: nginx-extras, which brings nineteen more module packages into an operator's
modules-enabled/ and reloads their nginx. The libraries are pure Lua: this takes Debian's
.debs (`apt-get download`, verified by apt against the signed index), unpacks them
(`dpkg-deb -x`) and keeps only their Lua files and copyright notices in a directory of
ZCCP's own, which the rendered lua_package_path lists before nginx's default path
(docs/libraries.md). Nothing is installed into dpkg's database; `--check` compares what is
here with apt's candidate versions, so Debian's updates are seen and taken by running the
command again.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

# package -> the Lua modules it must bring (Debian's names, under usr/share/lua/5.1/)
PACKAGES: dict[str, tuple[str, ...]] = {
    "lua-nginx-redis": ("nginx/redis.lua",),
    "lua-nginx-redis-connector": ("nginx/redis/connector.lua", "nginx/redis/sentinel.lua"),
    "lua-nginx-dns": ("nginx/dns/resolver.lua",),
}
LUA_ROOT = "usr/share/lua/5.1"
MANIFEST = "packages.txt"        # one line per package: name, version, .deb file name


class VendorError(Exception):
    pass


@dataclass(frozen=True)
class Vendored:
    package: str
    version: str
    deb: str
    files: tuple[str, ...]


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise VendorError(f"{' '.join(cmd)}: exit {r.returncode}: {(r.stderr or r.stdout).strip()[-500:]}")
    return r.stdout


def _download(into: Path) -> None:
    """apt-get download: apt fetches as user _apt when run as root, so that user must be
    able to write here (else apt warns and downloads unsandboxed)."""
    if os.geteuid() == 0:
        try:
            os.chown(into, pwd.getpwnam("_apt").pw_uid, -1)
        except KeyError:
            pass
    _run(["apt-get", "download", "-q", *PACKAGES], cwd=into)


def _deb_for(package: str, debs: Path) -> Path:
    found = sorted(debs.glob(f"{package}_*.deb"))
    if len(found) != 1:
        raise VendorError(f"{debs}: want exactly one {package}_*.deb, found {len(found)}")
    return found[0]


def _take(package: str, deb: Path, work: Path, stage: Path) -> Vendored:
    name, version = _run(["dpkg-deb", "--show", "--showformat=${Package} ${Version}", str(deb)]).split()
    if name != package:
        raise VendorError(f"{deb}: holds package {name}, not {package}")
    root = work / package
    _run(["dpkg-deb", "-x", str(deb), str(root)])
    lua = root / LUA_ROOT
    files: list[str] = []
    for src in sorted(lua.rglob("*.lua")) if lua.is_dir() else []:
        if src.is_symlink() or not src.is_file():
            raise VendorError(f"{deb}: {src.relative_to(root)} is not a plain file")
        rel = str(src.relative_to(lua))
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, stage / rel)
        (stage / rel).chmod(0o644)
        files.append(rel)
    missing = [f for f in PACKAGES[package] if f not in files]
    if missing:
        raise VendorError(f"{deb}: {', '.join(missing)} not in the package")
    notice = root / "usr/share/doc" / package / "copyright"
    if notice.is_file():   # the libraries' licence asks that their notice travels with them
        (stage / "copyright").mkdir(exist_ok=True)
        shutil.copyfile(notice, stage / "copyright" / package)
    return Vendored(package, version, deb.name, tuple(files))


def vendor(dest: Path, debs: Path | None = None) -> list[Vendored]:
    """Fill dest with the Lua files of PACKAGES' .debs (from debs/, else apt-get download).
    dest is replaced whole, and only once every package was taken."""
    dest = dest.resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="zccp-lua-vendor-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        if debs is None:
            debs = work / "debs"
            debs.mkdir()
            _download(debs)
        stage = Path(tempfile.mkdtemp(prefix=".lua-vendor-", dir=dest.parent))
        try:
            stage.chmod(0o755)
            taken = [_take(p, _deb_for(p, debs), work, stage) for p in PACKAGES]
            (stage / MANIFEST).write_text("".join(f"{v.package} {v.version} {v.deb}\n" for v in taken))
            old = dest.with_name(dest.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            if dest.exists():
                dest.rename(old)
            stage.rename(dest)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    return taken


def vendored_versions(dest: Path) -> dict[str, str]:
    """package -> version, from dest's manifest ({} when nothing was vendored there)."""
    try:
        lines = (dest / MANIFEST).read_text().splitlines()
    except FileNotFoundError:
        return {}
    return {f[0]: f[1] for f in (line.split() for line in lines) if len(f) >= 2}


def outdated(dest: Path) -> list[tuple[str, str | None, str]]:
    """(package, vendored version or None, apt's candidate) for each package whose vendored
    copy is missing or not apt's candidate (after `apt-get update`)."""
    have = vendored_versions(dest)
    out = []
    for p in PACKAGES:
        candidate = ""
        for line in _run(["apt-cache", "show", "--no-all-versions", p]).splitlines():
            if line.startswith("Version:"):
                candidate = line.split(":", 1)[1].strip()
                break
        if have.get(p) != candidate:
            out.append((p, have.get(p), candidate))
    return out


def has_redis(dest: Path) -> bool:
    return (dest / PACKAGES["lua-nginx-redis"][0]).is_file()
