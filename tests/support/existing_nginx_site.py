"""A realistic operator site for tests/integration/test_existing_nginx_site*.py: Debian's
nginx.conf layout under a private prefix, a backend behind `location /` that answers the
load balancer's /health, the operator's own server-level directives (the test's template),
ZCCP rendered beside it and included on demand."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.existing_nginx import AS_ROOT, NGINX, NGINX_CONF, REPO, WORKER_USER, Existing, _site_up, _wait
from tests.support.harness import Stack
from zccp.ops.stack import Service, engine_service, free_port

APP_HEALTH = "app ok\n"
ERROR_PAGE = "<html><body>the site's own error page</body></html>\n"


@contextmanager
def operator_site(tmp_path: Path, site: str, limits: str) -> Iterator[tuple[Existing, Stack]]:
    """The operator's nginx serving `site` (a server block; {listen}, {upstream} and {p},
    the prefix, filled in) with `limits` in conf.d, ZCCP rendered into {p}/zccp and its
    engine running, not yet included (include_zccp)."""
    over: dict = {"shared_memory": {"group": WORKER_USER}} if AS_ROOT else {}
    s = Stack(tmp_path / "zccp", over, health_path="/zccp/health")
    prefix = Path(tempfile.mkdtemp(prefix="zccp-site-"))
    prefix.chmod(0o755)
    app = tmp_path / "app"
    app.mkdir()
    (app / "health").write_text(APP_HEALTH)
    up = free_port()
    upstream = Service("upstream", [sys.executable, "-m", "http.server", str(up), "--bind", "127.0.0.1",
                                    "--directory", str(app)], tmp_path / "upstream.log")
    e = Existing(prefix, s.cfg.server.listen, upstream)
    try:
        upstream.start()
        upstream.wait_until(lambda: _site_up(f"http://127.0.0.1:{up}/health"), 20, "the app's /health")
        for sub in ("logs", "conf.d", "sites-enabled", "www", "tmp"):
            (prefix / sub).mkdir()
        (prefix / "www" / "50x.html").write_text(ERROR_PAGE)
        (prefix / "modules").symlink_to("/usr/lib/nginx/modules")
        e.conf.write_text(NGINX_CONF.format(p=prefix, workers=1, user_line=f"user {WORKER_USER};" if AS_ROOT else ""))
        (prefix / "conf.d" / "limits.conf").write_text(limits)
        r = subprocess.run([sys.executable, "-m", "zccp.ops.cli", "nginx", "render", "--config", str(s.config_path),
                            "--run-dir", str(s.run_dir), "--out", str(prefix / "zccp")], capture_output=True,
                           text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO / "engine")))
        assert r.returncode == 0, r.stderr
        (prefix / "sites-enabled" / "example").write_text(site.format(listen=e.listen, upstream=up, p=prefix))
        s.engine = engine_service(s.config_path, s.cfg, s.run_dir)
        e.nginx = Service("nginx", [NGINX, "-p", str(prefix), "-c", str(e.conf), "-g", "daemon off;"],
                          prefix / "logs" / "nginx.log", stop_signal=signal.SIGQUIT)
        e.nginx.start()
        e.nginx.wait_until(lambda: _site_up(f"http://{e.listen}/health"), 20, "the site's /health")
        yield e, s
    finally:
        if e.nginx is not None:
            e.nginx.stop()
        upstream.stop()
        s.stop()
        shutil.rmtree(prefix, ignore_errors=True)


def include_zccp(e: Existing, s: Stack, server_lines: str = "") -> None:
    """docs/existing-nginx.md's steps 7-8: the http include, the server include (after
    `server_lines`, the operator's own additions), nginx -t, reload, ZCCP healthy."""
    out = e.prefix / "zccp"
    (e.prefix / "conf.d" / "zccp.conf").write_text(f"include {out}/zccp_http.conf;\n")
    site = e.prefix / "sites-enabled" / "example"
    site.write_text(site.read_text().rstrip()[:-1] + server_lines + f"    include {out}/zccp_server.conf;\n}}\n")
    t = e.ctl("-t")
    assert t.returncode == 0, t.stderr
    old = e.workers()
    assert e.ctl("-s", "reload").returncode == 0
    # `nginx -s reload` returns once signalled: until the old workers exit, one of them may
    # still accept a connection and route /v1/... to the site's `location /` (its own page)
    _wait(lambda: not (e.workers() & old) and bool(e.workers()), 30, "the reload's new workers")
    s.wait_healthy()
