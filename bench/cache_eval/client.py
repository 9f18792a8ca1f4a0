"""HTTP client side: keepalive httpx clients, one per worker thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import httpx

PATHS = {"anthropic": "/v1/messages", "openai": "/v1/chat/completions"}


@dataclass(frozen=True)
class Reply:
    status: int
    cache: str            # X-ZCCP-Cache ("" when absent)
    similarity: float | None


class Client:
    def __init__(self, base_url: str, admin: Callable[[], httpx.Client] | None = None) -> None:
        self.base_url = base_url
        self._admin = admin        # the stack's admin listener (/metrics is served there only)
        self._local = threading.local()
        self._all: list[httpx.Client] = []
        self._lock = threading.Lock()

    def _client(self) -> httpx.Client:
        c = getattr(self._local, "c", None)
        if c is None:
            c = httpx.Client(base_url=self.base_url, timeout=30,
                             limits=httpx.Limits(max_keepalive_connections=4, max_connections=4))
            self._local.c = c
            with self._lock:
                self._all.append(c)
        return c

    def send(self, api: str, body: bytes, headers: dict[str, str] | None = None) -> Reply:
        h = {"content-type": "application/json"}
        if headers:
            h.update(headers)
        r = self._client().post(PATHS[api], content=body, headers=h)
        sim = r.headers.get("x-zccp-similarity")
        return Reply(r.status_code, r.headers.get("x-zccp-cache", ""), float(sim) if sim else None)

    def metrics(self, by: str = "result") -> dict[str, float]:
        """The engine's cache counters from zccp_engine_cache_total: {result: count} summed over
        reasons, or with by="reason" {"RESULT/reason": count}."""
        if self._admin is None:
            raise RuntimeError("metrics: this Client was made without the stack's admin client")
        with self._admin() as c:
            text = c.get("/metrics").text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("zccp_engine_cache_total{"):
                label = line.split('result="', 1)[1].split('"', 1)[0]
                if by == "reason" and 'reason="' in line:
                    label += "/" + line.split('reason="', 1)[1].split('"', 1)[0]
                out[label] = out.get(label, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def close(self) -> None:
        for c in self._all:
            c.close()
