"""ZCCP included into a realistic operator site (docs/existing-nginx.md): the site keeps its
own /health (a backend behind `location /`), check-site names what the includes would
shadow before they are added, and what nginx itself answers on ZCCP's paths under the
site's server-level limit_req (429) and body limit (413) is the API's JSON, not HTML."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.existing_nginx import REPO, Existing
from tests.support.existing_nginx_site import APP_HEALTH, include_zccp, operator_site
from tests.support.harness import Stack, anthropic_body

# A request carrying X-Limit-Me is limited to one a minute by the site's server-level
# limit_req (a request without it is never limited: the key is empty).
LIMITS = "limit_req_zone $http_x_limit_me zone=site:1m rate=1r/m;\n"
SITE = """\
server {{
    listen {listen} default_server;
    limit_req zone=site;
    limit_req_status 429;
    add_header Strict-Transport-Security "max-age=63072000" always;
    error_page 502 503 504 /50x.html;
    client_max_body_size 1m;
    location / {{
        proxy_pass http://127.0.0.1:{upstream};
    }}
    location = /50x.html {{
        root {p}/www;
    }}
}}
"""


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[Existing, Stack]]:
    with operator_site(tmp_path, SITE, LIMITS) as es:
        yield es


def test_check_site_names_the_backend_location_before_the_include(site):
    e, s = site
    dump = e.ctl("-T")
    assert dump.returncode == 0, dump.stderr
    r = subprocess.run([sys.executable, "-m", "zccp.ops.cli", "nginx", "check-site", "--config", str(s.config_path),
                        "--run-dir", str(s.run_dir), "--dump", "-"], input=dump.stdout, capture_output=True,
                       text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO / "engine")))
    assert r.returncode == 1, r.stdout + r.stderr
    where = f"{e.prefix}/sites-enabled/example:8: location / "
    line = next(x for x in r.stdout.splitlines() if x.startswith(where))
    assert "/v1/messages" in line and "/zccp/health" in line
    assert "limit_req zone=site" in r.stdout and "client_max_body_size 1m" in r.stdout   # said, with their rule


def test_nginx_refusals_on_zccp_paths_are_api_shaped_and_the_site_keeps_its_health(site):
    e, s = site
    include_zccp(e, s)
    with httpx.Client(base_url=f"http://{e.listen}", timeout=30) as c:
        # the site's own /health is still its backend's; ZCCP's is /zccp/health
        h = c.get("/health")
        assert h.status_code == 200 and h.text == APP_HEALTH
        assert c.get("/zccp/health").json()["status"] == "ok"
        # the site's limit_req in front of both APIs: its 429 in each API's shape, retry-after
        for path, body, shape in (("/v1/messages", anthropic_body("hi", max_tokens=4), "anthropic"),
                                  ("/v1/chat/completions", {"model": "zccp-tiny", "max_tokens": 4,
                                                            "messages": [{"role": "user", "content": "hi"}]},
                                   "openai")):
            key = {"x-limit-me": path}
            first = c.post(path, json=body, headers=key)
            assert first.status_code == 200, first.text
            limited = c.post(path, json=body, headers=key)
            assert limited.status_code == 429, limited.text
            assert limited.headers["content-type"] == "application/json" and limited.headers["retry-after"] == "1"
            err = limited.json()
            if shape == "anthropic":
                assert err["type"] == "error" and err["error"]["type"] == "rate_limit_error", err
            else:
                assert err["error"]["type"] == "requests" and err["error"]["code"] == "rate_limit_exceeded", err
            assert limited.headers["strict-transport-security"] == "max-age=63072000"   # the site's add_header
            assert limited.headers["x-request-id"]
        # ZCCP's locations keep limits.max_body_kb (256 KiB here), not the site's 1m: an API 413
        head = json.dumps(anthropic_body("big", max_tokens=4)).encode()
        big = c.post("/v1/messages", content=head[:-1] + b" " * (300 * 1024) + b"}",
                     headers={"content-type": "application/json"})
        assert big.status_code == 413 and big.json()["error"]["type"] == "request_too_large", big.text
        # the site's other paths are as before: its own error page, its own answer
        assert c.get("/nothing-here").status_code == 404
    assert "<html>" not in (e.prefix / "logs" / "error.log").read_text(errors="replace")
