"""Bringing up each variant's processes on free loopback ports.

D is the real ZCCP stack (zccp.ops.stack: redis-server, the engine, nginx rendered
from config). A, B and C are nginx from bench/nginx/*.conf.in plus, for B and C,
a Python app; all use the same body limits and the same worker count as D.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import signal
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from zccp.config import load_config
from zccp.ops.admin_client import request_to
from zccp.config.runtime import resolve
from zccp.ops.stack import Service, engine_service, engine_services, free_port, http_get, nginx_service, redis_service

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent


@dataclass
class Variant:
    key: str                     # A, B, C, D
    url: str                     # base URL
    services: dict[str, Service] = field(default_factory=dict)   # role -> service (nginx, engine, backend, redis)
    info: dict[str, object] = field(default_factory=dict)

    def stop(self) -> None:
        for svc in reversed(list(self.services.values())):
            svc.stop()
        if "socket_dir" in self.info:
            shutil.rmtree(str(self.info["socket_dir"]), ignore_errors=True)

    def pids(self) -> dict[str, int]:
        return {role: svc.proc.pid for role, svc in self.services.items() if svc.proc is not None}

    def wait_drained(self, timeout: float = 30.0) -> float:
        """Until ZCCP holds no request of a previous run (no slot claimed or busy in /health),
        so that one wrk run never meets the last one's requests; the seconds waited. The
        other variants have no such state to wait for."""
        if self.key != "D":
            return 0.0
        start = time.monotonic()
        while True:
            # the slot counts are on the admin listener's /health (the public one says ok or not)
            status, body = request_to(str(self.info["admin_listen"]), {}, "GET", "/health", timeout=2)
            h = json.loads(body) if status == 200 else {}
            if h.get("slots_claimed") == 0 and h.get("slots_busy") == 0:
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise RuntimeError(f"ZCCP did not drain within {timeout} s: {status} {body[:300]!r}")
            time.sleep(0.01)


def _wait_http(url: str, svc: Service, what: str, timeout: float = 60) -> None:
    def ok() -> bool:
        try:
            return http_get(url, 1.0)[0] == 200
        except OSError:
            return False

    svc.wait_until(ok, timeout, what)


# (certificate, key): the variant's listener is HTTPS with HTTP/2 (bench/h2tls.py), as
# ZCCP's own with server.tls.
Tls = tuple[Path, Path]


def _tls_listen(text: str, listen: str, tls: Tls) -> str:
    """A and B's `listen` line made `ssl http2`, with the directives ZCCP's standalone renders."""
    line = f"listen {listen};"
    assert text.count(line) == 1, text
    cert, key = tls
    return text.replace(line, f"listen {listen} ssl http2;\n        ssl_certificate {cert};\n"
                              f"        ssl_certificate_key {key};\n        ssl_protocols TLSv1.2 TLSv1.3;\n"
                              "        ssl_session_cache shared:bench_tls:10m;")


def _nginx_from_template(template: str, run_dir: Path, values: dict[str, str], workers: int,
                         tls: Tls | None = None) -> tuple[Service, str]:
    prefix = run_dir / "nginx"
    for sub in ("logs", "tmp/body", "tmp/proxy", "tmp/fastcgi", "tmp/uwsgi", "tmp/scgi"):
        (prefix / sub).mkdir(parents=True, exist_ok=True)
    port = free_port()
    values = dict(values, prefix=str(prefix), workers=str(workers), listen=f"127.0.0.1:{port}",
                  user_line=f"user {getpass.getuser()};" if os.geteuid() == 0 else "")
    text = (BENCH / "nginx" / template).read_text()
    for k, v in values.items():
        text = text.replace("{{" + k + "}}", v)
    assert "{{" not in text, text
    if tls:
        text = _tls_listen(text, values["listen"], tls)
    conf = prefix / "nginx.conf"
    conf.write_text(text)
    exe = shutil.which("nginx") or "/usr/sbin/nginx"
    svc = Service("nginx", [exe, "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"],
                  run_dir / "logs" / "nginx.log", stop_signal=signal.SIGQUIT)
    svc.start()
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    _wait_http(url + "/health", svc, "nginx /health")
    return svc, url


def start_a(run_dir: Path, lim: dict, reply: bytes, tls: Tls | None = None) -> Variant:
    run_dir.mkdir(parents=True, exist_ok=True)
    reply_file = run_dir / "reply.json"
    reply_file.write_bytes(reply)
    nginx, url = _nginx_from_template("ceiling.conf.in", run_dir, {
        "reply_file": str(reply_file), "max_body": str(lim["max_body_kb"] * 1024)}, lim["workers"], tls)
    return Variant("A", url, {"nginx": nginx})


def app_env(lim: dict) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "ZCCP_BENCH_BACKEND": lim["backend"],
        "ZCCP_BENCH_MODEL_NAME": lim["model_name"],
        "ZCCP_BENCH_MAX_CONTEXT": str(lim["max_context"]),
        "ZCCP_BENCH_TOKENS_CAP": str(lim["tokens_kb"] * 256),
        "ZCCP_BENCH_MAX_TOKENS_CAP": "4096",
        "ZCCP_BENCH_MODEL_PATH": lim.get("model_extra", {}).get("path", ""),
        "PYTHONPATH": str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": "1",
    })
    return env


def _start_proxied(name: str, label: str, cmd: list[str], log: str, run_dir: Path, lim: dict,
                   workers: int, env: dict[str, str] | None = None, tls: Tls | None = None) -> Variant:
    """A Python app server on a free port, behind nginx proxy_pass (upstream keepalive)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    app = Service("backend", [c.replace("{port}", str(port)) for c in cmd], run_dir / "logs" / log,
                  env=dict(app_env(lim), **(env or {})))
    app.start()
    _wait_http(f"http://127.0.0.1:{port}/health", app, f"{label} /health", 120)
    nginx, url = _nginx_from_template("proxy.conf.in", run_dir, {
        "upstream": f"127.0.0.1:{port}", "max_body": str(lim["max_body_kb"] * 1024)}, lim["workers"], tls)
    return Variant(name, url, {"nginx": nginx, "backend": app}, {"app_workers": workers})


