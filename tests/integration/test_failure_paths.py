"""Failure paths through the real nginx + engine + Redis: a model that fails mid-answer, a
streamed deadline, an nginx worker killed mid-stream, Redis frozen, Redis failing between
the lookup and the store. Every test is bounded in time and stops what it starts."""

from __future__ import annotations

import os
import signal
import time

import anthropic
import httpx
import openai
import pytest
import redis

from tests.support.cache_requests import metric_samples
from tests.support.harness import Stack, anthropic_body

FAIL_AFTER = 5
# A null backend that fails after FAIL_AFTER tokens: the engine's own 500 and SSE error.
FAILING = {"backend": "null", "null_fail_after": FAIL_AFTER, "null_token_delay_ms": 2}
# 20 ms per token, 400 tokens: a stream that runs for seconds.
SLOW = {"backend": "null", "null_token_delay_ms": 20, "null_reply": "slow " * 80}


def openai_body(text: str = "Hello", max_tokens: int = 16, **extra) -> dict:
    return {"model": "zccp-tiny", "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}], **extra}


def sse_events(text: str) -> list[tuple[str, str]]:
    """(event, data) pairs of an SSE body (event is "" when the frame names none)."""
    out = []
    for frame in text.strip().split("\n\n"):
        event, data = "", ""
        for line in frame.splitlines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data = line[5:].strip()
        out.append((event, data))
    return out


def redis_keys(s: Stack) -> list[bytes]:
    with redis.Redis.from_url(s.cfg.cache.redis_url, socket_timeout=5) as r:
        return r.keys("zccp:*")


def metric(s: Stack, line_prefix: str) -> float:
    values = metric_samples(s, line_prefix)
    assert values, f"no sample {line_prefix!r} in /metrics"
    return sum(values)


# -- a model that fails after N tokens ----------------------------------------------------


@pytest.fixture(scope="module")
def failing(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("failing"), {"model": FAILING}, with_redis=True)
    try:
        yield s.start()
    finally:
        s.stop()


def test_failure_mid_answer_is_an_api_shaped_500(failing):
    with failing.client() as c:
        r = c.post("/v1/messages", json=anthropic_body("fail please", max_tokens=50))
        assert r.status_code == 500, r.text
        assert r.json() == {"type": "error", "error": {"type": "api_error",
                                                        "message": "the engine failed while serving this request"}}
        r = c.post("/v1/chat/completions", json=openai_body("fail please", max_tokens=50))
        assert r.status_code == 500, r.text
        assert r.json()["error"]["type"] == "server_error"
    assert "injected failure after 5 tokens" in failing.engine_log()
    failing.assert_no_leaks()


def test_failure_mid_stream_is_the_apis_error_event(failing):
    with failing.client() as c:
        r = c.post("/v1/messages", json=anthropic_body("fail stream", max_tokens=50, stream=True))
        assert r.status_code == 200   # the stream had started: the error comes as an event
        events = sse_events(r.text)
        assert events[0][0] == "message_start"
        assert events[-1][0] == "error" and '"type":"api_error"' in events[-1][1].replace(" ", "")
        assert not any(e == "message_stop" for e, _ in events)
        deltas = [d for e, d in events if e == "content_block_delta"]
        assert 0 < len(deltas) <= FAIL_AFTER
        r = c.post("/v1/chat/completions", json=openai_body("fail stream", max_tokens=50, stream=True))
        assert r.status_code == 200
        events = sse_events(r.text)
        assert '"error"' in events[-1][1] and '"server_error"' in events[-1][1]
        assert all(d != "[DONE]" for _, d in events)
    failing.assert_no_leaks()


def test_both_sdks_raise_their_status_errors(failing):
    claude = anthropic.Anthropic(base_url=failing.base_url, api_key="x", max_retries=0)
    gpt = openai.OpenAI(base_url=failing.base_url + "/v1", api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "sdk failure"}]
    with pytest.raises(anthropic.InternalServerError) as a_exc:
        claude.messages.create(model="zccp-tiny", max_tokens=50, messages=msgs)
    assert a_exc.value.status_code == 500
    with pytest.raises(openai.InternalServerError) as o_exc:
        gpt.chat.completions.create(model="zccp-tiny", max_tokens=50, messages=msgs)
    assert o_exc.value.status_code == 500
    # Streams: the error event surfaces as each SDK's error while iterating.
    with pytest.raises(anthropic.APIStatusError):
        with claude.messages.stream(model="zccp-tiny", max_tokens=50, messages=msgs) as stream:
            for _ in stream.text_stream:
                pass
    with pytest.raises(openai.APIError):
        for _ in gpt.chat.completions.create(model="zccp-tiny", max_tokens=50, messages=msgs, stream=True):
            pass
    failing.assert_no_leaks()


def test_a_failed_answer_is_never_cached(failing):
    body = anthropic_body("never cache a failure", max_tokens=50)
    with failing.client() as c:
        for _ in range(2):
            r = c.post("/v1/messages", json=body)
            assert r.status_code == 500
            assert r.headers["x-zccp-cache"] == "MISS"   # looked up, found nothing: nothing was stored
    assert not [k for k in redis_keys(failing) if k.startswith(b"zccp:v1:e:")]


# -- deadlines, a dying nginx worker ------------------------------------------------------


