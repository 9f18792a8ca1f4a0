"""The front tier's test rig (tests/integration/test_front_tier.py): the front nginx rendered
from a front.yaml as an operator would, the two hosts' loopback addresses and replies (an
answer says which host served it), and conversations whose turns repeat the earlier ones.
"""

from __future__ import annotations

import shutil
import signal
import socket
import time
import uuid
from pathlib import Path

import httpx
import yaml

from tests.support.cache_requests import PATHS, req
from tests.support.leftovers import SOCKET_DIRS
from zccp.ops.front_conf import load_front, render_front
from zccp.ops.stack import Service, free_port

NAME = "zccp-hosts.zccp.svc.cluster.local"
ADDRS = {"a": "127.0.0.2", "b": "127.0.0.3"}
REPLY = {name: f"answered by host {name}" for name in ADDRS}
HOST_OF = {text: name for name, text in REPLY.items()}
INTERVAL_S = 0.5      # front.resolve_interval_s here: a changed answer is seen within a second


def port_free_on_both() -> int:
    """A port free on 127.0.0.2 and 127.0.0.3 (loopback aliases: all of 127/8 routes to lo),
    from free_port's range below the ephemeral ports (no outgoing connection takes it first)."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as s, socket.socket() as t:
            try:
                s.bind((ADDRS["a"], port))
                t.bind((ADDRS["b"], port))
                return port
            except OSError:
                continue
    raise RuntimeError("no port free on both loopback aliases")


class Front:
    """The front nginx, rendered from a front.yaml the way an operator would."""

    def __init__(self, resolver: str, port: int) -> None:
        # nginx's workers (an unprivileged user under root) must traverse it: not pytest's 0700 tree
        self.dir = Path(f"/tmp/zccp-test-front-{uuid.uuid4().hex[:10]}")
        self.dir.mkdir(mode=0o755)
        SOCKET_DIRS.append(self.dir)
        self.listen = f"127.0.0.1:{free_port()}"
        front_yaml = self.dir / "front.yaml"
        front_yaml.write_text(yaml.safe_dump({"front": {
            "hosts": NAME, "port": port, "listen": self.listen, "resolver": resolver,
            "resolve_interval_s": INTERVAL_S, "resolve_timeout_ms": 200, "workers": 2,
            "max_body_kb": 256, "connect_timeout_ms": 500, "down_s": 5}}))
        self.conf = render_front(load_front(front_yaml), self.dir / "nginx")
        exe = shutil.which("nginx") or "/usr/sbin/nginx"
        self.svc = Service("front", [exe, "-p", str(self.conf.parent), "-c", str(self.conf), "-g", "daemon off;"],
                           self.dir / "nginx" / "logs" / "front-stderr.log", stop_signal=signal.SIGQUIT)

    def start(self) -> Front:
        self.svc.start()
        wait_for("the front to listen", lambda: self._health() is not None)
        return self

    def stop(self) -> None:
        self.svc.stop()

    def _health(self) -> httpx.Response | None:
        try:
            return httpx.get(f"http://{self.listen}/health", timeout=2)
        except httpx.TransportError:
            return None

    def hosts(self) -> list[str]:
        r = self._health()
        return r.json()["hosts"].split(",") if r is not None and r.status_code == 200 else []

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=f"http://{self.listen}", timeout=30)

    def log(self) -> str:
        return (self.conf.parent / "logs" / "front-error.log").read_text(errors="replace")


def wait_for(what: str, ok, timeout: float = 20, every: float = 0.1) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if ok():
            return
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def text_of(api: str, j: dict) -> str:
    return j["content"][0]["text"] if api == "anthropic" else j["choices"][0]["message"]["content"]


def first_turn(i: int) -> list:
    return [{"role": "system", "content": f"You are assistant number {i}."},
            {"role": "user", "content": f"Tell me about city number {i}."}]


def turns(i: int, n: int) -> list[list]:
    """Conversation i's first n turns: each repeats the earlier ones and adds one question."""
    msgs, out = first_turn(i), []
    for k in range(n):
        if k:
            msgs = msgs + [{"role": "assistant", "content": f"Answer {k} about city {i}."},
                           {"role": "user", "content": f"And follow-up question {k}?"}]
        out.append(msgs)
    return out


def body(api: str, msgs: list, **extra) -> dict:
    if api == "anthropic":   # Anthropic's system prompt is a field, not a message
        return req(api, msgs[1:], system=msgs[0]["content"], **extra)
    return req(api, msgs, **extra)


def served_by(front: Front, api: str, msgs: list, **extra) -> str:
    with front.client() as c:
        r = c.post(PATHS[api], json=body(api, msgs, **extra))
    assert r.status_code == 200, r.text
    return HOST_OF[text_of(api, r.json())]


CONVERSATIONS = 24
API_OF = ["anthropic", "openai"]


def placement(front: Front) -> dict[int, str]:
    """Which host serves each conversation's first turn."""
    return {i: served_by(front, API_OF[i % 2], first_turn(i)) for i in range(CONVERSATIONS)}
