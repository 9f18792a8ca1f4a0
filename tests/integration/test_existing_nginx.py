"""ZCCP added to an nginx that already serves other sites (docs/existing-nginx.md), for real.

The nginx here is Debian's nginx with Debian's own nginx.conf layout (the modules
loaded by /etc/nginx/modules-enabled/, conf.d/ and sites-enabled/ included from http {},
`user www-data` when the test runs as root), moved under a private prefix. Its site
serves a static root and a `proxy_pass` upstream (a Python HTTP server). The test then
does what the document tells an operator to do: `zccp-nginx render`, one include in
conf.d/, one include in the server, `nginx -t`, `nginx -s reload`; and checks that all
three answer, then that reloads under steady load on all of them fail no request.
The server is an HTTPS one, `listen ... ssl http2`, as most in front of real traffic are:
ZCCP is reached over HTTP/2 (and HTTP/1.1 over TLS) through the operator's TLS.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests.support.existing_nginx import (
    AS_ROOT, CLIENTS, INDEX, KINDS, MODULES_ENABLED, NGINX, NGINX_CONF, RELOADS, REPO, SITE, UPSTREAM_TEXT, WORKER_USER,
    WORKERS, ZCCP_IN_SERVER, Existing, Outcome, _chat_body, _check_sites, _client, _site_up, _wait,
)
from tests.support.harness import Stack, anthropic_body, self_signed_certificate, tls_client_context
from zccp.config import mask_state_path
from zccp.ops.stack import Service, engine_service, free_port, redis_service


@pytest.fixture
def zccp_home(tmp_path: Path) -> Path:
    """ZCCP's data files where the worker user cannot read them (as in a venv under
    /root): only nginx's master may need them, at start and reload."""
    home = tmp_path / "zccp-home"
    for d in ("lua", "nginx"):
        shutil.copytree(REPO / d, home / d)
    if (REPO / "lua-vendor").is_dir():   # Debian's Lua clients, unpacked (scripts/setup.sh)
        shutil.copytree(REPO / "lua-vendor", home / "lua-vendor")
    (home / "shm_abi").mkdir()
    shutil.copy(REPO / "shm_abi" / "zccp_abi.h", home / "shm_abi")
    home.chmod(0o700)
    return home


@pytest.fixture
def zccp(tmp_path: Path) -> Iterator[Stack]:
    """ZCCP's config (arena + socket 0660 to the workers' group when they are www-data);
    its engine and Redis are started by the test. The existing site listens on its
    server.listen, so the Stack's own checks (health, leaks) reach it there."""
    # tls: the Stack's own clients speak HTTP/2 over TLS to the operator's `ssl http2` server.
    # A 512 KiB body fits: limits.max_body_kb 600 (a 1 MiB slot's payload is 700 KiB).
    # The pool must hold what the clients can have in flight during a reload: each client's
    # own request, and for a keep-alive (HTTP/2) client the copy it sends again after the
    # old worker's GOAWAY while that worker still finishes the original (httpcore fails the
    # stream; see NOT_ANSWERED below). The harness's 8 slots are fewer than 6 + 3: measured,
    # a full pool of 8 live claims (6 in the exiting workers) answered 429 under CPU load.
    over: dict = {"limits": {"max_body_kb": 600}, "shared_memory": {"segment_count": 2 * CLIENTS}}
    if AS_ROOT:
        over["shared_memory"]["group"] = WORKER_USER
    s = Stack(tmp_path / "zccp", over, with_redis=True, tls=True, health_path="/zccp/health")
    try:
        yield s
    finally:
        s.stop()
        shutil.rmtree(Path(s.cfg.server.socket_path).parent, ignore_errors=True)


