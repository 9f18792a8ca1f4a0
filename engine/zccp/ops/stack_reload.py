"""`zccp-stack reload`'s nginx side: the running stack's nginx configuration rendered again
from config.yaml (the plugin chain and its settings among it) and tested with `nginx -t`
before the HUP; and, after it, the plugins nginx refused (docs/plugins.md).

`nginx -t` does not run init_by_lua: one throwaway nginx on the rendered configuration runs
zccp-nginx check's zccp.check with the settings nginx would start with (the mask patterns
compiled, every plugin of the chain loaded, settings against a plugin's schema, the chain
against a plugin's declared order) and ends before it opens a listener. What it refuses is
named by file and line; the files in force are then put back, and nginx is not signalled.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from pathlib import Path

from zccp.config import Config
from zccp.ops.nginx_check import CheckError, CheckResult, check_rendered
from zccp.ops.nginx_conf import render
from zccp.config.runtime import log_dir

_FILES = ("nginx.conf", "zccp_http.conf", "zccp_server.conf", "zccp_admin.conf")


class RenderError(RuntimeError):
    """The configuration could not be rendered or nginx -t refused it; the message says why."""


def rerender_nginx(cfg: Config, run_dir: Path) -> CheckResult:
    """Renders the stack's nginx files (<run_dir>/nginx) again, tests them and checks them
    (zccp.check); on a refusal the previous files are put back: RenderError names what nginx
    -t said, or the CheckResult returned has the masks and plugins refused, "file:line: why"."""
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
    try:
        check = check_rendered(exe, prefix, rendered.nginx_conf, cfg)
    except CheckError as exc:
        restore()
        raise RenderError(str(exc)) from None
    if not check.ok:
        restore()
    return check


def plugins_refused(cfg: Config) -> list[str]:
    """What the running nginx's /health says it refused at its last load: "plugin: message"."""
    from zccp.ops.admin_client import admin_request

    with contextlib.suppress(OSError, ValueError):
        _, body = admin_request(cfg, "GET", "/health", timeout=2.0)
        errs = (json.loads(body).get("plugins") or {}).get("errors") or []
        return [f"{e.get('plugin')}: {e.get('message')}" for e in errs if isinstance(e, dict)]
    return []
