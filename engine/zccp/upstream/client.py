"""The HTTP side of an upstream backend: keep-alive connections pooled per URL
(zccp.upstream.http1), the fallback list, retries before the first byte, and
the health of each URL (a failed one is skipped for upstream.cooldown_ms, or for the
Retry-After of its 429/503, then probed every upstream.health_interval_ms until it answers
again). One request tries each URL at most once: a retry never wraps round to a URL that
has just failed it.

Runs on the engine's event loop only: nothing here blocks it or the model thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from email.utils import parsedate_to_datetime
from dataclasses import dataclass, field
from typing import Any

import orjson

from zccp.config import ConfigError, UpstreamConfig
from zccp.shared_types import ApiError
from zccp.upstream.http1 import Bounds, HttpError, Pool, Response
from zccp.upstream.wire import ANTHROPIC_VERSION, Event, UpstreamBroken, reader_for

log = logging.getLogger("zccp.upstream")

PATHS = {"openai": "/chat/completions", "anthropic": "/messages"}
RETRYABLE = frozenset({429, 500, 502, 503, 504, 529})
HOLDING = frozenset({429, 503, 529})   # statuses whose Retry-After holds the URL back
MAX_RETRY_AFTER_S = 3600               # a longer Retry-After is read as this
WHOLE_OFF_LOOP = 256 << 10             # a whole answer larger than this is parsed off the event loop


def retry_after_s(value: str | None) -> int | None:
    """A Retry-After header in whole seconds (delta-seconds or an HTTP-date), at most
    MAX_RETRY_AFTER_S; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(int(value), MAX_RETRY_AFTER_S)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0, min(int(when.timestamp() - time.time() + 0.999), MAX_RETRY_AFTER_S))


@dataclass
class Target:
    """One URL of the fallback list and its health."""

    url: str
    down_until: float = 0.0          # monotonic seconds; 0: up
    failures: int = 0
    held_until: float = 0.0          # monotonic seconds its Retry-After asked for (never tried before)
    held: ApiError | None = None     # what it answered then (429 / 529), given while it holds

    @property
    def up(self) -> bool:
        return self.down_until == 0.0


@dataclass
class UpstreamStats:
    """Counters the tests and the bench read (requests sent, by outcome)."""

    sent: int = 0
    retried: int = 0
    by_status: dict[int, int] = field(default_factory=dict)


def _message(body: bytes) -> str:
    """The upstream's own error message (either API's shape), short; never its headers."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:200].decode("utf-8", "replace")
    err = doc.get("error") if isinstance(doc, dict) else None
    msg = err.get("message") if isinstance(err, dict) else None
    return str(msg)[:500] if msg else body[:200].decode("utf-8", "replace")


def error_for(status: int, body: bytes, retry_after: int | None) -> ApiError:
    """An upstream's HTTP error as the client's: what the client can fix stays a 4xx; the
    gateway's own trouble with the upstream (its key refused, its model unknown) is a 502
    that names no credentials; 429 keeps its retry-after; 5xx is the upstream's failure."""
    msg = _message(body)
    if status in (400, 422):
        return ApiError(400, "invalid_request_error", f"the upstream refused the request: {msg}")
    if status == 413:
        return ApiError(413, "request_too_large", f"the upstream refused the request's size: {msg}")
    if status in (401, 403):
        return ApiError(502, "api_error", f"the upstream refused this gateway's credentials ({status})")
    if status == 404:
        return ApiError(502, "api_error", f"the upstream does not serve this model or path (404): {msg}")
    if status == 429:
        hdrs = {"retry-after": str(retry_after if retry_after is not None else 1)}
        return ApiError(429, "rate_limit_error", f"the upstream is rate limiting: {msg}", headers=hdrs)
    if status in (503, 529):
        hdrs = {"retry-after": str(retry_after)} if retry_after is not None else {}
        return ApiError(529, "overloaded_error", f"the upstream is overloaded ({status}): {msg}", headers=hdrs)
    if status >= 500:
        return ApiError(502, "api_error", f"the upstream failed ({status}): {msg}")
    return ApiError(502, "api_error", f"the upstream answered {status}: {msg}")


class UpstreamAnswer:
    """An upstream's 200 answer, its first byte not read yet: events() reads it to the end."""

    def __init__(self, response: Response, api: str, target: Target) -> None:
        self.response = response
        self.target = target
        self._reader = reader_for(api)

    async def events(self) -> AsyncIterator[Event]:
        if "text/event-stream" not in self.response.headers.get("content-type", ""):
            try:
                data = await self.response.read()    # a whole answer (a non-streamed request), bounded
            except HttpError as exc:
                raise UpstreamBroken(f"the upstream's answer broke off: {exc}") from None
            finally:
                await self.response.close()
            if len(data) > WHOLE_OFF_LOOP:           # megabytes of JSON: not on the event loop
                events = await asyncio.to_thread(lambda: list(self._reader.whole(data)))
            else:
                events = list(self._reader.whole(data))
            for ev in events:
                yield ev
            return
        try:
            async for line in self.response.lines():
                if line.startswith(b"data:"):
                    for ev in self._reader.feed(line[5:].strip()):
                        yield ev
                    if self._reader.done:
                        return
        except HttpError as exc:
            raise UpstreamBroken(f"the upstream's answer broke off: {exc}") from None
        finally:
            await self.response.close()
        for ev in self._reader.closed():
            yield ev

    async def close(self) -> None:
        await self.response.close()