@pytest.fixture
def existing(tmp_path: Path, zccp: Stack) -> Iterator[Existing]:
    # Not under pytest's 0700 tmp_path: www-data serves the static root from here.
    prefix = Path(tempfile.mkdtemp(prefix="zccp-existing-nginx-"))
    prefix.chmod(0o755)
    upstream_dir = tmp_path / "upstream"
    (upstream_dir / "app").mkdir(parents=True)
    (upstream_dir / "app" / "hello.txt").write_text(UPSTREAM_TEXT)
    (upstream_dir / "v1" / "models").mkdir(parents=True)
    (upstream_dir / "v1" / "own.txt").write_text(UPSTREAM_TEXT)
    (upstream_dir / "v1" / "models" / "theirs").write_text(UPSTREAM_TEXT)
    up_port = free_port()
    upstream = Service("upstream", [sys.executable, "-m", "http.server", str(up_port), "--bind", "127.0.0.1",
                                    "--directory", str(upstream_dir)], tmp_path / "upstream.log")
    e = Existing(prefix, zccp.cfg.server.listen, upstream)
    try:
        upstream.start()
        upstream.wait_until(lambda: _site_up(f"http://127.0.0.1:{up_port}/app/hello.txt"), 20, "GET /app/hello.txt")
        for sub in ("logs", "conf.d", "sites-enabled", "www", "tmp"):
            (prefix / sub).mkdir()
        (prefix / "www" / "index.html").write_text(INDEX)
        # Debian's modules-enabled/*.conf name the modules relative to the prefix
        # (/usr/share/nginx/modules -> /usr/lib/nginx/modules): the same link here.
        (prefix / "modules").symlink_to("/usr/lib/nginx/modules")
        e.conf.write_text(NGINX_CONF.format(p=prefix, workers=WORKERS,
                                            user_line=f"user {WORKER_USER};" if AS_ROOT else ""))
        cert, key = self_signed_certificate()
        (prefix / "sites-enabled" / "default").write_text(SITE.format(p=prefix, listen=e.listen, upstream=up_port,
                                                                      cert=cert, key=key))
        t = e.ctl("-t")
        assert t.returncode == 0, t.stderr
        e.nginx = Service("nginx", [NGINX, "-p", str(prefix), "-c", str(e.conf), "-g", "daemon off;"],
                          prefix / "logs" / "nginx.log", stop_signal=signal.SIGQUIT)
        e.nginx.start()
        e.nginx.wait_until(lambda: _site_up(e.url + "/"), 20, "GET / on the static site")
        yield e
    finally:
        if e.nginx is not None:
            e.nginx.stop()
        upstream.stop()
        shutil.rmtree(prefix, ignore_errors=True)


