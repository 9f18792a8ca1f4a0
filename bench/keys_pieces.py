"""Where the key check's and the limits' nginx CPU goes (issue 18's attribution): one stack
(nginx, null engine, Redis, auth.mode keys), with one extra location (bench/keys_pieces.lua)
that runs each piece N times inside a real request and reports ns per call. Two keys: one
without limits (bench/keys.py's "keys" row) and one with them ("keys+limits").

    PYTHONPATH=engine python -m bench.keys_pieces [--n 5000] [--repeats 15] \
        [--commit C] [--once S [--bodies N]] [--out bench/keys_pieces.json --label before|after]

Each piece: the least of --repeats runs of --n calls (the machine is shared), timed on the
worker thread's CPU clock (CLOCK_THREAD_CPUTIME_ID: time preempted by other processes is not
charged; each reading is a system call, a few hundred ns added to every piece). --commit runs
another commit's lua/ (git archive) in the same stack: the before of a change. Prints a
table (piece, ns per call); with --out, adds it to that JSON under --label, which
bench/keys.py renders as bench/keys.md's attribution table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from bench.keys import NULL, bodies_1k, body_1k, make_key, wrk_with
from tests.support.checkout import REPO, require_this_checkout
from tests.support.harness import Stack
from tests.support.leftovers import remove_socket_dirs
from zccp.ops.stack import nginx_paths
from zccp.config.paths import lua_vendor_dir

PARTS = ("auth.admit", "limits.admit", "rate-limit headers", "limits.settle", "usage_log.line (with the request id)",
         "nothing (the clock's own cost)")   # keys_once.lua
LOCATION = """
location = /zccp-bench/pieces {
    client_max_body_size 64k;
    client_body_buffer_size 64k;
    content_by_lua_file %s;
}
location = /zccp-bench/once {
    client_max_body_size 64k;
    client_body_buffer_size 64k;
    content_by_lua_file %s;
}
"""


def add_location(s: Stack, lua_dir: Path | None) -> None:
    """Appends the bench location to the rendered zccp_server.conf (and, with lua_dir, loads
    ZCCP's modules from there: another commit's lua/) and reloads nginx."""
    prefix, _ = nginx_paths(s.run_dir)
    conf = next(prefix.rglob("zccp_server.conf"))
    conf.write_text(conf.read_text() + LOCATION % (REPO / "bench" / "keys_pieces.lua",
                                                   REPO / "bench" / "keys_once.lua"))
    if lua_dir is not None:
        http = next(prefix.rglob("zccp_http.conf"))
        path = f"{lua_dir}/?.lua;{lua_vendor_dir()}/?.lua;;"
        text, n = re.subn(r'lua_package_path "[^"]*";', f'lua_package_path "{path}";', http.read_text())
        assert n == 1
        http.write_text(text)
    assert s.nginx is not None
    os.kill(s.nginx.proc.pid, signal.SIGHUP)
    end = time.monotonic() + 20
    while time.monotonic() < end:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(s.url("/zccp-bench/pieces?probe=1")).text == "ready":
                return
        time.sleep(0.2)
    raise RuntimeError("the bench location did not appear after the reload")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--jitv", help="write LuaJIT's trace log (jit.v) to this file")
    ap.add_argument("--commit", help="measure this commit's lua/ (e.g. the one before a change)")
    ap.add_argument("--repeats", type=int, default=15, help="runs per piece; the least is kept")
    ap.add_argument("--out", type=Path, help="add the figures to this JSON file under --label")
    ap.add_argument("--label", default="now")
    ap.add_argument("--once", type=float, default=0,
                    help="also: this many seconds of wrk on a location that runs the key check, the admission "
                         "and the settlement once per request (keys_once.lua); their µs per request")
    ap.add_argument("--bodies", type=int, default=1,
                    help="--once: this many distinct 1 KiB bodies, cycled (default 1: the same body every time)")
    ap.add_argument("--nojit", action="store_true", help="LuaJIT's interpreter only (jit.off() in that worker)")
    args = ap.parse_args()
    require_this_checkout()
    with tempfile.TemporaryDirectory() as tmp:
        over = {"model": NULL, "auth": {"mode": "keys"}}
        s = Stack(Path(tmp) / "pieces", over, with_redis=True).start()
        try:
            plain = make_key(s, "keys")
            limited = make_key(s, "keys+limits")
            lua_dir = None
            if args.commit:
                lua_dir = Path(tmp) / "lua-at-commit"
                lua_dir.mkdir()
                archive = subprocess.run(["git", "-C", str(REPO), "archive", args.commit, "lua"], check=True,
                                         capture_output=True).stdout
                subprocess.run(["tar", "-x", "-C", str(lua_dir)], input=archive, check=True)
                lua_dir = lua_dir / "lua"
            add_location(s, lua_dir)
            r = httpx.post(s.url(f"/zccp-bench/pieces?n={args.n}&repeats={args.repeats}&plain={plain}&limited={limited}"
                                 + (f"&jitv={args.jitv}" if args.jitv else "") + ("&nojit=1" if args.nojit else "")),
                           content=body_1k().encode(), timeout=300)
            r.raise_for_status()
            rows = r.json()
            if args.once:
                with tempfile.NamedTemporaryFile("w", suffix=".jsonl") as bf:
                    bf.write(bodies_1k(args.bodies))
                    bf.flush()
                    for key, what in ((plain, "no limits"), (limited, "limits")):
                        wrk_with(s.base_url, Path(bf.name), 16, 1, ["-", key], path="/zccp-bench/once")
                        httpx.get(s.url("/zccp-bench/once?report=1"))   # the warm-up's sums dropped
                        wrk_with(s.base_url, Path(bf.name), 16, args.once, ["-", key], path="/zccp-bench/once")
                        once = httpx.get(s.url("/zccp-bench/once?report=1")).json()
                        for part in PARTS:
                            rows.append({"name": f"once per request, {what}"
                                                 + (f", {args.bodies} bodies" if args.bodies > 1 else "") + f": {part}",
                                         "ns": once[part]})
        finally:
            s.stop()
    remove_socket_dirs()
    print(f"load: {os.getloadavg()}")
    print("| piece | ns per call |\n|---|---|")
    for row in rows:
        print(f"| {row['name']} | {row['ns']:.0f} |")
    if args.out:
        saved = json.loads(args.out.read_text()) if args.out.exists() else {}
        saved[args.label] = {"commit": args.commit or "worktree", "jit": not args.nojit, "load": os.getloadavg(),
                             "n": args.n, "repeats": args.repeats, "rows": rows}
        args.out.write_text(json.dumps(saved, indent=1))


if __name__ == "__main__":
    main()
