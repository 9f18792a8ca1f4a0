"""Container healthchecks, with the addresses taken from the mounted config.yaml.

  healthcheck.py engine [NAME]   the engine (NAME: that of engines:) answers a PING on its doorbell socket
  healthcheck.py nginx    GET /health is 200 (nginx is up and the engine answers it)
  healthcheck.py admin    print the admin listener's /health (pids, epoch: what the public one no
                          longer says); run it where the admin socket is, the nginx container
"""

import os
import sys
import urllib.error

from zccp.config import load_config
from zccp.ops.admin_client import admin_request
from zccp.ops.stack import engine_ping, local_urlopen
from zccp.config.runtime import engine_socket_path

cfg = load_config(os.environ.get("ZCCP_CONFIG", "/etc/zccp/config.yaml"))
what = sys.argv[1] if len(sys.argv) > 1 else ""
if what == "engine":
    sock = cfg.server.socket_path or ""
    if len(sys.argv) > 2:   # one engine of engines: (docs/engines.md)
        sock = engine_socket_path(sock, sys.argv[2])
    sys.exit(0 if engine_ping(sock, timeout=2.0) is not None else 1)
if what == "nginx":
    port = cfg.server.listen.rpartition(":")[2]
    try:
        scheme = "https" if cfg.server.tls is not None else "http"
        with local_urlopen(f"{scheme}://127.0.0.1:{port}/health", timeout=2.0) as r:
            sys.exit(0 if r.status == 200 else 1)
    except (urllib.error.URLError, OSError) as exc:
        print(f"/health: {exc}", file=sys.stderr)
        sys.exit(1)
if what == "admin":
    from pathlib import Path

    from zccp.config.runtime import resolve

    status, body = admin_request(resolve(cfg, Path("/run/zccp")), "GET", "/health")
    sys.stdout.write(body.decode("utf-8", "replace"))
    sys.exit(0 if status == 200 else 1)
sys.exit("usage: healthcheck.py engine|nginx|admin")
