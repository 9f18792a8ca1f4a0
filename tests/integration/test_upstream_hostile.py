"""Issue 28 item 6 and issue 31 item 7: the server an upstream backend forwards to is not
trusted. A scripted hostile upstream (tests/support/scripted_upstream.py, a real HTTP
server) behind a real gateway (nginx + engine): every size it picks is bounded
(upstream.max_*), a client that leaves ends the exchange, each misbehaviour before the
first byte moves on to the next URL, and a Retry-After is honoured, not retried at once.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.support.harness import Stack
from tests.support.scripted_upstream import MIB, Scripted, ScriptedUpstream, openai_chunks

MODEL = "zccp-gw"
BODY = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}


def gateway(tmp: Path, urls: list[str], **upstream: Any) -> Stack:
    return Stack(tmp, {"model": {"backend": "upstream", "name": MODEL},
                       "upstream": {"urls": urls, "api": "openai", "connect_timeout_ms": 500,
                                    "read_timeout_ms": 15000, **upstream}}).start()


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def wait_for(what: str, cond: Any, limit_s: float = 30) -> None:
    end = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.05)


def test_a_huge_body_is_refused_at_the_bound_without_holding_it(tmp_path: Path) -> None:
    """1.5 GB of answer (chunked, no length announced): the engine stops reading at
    upstream.max_body_kb and answers 502; its peak RSS stays where it was (main read it all:
    265 MB -> 1.55 GB)."""
    hostile = ScriptedUpstream([Scripted(200, content_type="application/json", generated=1536 * MIB)])
    s = gateway(tmp_path, [hostile.url], retries=0)            # upstream.max_body_kb: 16 MiB
    try:
        assert s.engine is not None and s.engine.pid is not None
        before = peak_rss_mb(s.engine.pid)
        with s.client(timeout=120) as h:
            r = h.post("/v1/chat/completions", json=BODY)
        assert r.status_code == 502 and r.json()["error"]["type"] == "server_error", r.text
        assert "over the bound" in r.json()["error"]["message"]
        wait_for("the upstream connection closed", hostile.left.is_set)
        assert hostile.sent < 512 * MIB          # it stopped reading: the sender blocked, then broke
        assert peak_rss_mb(s.engine.pid) - before < 200, (before, peak_rss_mb(s.engine.pid))
        s.assert_no_leaks()
    finally:
        s.stop()
        hostile.close()


@pytest.mark.parametrize("client_api", ["openai", "anthropic"])
def test_a_newline_less_stream_ends_at_the_event_bound(tmp_path: Path, client_api: str) -> None:
    """An SSE line that never ends (64 KiB every 10 ms, no newline): the stream ends with the
    client API's error event at upstream.max_event_kb, and the upstream connection is closed
    (main re-split the whole buffer on every read and never ended it)."""
    hostile = ScriptedUpstream([Scripted(200, body=b"data: ", drip=b"a" * (64 << 10), drip_s=0.01)])
    s = gateway(tmp_path, [hostile.url])                       # upstream.max_event_kb: 1 MiB
    path = "/v1/chat/completions" if client_api == "openai" else "/v1/messages"
    try:
        with s.client(timeout=60) as h, h.stream("POST", path, json={**BODY, "stream": True}) as r:
            raw = r.read().decode()
        assert r.status_code == 200
        assert "max_event_kb" in raw and ("event: error" in raw if client_api == "anthropic" else '"error"' in raw)
        wait_for("the upstream connection closed", hostile.left.is_set)
        assert hostile.sent < 8 * MIB
        s.assert_no_leaks()
    finally:
        s.stop()
        hostile.close()


def test_a_client_that_leaves_ends_the_upstream_exchange(tmp_path: Path) -> None:
    """The upstream sends bytes that complete no event (so the relay sees no event to stop
    at); the client reads the stream's start and closes: the engine closes the upstream
    connection at once (main kept reading it, 60-73% CPU minutes after the client left)."""
    hostile = ScriptedUpstream([Scripted(200, body=b"data: ", drip=b"a" * 512, drip_s=0.02)])
    s = gateway(tmp_path, [hostile.url])
    try:
        with s.client(timeout=30) as h, h.stream("POST", "/v1/messages", json={**BODY, "stream": True}) as r:
            assert r.status_code == 200
            next(r.iter_raw())                    # message_start: the exchange is under way
            wait_for("the upstream was reached", lambda: hostile.sent > 0)
        wait_for("the upstream connection closed after the client left", hostile.left.is_set)
        s.assert_no_leaks()
    finally:
        s.stop()
        hostile.close()


@pytest.mark.parametrize("hostile_script", [
    Scripted(200, header_line=70_000, body=openai_chunks(["never"])),      # main: ValueError -> 500
    Scripted(200, interim=-1, body=openai_chunks(["never"])),              # main: unbounded recursion
], ids=["header-line-over-64KiB", "endless-1xx"])
def test_a_broken_head_moves_on_to_the_next_url(tmp_path: Path, hostile_script: Scripted) -> None:
    hostile = ScriptedUpstream([hostile_script])
    good = ScriptedUpstream([Scripted(200, body=openai_chunks(["fine", "!"]))])
    s = gateway(tmp_path, [hostile.url, good.url], retries=1)
    try:
        with s.client() as h:
            r = h.post("/v1/chat/completions", json=BODY)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == "fine!"
            assert (hostile.requests, good.requests) == (1, 1)
            r = h.post("/v1/chat/completions", json={**BODY, "max_tokens": 9})
            assert r.status_code == 200 and hostile.requests == 1     # marked down: skipped
        s.assert_no_leaks()
    finally:
        s.stop()
        hostile.close()
        good.close()


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_honoured_not_retried_at_once(tmp_path: Path, status: int) -> None:
    """One URL answering with Retry-After: 7 and upstream.retries 2: one attempt (main sent
    three at once, wrapping round to the same URL); the client gets the Retry-After; a
    request within those seconds does not reach the URL, and is told the time left."""
    bad = ScriptedUpstream([Scripted(status, {"retry-after": "7"}, b'{"error":{"message":"slow down"}}')])
    s = gateway(tmp_path, [bad.url], retries=2)
    try:
        with s.client() as h:
            first = h.post("/v1/messages", json=BODY)
            assert bad.requests == 1
            want = 429 if status == 429 else 529
            assert first.status_code == want and first.headers.get("retry-after") == "7", first.headers
            again = h.post("/v1/chat/completions", json=BODY)
            assert bad.requests == 1
            assert again.status_code == (429 if status == 429 else 503)
            assert 1 <= int(again.headers["retry-after"]) <= 7
        # as an SDK sees it: the error of its kind, the Retry-After on it (what its retry waits)
        sdk = anthropic.Anthropic(base_url=s.base_url, api_key="k", max_retries=0, timeout=30)
        with pytest.raises(anthropic.RateLimitError if status == 429 else anthropic.APIStatusError) as exc:
            sdk.messages.create(**BODY)
        assert 1 <= int(exc.value.response.headers["retry-after"]) <= 7 and bad.requests == 1
    finally:
        s.stop()
        bad.close()
