"""`zccp-nginx vendor-lua`: Debian's OpenResty libraries into ZCCP's lua-vendor/ (zccp.ops.lua_vendor)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from zccp.ops.lua_vendor import PACKAGES, VendorError, has_redis, outdated, vendor
from zccp.config.paths import lua_vendor_dir


def vendor_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="zccp-nginx vendor-lua",
        description=f"Unpack the Lua files of Debian's {', '.join(PACKAGES)} (apt-get download, dpkg-deb -x) "
                    "into ZCCP's own directory, without installing the packages or their nginx-extras "
                    "dependency (docs/libraries.md). Run it again after apt's updates: --check says when.")
    p.add_argument("--dest", help=f"the directory (default {lua_vendor_dir()}, on the rendered lua_package_path)")
    p.add_argument("--debs", metavar="DIR", help="take the .debs from DIR instead of apt-get download "
                   "(a host without a mirror: `apt-get download` them elsewhere)")
    p.add_argument("--check", action="store_true", help="exit 1 when a package's vendored version is not "
                   "apt's candidate (run `apt-get update` first); nothing is changed")
    args = p.parse_args(argv)
    dest = Path(args.dest) if args.dest else lua_vendor_dir()
    try:
        if args.check:
            stale = outdated(dest)
            for pkg, have, want in stale:
                print(f"{pkg}: {have or 'not vendored'} in {dest}, apt has {want}: run zccp-nginx vendor-lua")
            if not stale:
                print(f"{dest}: every package at apt's candidate version")
            return 1 if stale else 0
        for v in vendor(dest, Path(args.debs) if args.debs else None):
            print(f"{v.package} {v.version}: {' '.join(v.files)}")
    except (VendorError, OSError) as exc:
        print(f"zccp-nginx vendor-lua: {exc}", file=sys.stderr)
        return 1
    print(dest)
    return 0


def warn_if_not_vendored() -> None:
    """After render: without the vendored lua-resty-redis, nginx starts only where its
    default Lua path holds one (Debian's lua-nginx-redis, OpenResty's resty.redis)."""
    if not has_redis(lua_vendor_dir()):
        print(f"zccp-nginx: warning: no vendored lua-resty-redis in {lua_vendor_dir()} "
              "(zccp-nginx vendor-lua; docs/libraries.md): nginx will look for it on its default Lua path",
              file=sys.stderr)
