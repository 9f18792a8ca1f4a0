"""Brings up a real stack (redis, engine, nginx) on free loopback ports for a test.

Each Stack gets its own run directory, shm name, doorbell socket and ports, so
stacks never see each other; the processes are the ones a user runs
(zccp.ops.stack), nothing is mocked.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.leftovers import ARENAS, SOCKET_DIRS, arena_names, remove_arenas
from tests.support.checkout import REPO
from zccp.transport.arena_reader import ArenaReader
from zccp.config import Config, for_engine, load_config
from zccp.config.runtime import log_dir, resolve
from zccp.ops.stack import Service, engine_service, engine_services, free_port, nginx_service, redis_service
from zccp.ops.stack import _nginx_master, _workers_of


_CERT: tuple[Path, Path] | None = None


def self_signed_certificate() -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost (EC P-256, made once per test
    session with openssl): (certificate, key). Its directory goes with the socket dirs."""
    global _CERT
    if _CERT is None:
        d = Path(f"/tmp/zccp-test-tls-{uuid.uuid4().hex[:10]}")
        d.mkdir(mode=0o755)
        SOCKET_DIRS.append(d)
        cert, key = d / "cert.pem", d / "key.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-days", "2", "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert),
                        "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True, capture_output=True)
        _CERT = (cert, key)
    return _CERT


def tls_client_context() -> ssl.SSLContext:
    """A client context that trusts self_signed_certificate() and nothing else (names checked)."""
    return ssl.create_default_context(cafile=str(self_signed_certificate()[0]))


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for section, values in extra.items():
        if not isinstance(values, dict):   # engines: a list, placement: a word; given whole
            out[section] = values
        else:
            out.setdefault(section, {}).update(values)
    return out


