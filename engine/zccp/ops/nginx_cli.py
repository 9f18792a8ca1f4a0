"""`zccp-nginx check` and `zccp-nginx check-site` (zccp-nginx render is in zccp.ops.cli)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from zccp.config import Config

Loader = Callable[[str, str], Config]   # (config path, run dir) -> the resolved config


def check_main(argv: list[str], load: Loader) -> int:
    p = argparse.ArgumentParser(prog="zccp-nginx check", description="Compile the mask patterns and load the "
                                "plugin chain with this host's nginx (its PCRE and LuaJIT); exit 1 with file:line "
                                "for each refusal (docs/existing-nginx.md: before every reload).")
    p.add_argument("--config", required=True)
    p.add_argument("--run-dir", default=".run")
    p.add_argument("--nginx", help="the nginx binary (default: nginx on PATH, else /usr/sbin/nginx)")
    args = p.parse_args(argv)
    from zccp.ops.nginx_check import CheckError, run_check

    try:
        res = run_check(load(args.config, args.run_dir), args.nginx)
    except CheckError as exc:
        print(f"zccp-nginx check: {exc}", file=sys.stderr)
        return 2
    for e in res.errors:
        print(e, file=sys.stderr)
    print(f"{res.masks} mask pattern(s) and {res.plugins} plugin(s) compiled"
          + (f"; {len(res.errors)} refused" if res.errors else ""))
    return 0 if res.ok else 1


def check_site_main(argv: list[str], load: Loader) -> int:
    p = argparse.ArgumentParser(prog="zccp-nginx check-site", description="Name every location of the running "
                                "nginx that ZCCP's includes would shadow (exact and prefix matches of ZCCP's paths "
                                "in the same server); exit 1 when one would. Run before adding the includes.")
    p.add_argument("--config", required=True)
    p.add_argument("--run-dir", default=".run")
    p.add_argument("--dump", metavar="FILE", help="read this `nginx -T` output (- for stdin) instead of running "
                   "nginx -T")
    p.add_argument("--nginx", default="nginx", help="the nginx binary that runs `-T` (default: nginx)")
    p.add_argument("--server", metavar="NAME", help="only the server {} with this server_name or listen value "
                   "(the one that will include zccp_server.conf); default: every server")
    p.add_argument("--standalone", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from zccp.ops.nginx_conf import server_paths
    from zccp.ops.nginx_dump import DumpError
    from zccp.ops.site_check import check_site

    cfg = load(args.config, args.run_dir)
    if args.dump == "-":
        text = sys.stdin.read()
    elif args.dump:
        text = Path(args.dump).read_text(errors="replace")
    else:
        r = subprocess.run([args.nginx, "-T"], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            print(f"zccp-nginx check-site: {args.nginx} -T failed: {r.stderr.strip()}", file=sys.stderr)
            return 2
        text = r.stdout
    paths = server_paths(cfg, args.standalone)
    try:
        found, notes = check_site(text, paths, args.server)
    except DumpError as exc:
        print(f"zccp-nginx check-site: {exc}", file=sys.stderr)
        return 2
    print(f"ZCCP's paths: {' '.join(paths)}")
    for s in found:
        print(s.line())
    for n in notes:
        print(f"note: {n}")
    if found:
        print(f"{len(found)} location(s) shadowed: put the include in another server {{}}, or move ZCCP's path "
              "(server.paths in config.yaml)", file=sys.stderr)
        return 1
    print("no location of this nginx is shadowed")
    return 0
