"""Starting and stopping the real services: redis-server, the engine, nginx.

Used by `zccp-stack up` (the README's first command) and by the test suite, so
the tests run exactly the processes a user runs. Everything binds to loopback.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from zccp.config import CacheConfig, Config, for_engine
from zccp.transport.doorbell import engine_ping
from zccp.ops.nginx_conf import RenderedNginx, render
from zccp.config.runtime import log_dir
from zccp.process.parent_death import die_with


class StackError(RuntimeError):
    pass


_HANDED: set[int] = set()   # ports this process already gave out (not bound yet, perhaps)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback TCP port free now, for a service that binds it a moment later.

    Taken below the kernel's ephemeral range: a port the kernel itself handed out (bind to
    0) can be handed again to any outgoing connection before the service binds it, which
    is the EADDRINUSE a test run once hit. Ports given once are not given again here.
    """
    low = max(_ephemeral_low(), 2048)
    start = 1024 + (os.getpid() * 7919) % (low - 1024)
    for i in range(low - 1024):
        port = 1024 + (start - 1024 + i * 7) % (low - 1024)
        if port in _HANDED:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED.add(port)
        return port
    with socket.socket() as s:   # the low range is full: the kernel's choice, as before
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path | None, n: int = 30) -> str:
    if path is None:
        return "(its output is above)"
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