def _uvicorn(app: str, workers: int) -> list[str]:
    """FastAPI on uvicorn (uvloop + httptools, the 'standard' extras), access log off."""
    return [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", "{port}",
            "--workers", str(workers), "--no-access-log", "--log-level", "warning"]


def start_b(run_dir: Path, lim: dict, workers: int, tls: Tls | None = None) -> Variant:
    return _start_proxied("B", "uvicorn", _uvicorn("bench.apps.fastapi_app:app", workers), "uvicorn.log",
                          run_dir, lim, workers, tls=tls)


def start_b_cache(run_dir: Path, lim: dict, workers: int) -> Variant:
    """B with an exact Redis cache in front of the same work (bench/apps/fastapi_cache_app.py)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    url = f"redis://127.0.0.1:{free_port()}/0"
    redis = redis_service(url, run_dir)
    try:
        v = _start_proxied("B-cache", "uvicorn", _uvicorn("bench.apps.fastapi_cache_app:app", workers),
                           "uvicorn.log", run_dir, lim, workers, {"ZCCP_BENCH_REDIS_URL": url})
    except Exception:
        redis.stop()
        raise
    v.services["redis"] = redis
    return v


def start_c(run_dir: Path, lim: dict, workers: int) -> Variant:
    """Flask on gunicorn sync workers (gunicorn's defaults otherwise: no access log)."""
    cmd = [sys.executable, "-m", "gunicorn", "-k", "sync", "-w", str(workers), "-b", "127.0.0.1:{port}",
           "--timeout", "120", "--log-level", "warning", "bench.apps.flask_app:app"]
    return _start_proxied("C", "gunicorn", cmd, "gunicorn.log", run_dir, lim, workers)


def start_d(run_dir: Path, lim: dict, slots: int, tls: Tls | None = None, replicas: int = 0,
            routing: dict | None = None) -> Variant:
    """The real ZCCP stack: redis + engine + nginx, everything on (cache enabled); tls:
    server.tls (HTTPS + HTTP/2); replicas: that many engines of the one model under one
    nginx (an `engines:` list r1, r2, ..., each with `slots` slots; bench/replicas.py),
    their services "engine-r1", "engine-r2", ...; 0: one engine, no `engines:` list;
    routing: config.yaml's routing section (None: the default, affinity)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:10]
    raw = {
        "server": {"listen": f"127.0.0.1:{free_port()}", "workers": lim["workers"],
                   "socket_path": f"/tmp/zccp-bench-{tag}/doorbell.sock"},
        "shared_memory": {"name": f"/zccp.bench.{tag}", "segment_count": slots,
                          "segment_size_kb": lim["segment_size_kb"], "tokens_kb": lim["tokens_kb"],
                          "response_kb": lim["response_kb"]},
        "cache": {"enabled": True, "redis_url": f"redis://127.0.0.1:{free_port()}/0", **lim.get("cache_extra", {})},
        "model": {"backend": lim["backend"], "name": lim["model_name"], "max_context": lim["max_context"],
                  "threads": lim.get("threads", 1), **lim.get("model_extra", {})},
        "limits": {"max_body_kb": lim["max_body_kb"], "request_timeout_ms": 60000},
        "logging": {"level": lim.get("engine_log_level", "warning")},
    }
    if tls:
        raw["server"]["tls"] = {"certificate": str(tls[0]), "key": str(tls[1])}
    if "engine_processes" in lim:     # only when asked: bench/engine_ab.py runs older trees' engines
        raw["server"]["engine_processes"] = lim["engine_processes"]
    if replicas:
        raw["engines"] = [{"name": f"r{i + 1}"} for i in range(replicas)]
    if routing:
        raw["routing"] = routing
    config_path = run_dir / "config.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    cfg = resolve(load_config(config_path), run_dir)
    services: dict[str, Service] = {}
    try:
        services["redis"] = redis_service(cfg.cache.redis_url, run_dir)
        env = {"OMP_NUM_THREADS": str(lim.get("threads", 1))}
        if cfg.engines:
            for (svc, _), e in zip(engine_services(config_path, cfg, run_dir, env), cfg.engines, strict=True):
                services[f"engine-{e.name}"] = svc
        else:   # engine_service by name: bench/engine_ab.py swaps it for another tree's
            services["engine"] = engine_service(config_path, cfg, run_dir, env)
        services["nginx"], _ = nginx_service(cfg, run_dir)
    except Exception:
        for svc in reversed(list(services.values())):
            svc.stop()
        raise
    url = f"{'https' if tls else 'http'}://{cfg.server.listen}"
    end = time.monotonic() + 20
    while time.monotonic() < end:
        if http_get(url + "/health", 2)[0] == 200:
            break
        time.sleep(0.1)
    return Variant("D", url, services, {"config": raw, "socket_dir": str(Path(cfg.server.socket_path or "").parent),
                                        "admin_listen": cfg.server.admin_listen or ""})


def post(url: str, body: bytes, headers: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url + "/v1/messages", data=body, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()
