"""Brings up a real stack (redis, engine, nginx) on free loopback ports for a test.

Each Stack gets its own run directory, shm name, doorbell socket and ports, so
stacks never see each other; the processes are the ones a user runs
(zccp.stack), nothing is mocked.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from zccp.arena_reader import ArenaReader
from zccp.config import Config, load_config
from zccp.stack import Service, engine_service, free_port, nginx_service, redis_service


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for section, values in extra.items():
        out.setdefault(section, {}).update(values)
    return out


@dataclass
class Stack:
    run_dir: Path
    overrides: dict[str, Any] = field(default_factory=dict)
    with_redis: bool = False
    cfg: Config = field(init=False)
    config_path: Path = field(init=False)
    engine: Service | None = field(default=None, init=False)
    nginx: Service | None = field(default=None, init=False)
    redis: Service | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        tag = uuid.uuid4().hex[:10]
        self.run_dir.mkdir(parents=True, exist_ok=True)
        raw = {
            "server": {"listen": f"127.0.0.1:{free_port()}", "workers": 2,
                       "socket_path": f"/tmp/zccp-test-{tag}/doorbell.sock", "connect_timeout_ms": 500},
            "shared_memory": {"name": f"/zccp.test.{tag}", "segment_count": 8, "cleanup_interval_ms": 30000},
            "cache": {"enabled": self.with_redis, "redis_url": f"redis://127.0.0.1:{free_port()}/0"},
            "model": {"backend": "tiny", "name": "zccp-tiny", "max_context": 4096},
            "limits": {"max_body_kb": 256, "request_timeout_ms": 20000},
            "logging": {"level": "info"},
        }
        raw = _merge(raw, self.overrides)
        self.config_path = self.run_dir / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(raw))
        self.cfg = load_config(self.config_path)

    # -- processes ----------------------------------------------------------------------

    def start(self) -> Stack:
        if self.with_redis:
            self.redis = redis_service(self.cfg.cache.redis_url, self.run_dir)
        self.start_engine()
        self.nginx, _ = nginx_service(self.cfg, self.run_dir)
        self.wait_healthy()
        return self

    def start_engine(self) -> None:
        self.engine = engine_service(self.config_path, self.cfg, self.run_dir)

    def stop_engine(self, crash: bool = False) -> None:
        if self.engine is not None:
            self.engine.kill() if crash else self.engine.stop()

    def stop(self) -> None:
        for svc in (self.nginx, self.engine, self.redis):
            if svc is not None:
                svc.stop()

    def wait_healthy(self, timeout: float = 20) -> dict[str, Any]:
        end = time.monotonic() + timeout
        last = None
        while time.monotonic() < end:
            r = httpx.get(self.url("/health"), timeout=5)
            last = r
            if r.status_code == 200:
                return r.json()
            time.sleep(0.1)
        raise AssertionError(f"stack not healthy: {last.status_code if last else '?'} {last.text if last else ''}")

    # -- access -------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.cfg.server.listen}"

    def url(self, path: str) -> str:
        return self.base_url + path

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=kw.pop("timeout", 30), **kw)

    def arena(self) -> ArenaReader:
        return ArenaReader(self.cfg.shared_memory.name)

    def health(self) -> dict[str, Any]:
        return httpx.get(self.url("/health"), timeout=5).json()

    def assert_no_leaks(self, timeout: float = 5.0) -> None:
        """Every slot FREE in shared memory and unclaimed in nginx's dict."""
        end = time.monotonic() + timeout
        while True:
            h = self.health()
            reader = self.arena()
            try:
                busy = [s for s in reader.slots() if s.state != 0]
            finally:
                reader.close()
            if h.get("slots_claimed") == 0 and not busy:
                return
            if time.monotonic() > end:
                raise AssertionError(f"leaked slots: claimed={h.get('slots_claimed')} busy={busy}")
            time.sleep(0.05)

    def error_log(self) -> str:
        p = self.run_dir / "nginx" / "logs" / "error.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def engine_log(self) -> str:
        p = self.run_dir / "logs" / "engine.log"
        return p.read_text(errors="replace") if p.exists() else ""


def sdk_clients(stack: Stack, timeout: float = 60) -> tuple[Any, Any]:
    """The official anthropic and openai SDK clients, unmodified, pointed at a stack."""
    import anthropic
    import openai

    return (anthropic.Anthropic(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=timeout),
            openai.OpenAI(base_url=stack.base_url + "/v1", api_key="unused", max_retries=0, timeout=timeout))


def anthropic_body(text: str = "Hello", max_tokens: int = 16, **extra: Any) -> dict[str, Any]:
    body = {"model": "zccp-tiny", "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}]}
    body.update(extra)
    return body


def dumps(obj: Any) -> bytes:
    return json.dumps(obj).encode()


os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