@dataclass
class Stack:
    run_dir: Path
    overrides: dict[str, Any] = field(default_factory=dict)
    with_redis: bool = False
    tls: bool = False            # HTTPS + HTTP/2 on the listener (server.tls, self_signed_certificate)
    health_path: str = "/health"   # the public health check (included in an existing server: /zccp/health)
    cfg: Config = field(init=False)
    config_path: Path = field(init=False)
    engine: Service | None = field(default=None, init=False)   # the (first) engine
    engines: dict[str, Service] = field(default_factory=dict, init=False)   # by name, with engines:
    nginx: Service | None = field(default=None, init=False)
    redis: Service | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        tag = uuid.uuid4().hex[:10]
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # The socket lives outside pytest's private (0700) temp tree, where nginx's
        # unprivileged workers can reach it; stop() removes the directory.
        self.socket_dir = Path(f"/tmp/zccp-test-{tag}")
        SOCKET_DIRS.append(self.socket_dir)
        raw = {
            "server": {"listen": f"127.0.0.1:{free_port()}", "workers": 2,
                       "socket_path": str(self.socket_dir / "doorbell.sock"), "connect_timeout_ms": 500},
            "shared_memory": {"name": f"/zccp.test.{tag}", "segment_count": 8, "cleanup_interval_ms": 30000},
            # sampled: "on": the cache tests send the APIs' default temperature (1); the
            # product's default ("off") is tested in tests/integration/test_cache_sampled.py
            "cache": {"enabled": self.with_redis, "redis_url": f"redis://127.0.0.1:{free_port()}/0",
                      "sampled": "on"},
            "model": {"backend": "tiny", "name": "zccp-tiny", "max_context": 4096},
            "limits": {"max_body_kb": 256, "request_timeout_ms": 20000},
            # access_flush_ms 0: a test reads an access-log line as soon as its answer is out
            # (the buffered default: tests/integration/test_log_fields.py)
            "logging": {"level": "info", "access_flush_ms": 0},
        }
        if self.tls:
            cert, key = self_signed_certificate()
            raw["server"]["tls"] = {"certificate": str(cert), "key": str(key)}
        raw = _merge(raw, self.overrides)
        self.config_path = self.run_dir / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(raw))
        self.cfg = resolve(load_config(self.config_path), self.run_dir)
        ARENAS.extend(arena_names(self.cfg))

    # -- processes ----------------------------------------------------------------------

    def start(self) -> Stack:
        if self.with_redis:
            self.redis = redis_service(self.cfg.cache.redis_url, self.run_dir, self.cfg.cache.redis_maxmemory_mb,
                                       self.cfg.cache.redis_maxmemory_policy)
        self.start_engine()
        self.nginx, _ = nginx_service(self.cfg, self.run_dir)
        self.wait_healthy()
        return self

    def start_engine(self) -> None:
        if not self.cfg.engines:
            self.engine = engine_service(self.config_path, self.cfg, self.run_dir)
            return
        started = engine_services(self.config_path, self.cfg, self.run_dir)
        self.engines = {e.name: svc for (svc, _), e in zip(started, self.cfg.engines, strict=True)}
        self.engine = started[0][0]

    def start_named(self, name: str) -> None:
        """(Re)start engine `name` of engines: and wait until it answers."""
        self.engines[name] = engine_service(self.config_path, self.cfg, self.run_dir, name=name)

    def stop_engine(self, crash: bool = False) -> None:
        if self.engine is not None:
            self.engine.kill() if crash else self.engine.stop()

    def stop(self) -> None:
        for svc in (self.nginx, *self.engines.values(), self.engine, self.redis):
            if svc is not None:
                svc.stop()
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        remove_arenas(arena_names(self.cfg))     # what a killed engine left

    def hup_nginx(self, timeout: float = 60) -> None:
        """A bare SIGHUP to nginx's master (no render, no check), returning once every worker it
        had has exited: from then on every answer is the new configuration's (before, another
        old worker, with another pid, could still answer)."""
        import signal

        master = _nginx_master(self.run_dir)

        def workers() -> set[int]:
            return {p for p in _workers_of(master) if alive(p)}

        old = workers()
        os.kill(master, signal.SIGHUP)
        end = time.monotonic() + timeout
        while workers() & old or not workers():
            assert time.monotonic() < end, "nginx's old workers did not exit after SIGHUP"
            time.sleep(0.05)

    def wait_healthy(self, timeout: float = 20) -> dict[str, Any]:
        end = time.monotonic() + timeout
        last = None
        while time.monotonic() < end:
            try:
                r = httpx.get(self.url(self.health_path), timeout=5, verify=self.verify)
            except httpx.TransportError:   # a just (re)started nginx that does not listen yet
                time.sleep(0.1)
                continue
            last = r
            if r.status_code == 200:
                return r.json()
            time.sleep(0.1)
        raise AssertionError(f"stack not healthy: {last.status_code if last else '?'} {last.text if last else ''}")

    # -- access -------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.cfg.server.listen}"

    @property
    def verify(self) -> ssl.SSLContext | bool:
        """httpx's verify= for this stack: its test certificate, checked, over TLS."""
        return tls_client_context() if self.tls else True

    @property
    def protocol(self) -> str:
        """What client() speaks to this stack: "HTTP/1.1" or "HTTP/2" (httpx's http_version)."""
        return "HTTP/2" if self.tls else "HTTP/1.1"

    def url(self, path: str) -> str:
        return self.base_url + path

    def client(self, **kw: Any) -> httpx.Client:
        """httpx to this stack: HTTP/1.1 in clear, or HTTP/2 over TLS (ALPN) for a tls stack."""
        return httpx.Client(base_url=self.base_url, timeout=kw.pop("timeout", 30), http2=self.tls,
                            verify=self.verify, **kw)

    def admin_client(self, **kw: Any) -> httpx.Client:
        """The admin listener (server.admin_listen: purge, warm-up, keys, /metrics), with the token."""
        from zccp.ops.admin_client import admin_headers

        listen = self.cfg.server.admin_listen or ""
        headers = {**admin_headers(self.cfg), **kw.pop("headers", {})}
        if listen.startswith("unix:"):
            return httpx.Client(base_url="http://zccp-admin", transport=httpx.HTTPTransport(uds=listen[5:]),
                                headers=headers, timeout=kw.pop("timeout", 30), **kw)
        return httpx.Client(base_url=f"http://{listen}", headers=headers, timeout=kw.pop("timeout", 30), **kw)

    def arena(self, engine: str | None = None) -> ArenaReader:
        """The arena of the one engine, or of engine `engine` of engines:."""
        if engine is None:
            return ArenaReader(self.cfg.shared_memory.name)
        return ArenaReader(for_engine(self.cfg, engine).shared_memory.name)

    def health(self) -> dict[str, Any]:
        """The admin listener's /health: pids, epoch, slot counts, masks (the public one says ok or not)."""
        with self.admin_client(timeout=5) as c:
            return c.get("/health").json()

    def assert_no_leaks(self, timeout: float = 5.0) -> None:
        """Every slot FREE in shared memory and unclaimed in nginx's dict."""
        end = time.monotonic() + timeout
        while True:
            h = self.health()
            busy = []
            for name in [e.name for e in self.cfg.engines] or [None]:
                try:
                    reader = self.arena(name)
                except Exception:   # an engine of engines: that is down has no arena
                    continue
                try:
                    busy += [s for s in reader.slots() if s.state != 0]
                finally:
                    reader.close()
            if h.get("slots_claimed") == 0 and not busy:
                return
            if time.monotonic() > end:
                raise AssertionError(f"leaked slots: claimed={h.get('slots_claimed')} busy={busy}")
            time.sleep(0.05)

    def log(self, name: str) -> str:
        """One of the stack's logs (engine.log, redis.log, nginx-error.log, nginx-access.log)."""
        p = log_dir(self.run_dir) / name
        return p.read_text(errors="replace") if p.exists() else ""

    def error_log(self) -> str:
        return self.log("nginx-error.log")

    def engine_log(self) -> str:
        return self.log("engine.log")


