"""Where the key check's and the limits' nginx CPU goes (issue 18's attribution): one stack
(nginx, null engine, Redis, auth.mode keys), with one extra location (bench/keys_pieces.lua)
that runs each piece N times inside a real request and reports ns per call. Two keys: one
without limits (bench/keys.py's "keys" row) and one with them ("keys+limits").

    PYTHONPATH=engine python -m bench.keys_pieces [--n 20000]

Prints a table (piece, ns per call); the figures feed bench/keys.md's attribution table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import tempfile
import time
from pathlib import Path

import httpx

from bench.keys import NULL, body_1k, make_key
from tests.support.checkout import REPO, require_this_checkout
from tests.support.harness import Stack, remove_socket_dirs
from zccp.ops.stack import nginx_paths

LOCATION = """
location = /zccp-bench/pieces {
    client_max_body_size 64k;
    client_body_buffer_size 64k;
    content_by_lua_file %s;
}
"""


def add_location(s: Stack) -> None:
    """Appends the bench location to the rendered zccp_server.conf and reloads nginx."""
    prefix, _ = nginx_paths(s.run_dir)
    conf = next(prefix.rglob("zccp_server.conf"))
    conf.write_text(conf.read_text() + LOCATION % (REPO / "bench" / "keys_pieces.lua"))
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
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--jitv", help="write LuaJIT's trace log (jit.v) to this file")
    args = ap.parse_args()
    require_this_checkout()
    with tempfile.TemporaryDirectory() as tmp:
        over = {"model": NULL, "auth": {"mode": "keys"}}
        s = Stack(Path(tmp) / "pieces", over, with_redis=True).start()
        try:
            plain = make_key(s, "keys")
            limited = make_key(s, "keys+limits")
            add_location(s)
            r = httpx.post(s.url(f"/zccp-bench/pieces?n={args.n}&plain={plain}&limited={limited}"
                                 + (f"&jitv={args.jitv}" if args.jitv else "")),
                           content=body_1k().encode(), timeout=300)
            r.raise_for_status()
            rows = r.json()
        finally:
            s.stop()
    remove_socket_dirs()
    print(f"load: {os.getloadavg()}")
    print("| piece | ns per call |\n|---|---|")
    for row in rows:
        print(f"| {row['name']} | {row['ns']:.0f} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