class UpstreamClient:
    def __init__(self, cfg: UpstreamConfig, model_name: str) -> None:
        self.cfg = cfg
        self.model = cfg.model or model_name
        self.targets = [Target(u.rstrip("/")) for u in cfg.urls]
        self.stats = UpstreamStats()
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        key = None
        if cfg.api_key_env:
            key = os.environ.get(cfg.api_key_env)
            if not key:
                raise ConfigError(f"upstream.api_key_env: the environment variable {cfg.api_key_env} is not set")
        if cfg.api == "anthropic":
            headers["anthropic-version"] = ANTHROPIC_VERSION
            if key:
                headers["x-api-key"] = key
        elif key:
            headers["authorization"] = f"Bearer {key}"
        self._headers = headers
        self._http: Pool | None = None
        self._health: asyncio.Task[None] | None = None

    def _client(self) -> Pool:
        if self._http is None:   # made on the loop that uses it
            c = self.cfg
            self._http = Pool(c.max_connections, c.connect_timeout_ms / 1000, c.read_timeout_ms / 1000,
                              Bounds(head=c.max_header_kb << 10, body=c.max_body_kb << 10,
                                     event=c.max_event_kb << 10, interim=c.max_interim))
            self._health = asyncio.get_running_loop().create_task(self._health_loop())
        return self._http

    # -- health -----------------------------------------------------------------------------

    def _mark_down(self, t: Target, why: str, for_s: float | None = None) -> None:
        t.failures += 1
        was_up = t.up
        t.down_until = time.monotonic() + (self.cfg.cooldown_ms / 1000 if for_s is None else for_s)
        if was_up:
            log.warning("upstream %s skipped for %.1fs: %s", t.url, t.down_until - time.monotonic(), why)

    def _candidates(self) -> list[Target]:
        """Up URLs in order, then (a last resort, when every one failed) those cooling down,
        the soonest back first; never one whose Retry-After still holds."""
        now = time.monotonic()
        free = [t for t in self.targets if t.held_until <= now]
        up = [t for t in free if t.up]
        return up + sorted((t for t in free if not t.up), key=lambda t: t.down_until)

    def _hold(self, t: Target, err: ApiError, for_s: int) -> None:
        """The URL asked not to be called for for_s seconds (Retry-After): it is not, and
        while every URL holds, requests get its answer with the time left."""
        t.held_until = time.monotonic() + for_s
        t.held = err
        self._mark_down(t, f"Retry-After {for_s}s", float(for_s))

    def _held_error(self) -> ApiError:
        """Every URL holds: the answer of the one back soonest, its Retry-After what is left."""
        t = min(self.targets, key=lambda t: t.held_until)
        assert t.held is not None
        left = max(1, int(t.held_until - time.monotonic() + 0.999))
        return ApiError(t.held.status, t.held.kind, t.held.message, t.held.param,
                        {**t.held.headers, "retry-after": str(left)})

    async def _health_loop(self) -> None:
        interval = self.cfg.health_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for t in self.targets:
                if not t.up and now >= t.down_until:
                    await self._probe(t)

    async def _probe(self, t: Target) -> None:
        """GET <url>/models: any answer below 500 is a server that answers again."""
        assert self._http is not None
        try:
            r = await self._http.request("GET", t.url + "/models", self._headers)
            await r.read()
            await r.close()
            alive = r.status < 500
        except HttpError:
            alive = False
        if alive:
            log.info("upstream %s answers again", t.url)
            t.down_until, t.failures = 0.0, 0
        else:
            t.down_until = time.monotonic() + self.cfg.cooldown_ms / 1000

    # -- one request --------------------------------------------------------------------------

    async def open(self, body: dict[str, Any], extra_headers: dict[str, str] | None = None) -> UpstreamAnswer:
        """Send the request; the first 200 answer, its body unread. Connect errors, 429
        and 5xx move on to the next URL (upstream.retries more attempts); a request the
        upstream refuses for itself (4xx) is not retried. extra_headers: the trace context sent
        on (traceparent, tracestate). Raises ApiError."""
        http = self._client()
        headers = {**self._headers, **extra_headers} if extra_headers else self._headers
        data = orjson.dumps(body)
        path = PATHS[self.cfg.api]
        last: ApiError | None = None
        order = self._candidates()[: self.cfg.retries + 1]   # each URL once: no wrapping round
        if not order:
            raise self._held_error()
        for attempt, t in enumerate(order):
            if attempt:
                self.stats.retried += 1
            self.stats.sent += 1
            try:
                resp = await http.request("POST", t.url + path, headers, data)
            except HttpError as exc:
                self._mark_down(t, str(exc))
                if exc.timeout:
                    last = ApiError(502 if exc.connect else 504, "api_error",
                                    f"the upstream did not answer in time ({exc})")
                else:
                    last = ApiError(502, "api_error", f"the upstream cannot be reached or answered badly ({exc})")
                continue
            status = resp.status
            self.stats.by_status[status] = self.stats.by_status.get(status, 0) + 1
            if status == 200:
                if not t.up:                   # a last-resort URL answered: it is back
                    t.down_until, t.failures = 0.0, 0
                return UpstreamAnswer(resp, self.cfg.api, t)
            try:
                raw = await resp.read()
            except HttpError:
                raw = b""
            finally:
                await resp.close()
            after = retry_after_s(resp.headers.get("retry-after"))
            last = error_for(status, raw, after)
            if status not in RETRYABLE:
                raise last
            if status in HOLDING and after:
                self._hold(t, last, after)
            else:
                self._mark_down(t, f"HTTP {status}")
        assert last is not None
        raise last

    async def close(self) -> None:
        if self._health is not None:
            self._health.cancel()
        if self._http is not None:
            self._http.close()