def sdk_clients(stack: Stack, timeout: float = 60) -> tuple[Any, Any]:
    """The official anthropic and openai SDK clients, unmodified, pointed at a stack; over
    TLS each gets an http_client speaking HTTP/2 (what both SDKs accept)."""
    import anthropic
    import openai

    def http(kind: Any) -> dict[str, Any]:
        return {"http_client": kind(http2=True, verify=stack.verify, timeout=timeout)} if stack.tls else {}

    return (anthropic.Anthropic(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=timeout,
                                **http(anthropic.DefaultHttpxClient)),
            openai.OpenAI(base_url=stack.base_url + "/v1", api_key="unused", max_retries=0, timeout=timeout,
                          **http(openai.DefaultHttpxClient)))


def anthropic_body(text: str = "Hello", max_tokens: int = 16, **extra: Any) -> dict[str, Any]:
    body = {"model": "zccp-tiny", "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}]}
    body.update(extra)
    return body


def dumps(obj: Any) -> bytes:
    return json.dumps(obj).encode()


os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")


@dataclass
class StackProcess:
    """`zccp-stack up` itself, as a user runs it (this checkout's package), for the tests of
    its own life cycle: supervision, signals, exit status. stop() ends it and anything it
    left, by pid."""

    stack: Stack                  # only for its isolated config (ports, shm name, socket)
    proc: Any = field(default=None, init=False)
    output: Path = field(init=False)

    def __post_init__(self) -> None:
        self.output = self.stack.run_dir / "zccp-stack.out"

    def start(self, wait: bool = True, timeout: float = 120) -> StackProcess:
        import subprocess
        import sys

        env = dict(os.environ, PYTHONPATH=str(REPO / "engine"))
        with open(self.output, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "zccp.ops.cli", "stack", "up", "--config",
                                          str(self.stack.config_path), "--run-dir", str(self.stack.run_dir)],
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)
        if wait:
            end = time.monotonic() + timeout
            while True:
                assert self.proc.poll() is None, f"zccp-stack exited {self.proc.returncode}:\n{self.text()}"
                try:
                    if httpx.get(self.stack.url("/health"), timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < end, f"stack not healthy:\n{self.text()}"
                time.sleep(0.2)
        return self

    def text(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def descendants(self) -> set[int]:
        """Every process below zccp-stack (redis, the engine, nginx and its workers)."""
        out, todo = set(), [self.proc.pid]
        while todo:
            pid = todo.pop()
            try:
                kids = [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
            except OSError:
                continue
            out.update(kids)
            todo += kids
        return out

    def stop(self) -> None:
        import signal

        if self.proc is None:
            return
        left = self.descendants()
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(30)
            except Exception:
                self.proc.kill()
                self.proc.wait(10)
        for pid in left:          # only what this stack started, should anything remain
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.stack.socket_dir, ignore_errors=True)
        remove_arenas(arena_names(self.stack.cfg))   # what a killed engine left


def alive(pid: int) -> bool:
    """Whether pid runs (a zombie does not count)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False