def test_streamed_deadline_is_an_error_event(make_stack):
    s = make_stack({"limits": {"request_timeout_ms": 1500}, "model": SLOW})
    with s.client() as c:
        r = c.post("/v1/messages", json=anthropic_body("slow", max_tokens=400, stream=True))
        assert r.status_code == 200
        events = sse_events(r.text)
        assert any(e == "content_block_delta" for e, _ in events)       # it streamed, then ran out of time
        assert events[-1][0] == "error" and "timed out after 1500 ms" in events[-1][1]
        r = c.post("/v1/chat/completions", json=openai_body("slow", max_tokens=400, stream=True))
        events = sse_events(r.text)
        assert "timed out after 1500 ms" in events[-1][1] and '"error"' in events[-1][1]
    s.assert_no_leaks(timeout=10)


def test_nginx_worker_killed_mid_stream(make_stack):
    # One slot held by a stream whose worker is SIGKILLed. Once nginx's master has reaped that
    # process, the very next request finds the pool full, frees the dead worker's claim
    # itself (zccp.lib.slots.claim) and is answered: no 429 while worker 0's reaper timer waits;
    # the engine takes the re-claimed slot's new generation (its old job is over).
    s = make_stack({"shared_memory": {"segment_count": 1}, "model": {**SLOW, "null_token_delay_ms": 5}})
    reader = s.arena()
    try:
        with httpx.Client(base_url=s.base_url, timeout=20) as c:
            with pytest.raises(httpx.HTTPError):
                with c.stream("POST", "/v1/messages", json=anthropic_body("die", max_tokens=400, stream=True)) as r:
                    assert r.status_code == 200
                    chunks = r.iter_bytes()
                    next(chunks)
                    owner = reader.slot(0).owner_pid
                    os.kill(owner, signal.SIGKILL)
                    for _ in chunks:
                        pass
    finally:
        reader.close()
    while os.path.exists(f"/proc/{owner}"):   # the master has not reaped it yet: it still "exists"
        time.sleep(0.001)
    r = httpx.post(s.url("/v1/messages"), json=anthropic_body("right after", max_tokens=4), timeout=20)
    assert r.status_code == 200, r.text
    s.assert_no_leaks(timeout=10)


# -- Redis --------------------------------------------------------------------------------


def test_redis_frozen_then_back(make_stack):
    s = make_stack({"model": {"backend": "null"}, "cache": {"timeout_ms": 200}}, with_redis=True)
    assert s.redis is not None and s.redis.pid
    with s.client() as c:
        assert c.post("/v1/messages", json=anthropic_body("warm")).headers["x-zccp-cache"] == "MISS"
        end = time.monotonic() + 10       # its store (after the answer) is done once it hits
        while c.post("/v1/messages", json=anthropic_body("warm")).headers["x-zccp-cache"] != "HIT":
            assert time.monotonic() < end
            time.sleep(0.05)
        os.kill(s.redis.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            r = c.post("/v1/messages", json=anthropic_body("frozen 0"))
            took = time.monotonic() - t0
            assert r.status_code == 200 and r.headers["x-zccp-cache"] == "ERROR"
            assert took < 0.2 + 5.0, took    # within cache.timeout_ms, plus a wide margin for this machine
            # The backoff: after a failure Redis is not tried for a second, so ten requests
            # make at most one attempt per second they span (without it: ten).
            t0 = time.monotonic()
            for i in range(10):
                r = c.post("/v1/messages", json=anthropic_body(f"frozen {i + 1}"))
                assert r.status_code == 200 and r.headers["x-zccp-cache"] == "ERROR"
            span = time.monotonic() - t0
        finally:
            os.kill(s.redis.pid, signal.SIGCONT)
        log = s.engine_log()
        attempts = log.count("redis lookup failed") + log.count("redis store failed")
        assert 1 <= attempts <= 1 + int(span) + 1, (attempts, span)
        # Back by itself: a fresh prompt misses (once the backoff is over), then hits.
        end = time.monotonic() + 15
        while (status := c.post("/v1/messages", json=anthropic_body("thawed")).headers["x-zccp-cache"]) == "ERROR":
            assert time.monotonic() < end, "the cache did not come back"
            time.sleep(0.2)
        assert status == "MISS"
        assert c.post("/v1/messages", json=anthropic_body("thawed")).headers["x-zccp-cache"] == "HIT"
    s.assert_no_leaks()


def test_redis_failing_between_lookup_and_store(make_stack):
    s = make_stack({"model": SLOW}, with_redis=True)
    body = anthropic_body("store me", max_tokens=100, stream=True)
    admin = redis.Redis.from_url(s.cfg.cache.redis_url, socket_timeout=5)
    try:
        with httpx.Client(base_url=s.base_url, timeout=30) as c:
            with c.stream("POST", "/v1/messages", json=body) as r:
                assert r.status_code == 200 and r.headers["x-zccp-cache"] == "MISS"   # the lookup is done
                # Redis now refuses every write (out of memory): the store will fail.
                admin.config_set("maxmemory", 1)
                text = b"".join(r.iter_bytes()).decode()
            assert "message_stop" in text           # the answer itself is whole
            end = time.monotonic() + 10
            while "redis store failed" not in s.engine_log():
                assert time.monotonic() < end, "the engine never tried to store"
                time.sleep(0.1)
            admin.config_set("maxmemory", 0)
            assert not [k for k in admin.keys("zccp:*") if k.startswith(b"zccp:v1:e:")]
            # Nothing was stored: once the backoff is over, the same request misses, then hits.
            end = time.monotonic() + 15
            while (status := c.post("/v1/messages", json=body).headers["x-zccp-cache"]) == "ERROR":
                assert time.monotonic() < end, "the cache did not come back"
                time.sleep(0.2)
            assert status == "MISS"
            assert c.post("/v1/messages", json=body).headers["x-zccp-cache"] == "HIT"
    finally:
        admin.close()
    s.assert_no_leaks()
