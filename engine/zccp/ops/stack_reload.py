"""`zccp-stack reload`'s nginx side: the running stack's nginx configuration rendered again
from config.yaml (the plugin chain and its settings among it) and tested with `nginx -t`
before the HUP; and, after it, the plugins nginx refused (docs/plugins.md).

A throwaway nginx loads every plugin of the chain (zccp.core.pipeline.init, stopped once
its init is done: `nginx -t` does not run init_by_lua): a plugin that does
not load with no good copy in force, settings against a plugin's schema, or a chain
against a plugin's declared order fail it, named by file and line or key; the files in
force are then put back, and nginx is not signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from zccp.config import Config
from zccp.ops.nginx_conf import render
from zccp.runtime import log_dir

_FILES = ("nginx.conf", "zccp_http.conf", "zccp_server.conf", "zccp_admin.conf")


class RenderError(RuntimeError):
    """The configuration could not be rendered or nginx -t refused it; the message says why."""


def rerender_nginx(cfg: Config, run_dir: Path) -> None:
    """Renders the stack's nginx files (<run_dir>/nginx) again and tests them; on a refusal
    the previous files are put back and RenderError names what nginx said."""
    prefix = run_dir / "nginx"
    saved = {n: (prefix / n).read_bytes() for n in _FILES if (prefix / n).exists()}

    def restore() -> None:
        for n, data in saved.items():
            (prefix / n).write_bytes(data)

    exe = shutil.which("nginx") or "/usr/sbin/nginx"
    try:
        rendered = render(cfg, prefix, standalone=True, prefix=prefix, log_dir=log_dir(run_dir))
    except ValueError as exc:
        restore()
        raise RenderError(f"nginx's configuration: {exc}") from None
    assert rendered.nginx_conf is not None
    test = subprocess.run([exe, "-t", "-q", "-p", str(prefix), "-c", str(rendered.nginx_conf)],
                          capture_output=True, text=True)
    if test.returncode != 0:
        restore()
        raise RenderError(f"nginx -t refused the new configuration (the running one stays):\n{test.stderr}")
    # nginx -t does not run init_by_lua: load the chain in a throwaway nginx that stops once
    # its init is done (zccp.init, ZCCP_CHECK_ONLY), before it opens a listening socket.
    try:
        chk = subprocess.run([exe, "-p", str(prefix), "-c", str(rendered.nginx_conf), "-g",
                              "daemon off; master_process off;"], capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, ZCCP_CHECK_ONLY="1"))
    except subprocess.TimeoutExpired:
        restore()
        raise RenderError("the plugin chain's check did not finish within 60 s") from None
    if chk.returncode != 0:
        restore()
        said = "\n".join(x for x in chk.stderr.splitlines() if "init_by_lua error" in x or "refused" in x)
        raise RenderError(f"nginx refused the new plugin chain (the running one stays):\n{said or chk.stderr}")


def plugins_refused(cfg: Config) -> list[str]:
    """What the running nginx's /health says it refused at its last load: "plugin: message"."""
    from zccp.ops.admin_client import admin_request

    with contextlib.suppress(OSError, ValueError):
        _, body = admin_request(cfg, "GET", "/health", timeout=2.0)
        errs = (json.loads(body).get("plugins") or {}).get("errors") or []
        return [f"{e.get('plugin')}: {e.get('message')}" for e in errs if isinstance(e, dict)]
    return []