@dataclass
class Service:
    """One child process, its output appended to its log (None: this process's own stdout and
    stderr, e.g. the journal). Start it from the thread that will outlive it (the main
    thread): it is stopped when that thread goes."""

    name: str
    cmd: list[str]
    log_path: Path | None
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    stop_signal: int = signal.SIGTERM
    stdin_pipe: bool = False      # a standby engine waits for its word on stdin
    started_at: float = field(default=0.0, init=False)

    def start(self) -> None:
        log = None
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT if log else None, env=self.env,
                                     stdin=subprocess.PIPE if self.stdin_pipe else subprocess.DEVNULL,
                                     start_new_session=True,
                                     preexec_fn=functools.partial(die_with, os.getpid()))
        if log is not None:
            log.close()
        self.started_at = time.monotonic()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def exit_reason(self) -> str:
        """How it ended, in words: 'exit status 1', 'killed by SIGKILL'."""
        rc = self.proc.returncode if self.proc is not None else None
        if rc is None:
            return "still running"
        if rc < 0:
            return f"killed by {signal.Signals(-rc).name}"
        return f"exit status {rc}"

    def stop(self, timeout: float = 10.0) -> None:
        if not self.alive:
            return
        assert self.proc is not None
        self.proc.send_signal(self.stop_signal)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)

    def kill(self) -> None:
        """SIGKILL: a crash, for fault-injection tests."""
        if self.alive:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(5)

    def wait_until(self, ready, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not self.alive:
                raise StackError(f"{self.name} exited while starting ({what}, {self.exit_reason()}):\n"
                                 f"{_tail(self.log_path)}")
            if ready():
                return
            time.sleep(0.05)
        raise StackError(f"{self.name} not ready after {timeout}s ({what}):\n{_tail(self.log_path)}")


def _host_port(addr: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return (host.strip("[]") or default_host), int(port)


def ensure_free(addr: str, what: str) -> None:
    """Refuse to start on an address something already listens on: the port check comes
    first, so that a second stack never touches the first one's redis, arena or nginx."""
    host, port = _host_port(addr)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as nginx and redis bind
        try:
            s.bind((host, port))
        except OSError as exc:
            raise StackError(f"{what} {host}:{port}: {exc.strerror} (another ZCCP stack or server is "
                             f"listening there; stop it or choose another port)") from None


def redis_service(url: str, run_dir: Path, maxmemory_mb: int = CacheConfig.redis_maxmemory_mb,
                  policy: str = CacheConfig.redis_maxmemory_policy) -> Service:
    """A cache-only Redis on loopback: no persistence, bounded memory (cache.redis_maxmemory_mb,
    evicting by cache.redis_maxmemory_policy)."""
    u = urlparse(url)
    host, port = u.hostname or "127.0.0.1", u.port or 6379
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise StackError(f"cache.redis_url {url}: the stack only starts a redis on loopback")
    exe = shutil.which("redis-server")
    if not exe:
        raise StackError("redis-server not found (apt-get install redis-server)")
    data = run_dir / "redis"
    data.mkdir(parents=True, exist_ok=True)
    svc = Service("redis", [exe, "--bind", host, "--port", str(port), "--save", "", "--appendonly", "no",
                            "--maxmemory", f"{maxmemory_mb}mb", "--maxmemory-policy", policy,
                            "--dir", str(data), "--daemonize", "no"], log_dir(run_dir) / "redis.log")
    svc.start()

    def ping() -> bool:
        with contextlib.suppress(OSError), socket.create_connection((host, port), 0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
        return False

    svc.wait_until(ping, 15, f"PING on {host}:{port}")
    return svc


def engine_service(config_path: Path, cfg: Config, run_dir: Path, extra_env: dict[str, str] | None = None,
                   wait: bool = True, name: str | None = None) -> Service:
    """The engine for `cfg` (resolved for run_dir: the engine resolves the same); name: the
    entry of cfg.engines it serves (its log: engine-<name>.log)."""
    env = dict(os.environ)
    # The engine runs the same zccp package as the caller (this checkout: engine/, above zccp/ops/).
    pkg_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH", "")) if p)
    env.update(extra_env or {})
    cmd = [sys.executable, "-m", "zccp.ops.cli", "engine", "--config", str(config_path), "--run-dir", str(run_dir)]
    if name is not None:
        cmd += ["--engine", name]
    svc = Service(f"engine {name}" if name else "engine", cmd,
                  log_dir(run_dir) / (f"engine-{name}.log" if name else "engine.log"), env=env)
    svc.start()
    if wait:
        wait_for_engine(svc, for_engine(cfg, name) if name else cfg)
    return svc


def engine_services(config_path: Path, cfg: Config, run_dir: Path, extra_env: dict[str, str] | None = None
                    ) -> list[tuple[Service, str]]:
    """Every engine of cfg, started (one, or each of engines:) and pinged: (service, its doorbell).
    Started together, then waited for: their models load side by side."""
    if not cfg.engines:
        return [(engine_service(config_path, cfg, run_dir, extra_env), cfg.server.socket_path or "")]
    started = [(engine_service(config_path, cfg, run_dir, extra_env, wait=False, name=e.name), e)
               for e in cfg.engines]
    try:
        for svc, e in started:
            wait_for_engine(svc, for_engine(cfg, e.name))
    except BaseException:
        for svc, _ in started:
            svc.stop()
        raise
    return [(svc, e.socket_path or "") for svc, e in started]


def wait_for_engine(svc: Service, cfg: Config, timeout: float = 120) -> None:
    assert cfg.server.socket_path is not None
    svc.wait_until(lambda: engine_ping(cfg.server.socket_path) is not None, timeout, "doorbell PING")


def loopback_tls() -> ssl.SSLContext:
    """For this host's own calls to its own listener (health, L1 purge) only: the
    certificate names the public host, not 127.0.0.1, so it is not checked here."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def local_urlopen(req: str | urllib.request.Request, timeout: float) -> Any:
    """urlopen for a URL of base_url(): HTTPS without checking the certificate (loopback_tls)."""
    url = req if isinstance(req, str) else req.full_url
    return urllib.request.urlopen(req, timeout=timeout,
                                  context=loopback_tls() if url.startswith("https:") else None)


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with local_urlopen(url, timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def nginx_paths(run_dir: Path) -> tuple[Path, Path]:
    """The stack's nginx prefix and its nginx.conf."""
    prefix = run_dir / "nginx"
    return prefix, prefix / "nginx.conf"


def nginx_service(cfg: Config, run_dir: Path) -> tuple[Service, RenderedNginx]:
    exe = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(exe):
        raise StackError("nginx not found (apt-get install nginx libnginx-mod-http-lua)")
    prefix, _ = nginx_paths(run_dir)
    try:   # the admin surface's guards among them: the token file's mode, the socket's directory
        rendered = render(cfg, prefix, standalone=True, prefix=prefix, log_dir=log_dir(run_dir))
    except ValueError as exc:
        raise StackError(f"nginx's configuration: {exc}") from None
    assert rendered.nginx_conf is not None and rendered.prefix is not None
    test = subprocess.run([exe, "-t", "-q", "-p", str(rendered.prefix), "-c", str(rendered.nginx_conf)],
                          capture_output=True, text=True)
    if test.returncode != 0:
        raise StackError(f"nginx -t failed:\n{test.stderr}")
    # Its stderr (what it says before its error_log is open) goes to that same file.
    svc = Service("nginx", [exe, "-p", str(rendered.prefix), "-c", str(rendered.nginx_conf), "-g", "daemon off;"],
                  log_dir(run_dir) / "nginx-error.log", stop_signal=signal.SIGQUIT)
    svc.start()
    from zccp.ops.nginx_conf import health_path

    url = base_url(cfg) + health_path(cfg, standalone=True)

    def listening() -> bool:
        with contextlib.suppress(OSError):
            http_get(url, 1.0)
            return True
        return False

    svc.wait_until(listening, 20, f"HTTP on {cfg.server.listen}")
    return svc, rendered


def base_url(cfg: Config) -> str:
    host, port = _host_port(cfg.server.listen, "127.0.0.1")
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    scheme = "https" if cfg.server.tls is not None else "http"
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


# -- reloading the masks -------------------------------------------------------------------


@dataclass(frozen=True)
class MasksInForce:
    digest: str
    patterns: int
    errors: tuple[str, ...]      # "name: message" of each pattern nginx refused
    worker_pid: int


def _nginx_master(run_dir: Path) -> int:
    prefix, _ = nginx_paths(run_dir)
    pid_file = prefix / "nginx.pid"
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        raise StackError(f"no running stack in {run_dir} (no live nginx behind {pid_file})") from None
    return pid


def _workers_of(pid: int) -> set[int]:
    try:
        return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()


def reload_masks(cfg: Config, run_dir: Path, timeout: float = 20.0) -> MasksInForce:
    """Reload the running stack's nginx (SIGHUP to its master: what `nginx -s reload` does,
    without needing the stack's -p and -c) and return the mask set its new workers have in
    force. nginx writes that set to its last-good file as it loads it, and every request
    names it in its slot: the engine switches to it with the first such request."""
    master = _nginx_master(run_dir)
    old = _workers_of(master)
    os.kill(master, signal.SIGHUP)
    from zccp.ops.admin_client import admin_request

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with contextlib.suppress(OSError, ValueError):
            _, body = admin_request(cfg, "GET", "/health", timeout=2.0)   # the details are the admin's
            h = json.loads(body)
            masks = h.get("masks") or {}
            if h.get("worker_pid") not in old and "digest" in masks:
                return MasksInForce(masks["digest"], int(masks["patterns"]),
                                    tuple(f"{e['name']}: {e['message']}" for e in masks.get("errors", [])),
                                    int(h["worker_pid"]))
        time.sleep(0.1)
    raise StackError(f"nginx did not answer from new workers within {timeout:.0f} s after the reload; "
                     f"see {log_dir(run_dir) / 'nginx-error.log'}")