def test_zccp_joins_an_nginx_serving_other_sites_and_reloads_under_load(existing, zccp, zccp_home):
    e, s = existing, zccp
    _check_sites(e.url)
    conf_before = e.ctl("-T")          # the operator's configuration before ZCCP, for Removal
    assert conf_before.returncode == 0, conf_before.stderr
    assert (MODULES_ENABLED / "50-mod-http-lua.conf").exists(), "libnginx-mod-http-lua is not enabled"

    # The engine and its Redis first (the systemd units' part), then nginx's part.
    env = {"ZCCP_HOME": str(zccp_home)}
    s.redis = redis_service(s.cfg.cache.redis_url, s.run_dir)
    s.engine = engine_service(s.config_path, s.cfg, s.run_dir, extra_env=env)

    # zccp-nginx render, the two includes, nginx -t, reload: docs/existing-nginx.md, step by step.
    out = e.prefix / "zccp"
    zccp_log = e.prefix / "logs" / "zccp.log"
    # --log: the zccp_json log made as Debian's are (www-data:adm 0640), not by nginx as root
    owner = "www-data:adm" if AS_ROOT else f"{pwd.getpwuid(os.getuid()).pw_name}:{grp.getgrgid(os.getgid()).gr_name}"
    r = subprocess.run([sys.executable, "-m", "zccp.ops.cli", "nginx", "render", "--config", str(s.config_path),
                        "--out", str(out), "--log", str(zccp_log), "--log-owner", owner],
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(REPO / "engine"), **env))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(out / "zccp_http.conf"), str(out / "zccp_server.conf"),
                                str(out / "zccp_admin.conf"), str(zccp_log)]
    want_ids = (pwd.getpwnam(owner.split(":")[0]).pw_uid, grp.getgrnam(owner.split(":")[1]).gr_gid)
    assert (stat.S_IMODE(zccp_log.stat().st_mode), zccp_log.stat().st_uid, zccp_log.stat().st_gid) == (0o640, *want_ids)
    assert f'lua_package_path "{zccp_home / "lua"}/?.lua;{zccp_home / "lua-vendor"}/?.lua;;";' \
        in (out / "zccp_http.conf").read_text()
    # step 7's three pieces: the http include and the admin server (a unix socket) in
    # conf.d/, the include (and the logs) in the operator's server
    (e.prefix / "conf.d" / "zccp.conf").write_text(f"include {out}/zccp_http.conf;\n")
    (e.prefix / "conf.d" / "zccp-admin.conf").write_text(
        f"server {{\n    listen {s.cfg.server.admin_listen};\n    include {out}/zccp_admin.conf;\n}}\n")
    site = e.prefix / "sites-enabled" / "default"
    body = site.read_text().rstrip()
    assert body.endswith("}")
    site.write_text(body[:-1] + ZCCP_IN_SERVER.format(out=out, p=e.prefix))
    t = e.ctl("-t")
    assert t.returncode == 0, t.stderr
    before = e.workers()
    assert e.ctl("-s", "reload").returncode == 0
    _wait(lambda: not (e.workers() & before) and len(e.workers()) == WORKERS, 30, "the reload's new workers")

    # All three answer: the static site, the upstream, ZCCP (both APIs, health, metrics).
    _check_sites(e.url)
    s.wait_healthy()
    with s.client() as c:
        m = c.post("/v1/messages", json=anthropic_body("Hello from an existing nginx", temperature=1))
        assert m.status_code == 200 and m.json()["type"] == "message", m.text
        assert m.headers["x-zccp-cache"] == "MISS"
        # The engine stores the answer after sending it: the repeat hits once the store landed.
        again: list[httpx.Response] = []

        def hit() -> bool:
            again.append(c.post("/v1/messages", json=anthropic_body("Hello from an existing nginx", temperature=1)))
            return again[-1].headers["x-zccp-cache"] == "HIT"

        _wait(hit, 10, "a cache HIT from Redis")
        # Sampled at temperature 1: only a replay repeats a text answered before.
        assert again[-1].json()["content"] in [x.json()["content"] for x in (m, *again[:-1])]
        o = c.post("/v1/chat/completions", json=_chat_body("Hello"))
        assert o.status_code == 200 and o.json()["choices"][0]["message"]["role"] == "assistant", o.text
        bad = c.post("/v1/chat/completions", json={"model": "zccp-tiny"})
        assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"], bad.text
        assert "zccp_engine_up 1" in s.admin_client().get("/metrics").text
        # Every admin page's module was loaded by the master: the workers cannot read it.
        keys = s.admin_client().get("/v1/zccp/keys")
        assert keys.status_code == 409 and "keys are off" in keys.text, keys.text
        assert "zccp_" not in c.get("/metrics").text            # never on the public server
        # HTTP/2 all along, and a 512 KiB body (above the decode limit: nginx's body buffer
        # on HTTP/2, zccp.core.body) answered; JSON whitespace makes it large, the prompt stays small.
        assert m.http_version == "HTTP/2"
        head = json.dumps(anthropic_body("a large body", max_tokens=4)).encode()
        big = c.post("/v1/messages", content=head[:-1] + b" " * (512 * 1024 - len(head)) + b"}",
                     headers={"content-type": "application/json"})
        assert big.status_code == 200 and big.json()["type"] == "message", big.text
        assert len(big.request.content) == 512 * 1024
        # nginx's L1 answers the next repeat by itself (no engine): logged all the same
        l1 = c.post("/v1/messages", json=anthropic_body("Hello from an existing nginx", temperature=1))
        assert l1.headers.get("x-zccp-cache-layer") == "L1", l1.headers
        models = c.get("/v1/models/zccp-tiny")
        assert models.status_code == 200 and models.json()["id"] == "zccp-tiny", models.text
        zccp_answers = [m, *again, o, bad, big, l1, models]
        # The operator's own /v1/ prefix keeps every other path, /v1/models/* included.
        for path in ("/v1/own.txt", "/v1/models/theirs"):
            r = c.get(path)
            assert r.status_code == 200 and r.text == UPSTREAM_TEXT and "x-zccp-cache" not in r.headers, path
    # ZCCP's includes add no server-wide setting: an oversized header line to the static
    # site is nginx's own answer (400 over HTTP/1.1), not ZCCP's API-shaped 431.
    r = httpx.get(e.url + "/", headers={"x-big": "b" * 64 * 1024}, verify=tls_client_context(), timeout=10)
    assert r.status_code == 400 and "application/json" not in r.headers.get("content-type", ""), r.headers
    # Every answer ZCCP gave, L1's included, is a line of its JSON log (if=$zccp_log), with
    # its context id; the operator's requests are not.
    zlog = [json.loads(ln) for ln in zccp_log.read_text().splitlines()]
    # nginx's master appended to the file render made: its owner and mode are still Debian's
    assert (stat.S_IMODE(zccp_log.stat().st_mode), zccp_log.stat().st_uid, zccp_log.stat().st_gid) == (0o640, *want_ids)
    assert {x["uri"] for x in zlog} == {"/v1/messages", "/v1/chat/completions", "/v1/models/zccp-tiny"}, zlog
    by_id = {x["request_id"]: x for x in zlog}
    for a in zccp_answers:
        line = by_id.get(a.headers["x-request-id"])
        assert line is not None and line["status"] == a.status_code, (a.headers, line)
        assert line["context_id"] == a.headers["x-zccp-context-id"] and re.fullmatch("[0-9a-f]{16}", line["context_id"])
    # the cache field says HIT for both layers; cache_layer tells nginx's L1 from Redis (L2)
    l1_line = by_id[l1.headers["x-request-id"]]
    assert (l1_line["cache"], l1_line["cache_layer"]) == ("HIT", "L1")
    assert by_id[again[-1].headers["x-request-id"]]["cache_layer"] == "L2"
    assert by_id[m.headers["x-request-id"]]["cache_layer"] == ""
    access = (e.prefix / "logs" / "access.log").read_text()
    assert '"GET /app/hello.txt HTTP/1.1" 200' in access and '"POST /v1/messages HTTP/2.0" 200' in access
    # nginx's master wrote the masks' last-good copy beside the socket (the engine reads it).
    assert mask_state_path(s.cfg).is_file()

    if AS_ROOT:
        # The workers are www-data; they reach the arena and the socket only through the group,
        # and never read ZCCP's Lua files (the master loaded them).
        uid = pwd.getpwnam(WORKER_USER).pw_uid
        for pid in e.workers():
            uids = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("Uid:"))
            assert uids.split()[1:] == [str(uid)] * 4, uids
        gid = grp.getgrnam(WORKER_USER).gr_gid
        for path in (Path("/dev/shm") / s.cfg.shared_memory.name.lstrip("/"), Path(s.cfg.server.socket_path)):
            st = path.stat()
            assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o660, 0, gid), path
        assert (stat.S_IMODE(zccp_home.stat().st_mode), zccp_home.stat().st_uid) == (0o700, 0)

    # Reloads under steady load on all three: every request a 2xx.
    outcomes: list[Outcome] = []
    stop = threading.Event()
    # Half the clients keep their connection alive, half open one per request.
    threads = [threading.Thread(target=_client, args=(e.url, i, i % 2 == 0, stop, outcomes), daemon=True)
               for i in range(CLIENTS)]
    for th in threads:
        th.start()
    windows: list[tuple[float, float]] = []
    try:
        _wait(lambda: len(outcomes) >= 5 * CLIENTS, 60, "the clients' first requests")
        for _ in range(RELOADS):
            old = e.workers()
            t0 = time.monotonic()
            rl = e.ctl("-s", "reload")
            assert rl.returncode == 0, rl.stderr
            # A reload is over when every old worker has finished its requests and exited.
            _wait(lambda old=old: not (e.workers() & old) and len(e.workers()) == WORKERS, 60, "the old workers' exit")
            windows.append((t0, time.monotonic()))
            time.sleep(0.5)
    finally:
        stop.set()
        for th in threads:
            th.join(90)
    done = list(outcomes)
    failed = [o for o in done if not o.ok]
    overlapping = [o for o in done if any(o.start < w1 and o.end > w0 for w0, w1 in windows)]
    retried = [o for o in done if o.retried]
    summary = (f"{len(done)} requests ({sum(o.keepalive for o in done)} on keep-alive connections), "
               f"{len(overlapping)} overlapping the {RELOADS} reloads ({dict(Counter(o.kind for o in overlapping))}), "
               f"{len(failed)} failed, {len(retried)} sent again after a keep-alive close "
               f"({dict(Counter(o.kind for o in retried))}); cache {dict(Counter(o.cache for o in done if o.cache))}")
    print(summary)
    assert not failed, summary + "\n" + "\n".join(f"{o.kind}: {o.detail}" for o in failed[:20])
    assert all(any(o.start < w1 and o.end > w0 for o in done) for w0, w1 in windows), summary
    assert {o.kind for o in overlapping} == set(KINDS), summary
    assert {"HIT", "MISS"} <= {o.cache for o in done}, summary     # Redis answered through the reloads
    s.assert_no_leaks()
    bad_lines = [ln for ln in e.error_log().splitlines() if any(f"[{lv}]" in ln for lv in ("alert", "crit", "emerg"))]
    assert not bad_lines, "\n".join(bad_lines[:10])
    _remove(e, s, out, env, conf_before.stdout)


