"""Starting and stopping the real services: redis-server, the engine, nginx.

Used by `zccp-stack up` (the README's first command) and by the test suite, so
the tests run exactly the processes a user runs. Everything binds to loopback.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from zccp.abi import NOTICE_SIZE, Op
from zccp.config import Config
from zccp.doorbell import decode_notice, encode_ring
from zccp.nginx_conf import RenderedNginx, render


class StackError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


@dataclass
class Service:
    name: str
    cmd: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    stop_signal: int = signal.SIGTERM

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

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
                raise StackError(f"{self.name} exited while starting ({what}):\n{_tail(self.log_path)}")
            if ready():
                return
            time.sleep(0.05)
        raise StackError(f"{self.name} not ready after {timeout}s ({what}):\n{_tail(self.log_path)}")


def redis_service(url: str, run_dir: Path) -> Service:
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
                            "--dir", str(data), "--daemonize", "no"], run_dir / "logs" / "redis.log")
    svc.start()

    def ping() -> bool:
        with contextlib.suppress(OSError), socket.create_connection((host, port), 0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
        return False

    svc.wait_until(ping, 15, f"PING on {host}:{port}")
    return svc


def engine_ping(socket_path: str, timeout: float = 1.0) -> int | None:
    """The engine's epoch if it answers a PING on its doorbell, else None."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(socket_path)
            s.sendall(encode_ring(Op.PING, 0, 0))
            data = b""
            while len(data) < NOTICE_SIZE:
                chunk = s.recv(NOTICE_SIZE - len(data))
                if not chunk:
                    return None
                data += chunk
    except OSError:
        return None
    n = decode_notice(data)
    return int(n.generation) if n.op == Op.PONG else None


def engine_service(config_path: Path, cfg: Config, run_dir: Path, extra_env: dict[str, str] | None = None) -> Service:
    env = dict(os.environ)
    # The engine runs the same zccp package as the caller (this checkout).
    pkg_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH", "")) if p)
    env.update(extra_env or {})
    svc = Service("engine", [sys.executable, "-m", "zccp.cli", "engine", "--config", str(config_path)],
                  run_dir / "logs" / "engine.log", env=env)
    svc.start()
    svc.wait_until(lambda: engine_ping(cfg.server.socket_path) is not None, 120, "doorbell PING")
    return svc


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def nginx_service(cfg: Config, run_dir: Path) -> tuple[Service, RenderedNginx]:
    exe = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(exe):
        raise StackError("nginx not found (apt-get install nginx libnginx-mod-http-lua)")
    rendered = render(cfg, run_dir / "nginx", standalone=True, prefix=run_dir / "nginx")
    assert rendered.nginx_conf is not None and rendered.prefix is not None
    test = subprocess.run([exe, "-t", "-q", "-p", str(rendered.prefix), "-c", str(rendered.nginx_conf)],
                          capture_output=True, text=True)
    if test.returncode != 0:
        raise StackError(f"nginx -t failed:\n{test.stderr}")
    svc = Service("nginx", [exe, "-p", str(rendered.prefix), "-c", str(rendered.nginx_conf), "-g", "daemon off;"],
                  run_dir / "logs" / "nginx.log", stop_signal=signal.SIGQUIT)
    svc.start()
    host, _, port = cfg.server.listen.rpartition(":")
    url = f"http://{host or '127.0.0.1'}:{port}/health"

    def listening() -> bool:
        with contextlib.suppress(OSError):
            http_get(url, 1.0)
            return True
        return False

    svc.wait_until(listening, 20, f"HTTP on {cfg.server.listen}")
    return svc, rendered


def base_url(cfg: Config) -> str:
    host, _, port = cfg.server.listen.rpartition(":")
    return f"http://{host or '127.0.0.1'}:{port}"