def _removal_redis_lines() -> list[str]:
    """The redis-cli command lines of docs/existing-nginx.md's Removal block."""
    doc = (REPO / "docs" / "existing-nginx.md").read_text()
    block = doc.split("## Removal", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return [ln.split("  #")[0].strip() for ln in block.splitlines() if ln.startswith("redis-cli ")]


def _remove(e: Existing, s: Stack, out: Path, env: dict[str, str], conf_before: str) -> None:
    """docs/existing-nginx.md, "Removal", in its order; then nginx is as it was before."""
    rc = redis.Redis.from_url(s.cfg.cache.redis_url)
    rc.set("operator:own", "stays")             # the operator's key: the removal leaves it
    assert rc.keys("zccp:*")                    # the cached answers: what the removal deletes
    (e.prefix / "conf.d" / "zccp.conf").unlink()
    (e.prefix / "conf.d" / "zccp-admin.conf").unlink()
    site = e.prefix / "sites-enabled" / "default"
    added = set(ZCCP_IN_SERVER.format(out=out, p=e.prefix).splitlines()[:3])
    site.write_text("".join(ln for ln in site.read_text().splitlines(keepends=True) if ln.rstrip("\n") not in added))
    t = e.ctl("-t")
    assert t.returncode == 0, t.stderr
    old = e.workers()
    assert e.ctl("-s", "reload").returncode == 0
    _wait(lambda: not (e.workers() & old) and len(e.workers()) == WORKERS, 30, "the reload's new workers")
    assert s.engine is not None
    s.engine.stop()
    # the doc's own redis-cli lines, as written, on this Redis
    lines = _removal_redis_lines()
    assert len(lines) == 3, lines
    for line in lines:
        r = subprocess.run(["bash", "-c", line.replace("redis://127.0.0.1:6379/0", s.cfg.cache.redis_url)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stderr == "", (line, r.stderr)
    assert r.stdout == ""                        # the last one: the scan finds nothing
    assert list(rc.scan_iter("zccp*")) == [] and rc.get("operator:own") == b"stays"
    socket_dir = Path(s.cfg.server.socket_path).parent
    shutil.rmtree(socket_dir, ignore_errors=True)
    (Path("/dev/shm") / s.cfg.shared_memory.name.lstrip("/")).unlink(missing_ok=True)
    shutil.rmtree(out)
    for log in (e.prefix / "logs").glob("zccp.log*"):
        log.unlink()
    after = e.ctl("-T")
    assert after.returncode == 0, after.stderr
    assert after.stdout == conf_before          # byte for byte
    # nginx restarts (what failed with conf.d/zccp-admin.conf left behind)
    e.nginx.stop()
    e.nginx.start()
    e.nginx.wait_until(lambda: _site_up(e.url + "/"), 20, "GET / after the restart")
    _check_sites(e.url)
    assert not (Path("/dev/shm") / s.cfg.shared_memory.name.lstrip("/")).exists()
    assert not socket_dir.exists()
    assert not [p for p in (e.prefix / "logs").iterdir() if p.name.startswith("zccp")]
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(s.config_path) not in ps        # no engine of this stack left
