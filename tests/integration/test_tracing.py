"""OpenTelemetry traces of requests, received by a real OTLP/HTTP server (tests/support/
otlp_receiver.py, decoding with opentelemetry-proto): a client's traceparent is kept
through nginx, the slot and the engine; one request's spans form one tree with the GenAI
attributes, through both APIs, streamed and not, a miss and a cache hit; the trace goes on
to an upstream (a second ZCCP stack, tracing too); a collector that is down fails nothing
and its lost spans are counted."""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.cache_requests import ENGINE_ENV, MODEL, PATHS, metric, req
from tests.support.harness import Stack
from tests.support.otlp_receiver import receiving, OtlpReceiver, ReceivedSpan
from zccp.ops.stack import free_port

SERVER, CLIENT = 2, 3     # opentelemetry.proto's SpanKind values
CHILDREN = ("zccp.nginx.admit", "zccp.engine.prepare", "zccp.queue", "zccp.prefill", "zccp.decode")


@pytest.fixture(scope="module")
def rx() -> Iterator[OtlpReceiver]:
    with receiving() as r:
        yield r


def traced(rx: OtlpReceiver, **extra: Any) -> dict[str, Any]:
    return {"tracing": {"enabled": True, "endpoint": rx.url + "/v1/traces"}, **extra}


@pytest.fixture(scope="module")
def stack(rx: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # no L1: every hit is the engine's (nginx's own hits have no span)
    s = Stack(tmp_path_factory.mktemp("traced"), traced(rx, cache={"l1": {"enabled": False}}),
              with_redis=True).start()
    yield s
    s.stop()


def traceparent() -> tuple[str, str, str]:
    tid, sid = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{tid}-{sid}-01", tid, sid


def one_trace(rx: OtlpReceiver, tid: str, want: int) -> list[ReceivedSpan]:
    spans = rx.wait_for(lambda got: sum(1 for s in got if s.trace_id == tid) >= want)
    return [s for s in spans if s.trace_id == tid]


def check_tree(spans: list[ReceivedSpan], parent: str, names: tuple[str, ...]) -> ReceivedSpan:
    """The root is the child of `parent` (the client's span); every other span a child of the root."""
    roots = [s for s in spans if s.kind == SERVER and s.parent_span_id == parent]
    assert len(roots) == 1, [(s.name, s.parent_span_id) for s in spans]
    root = roots[0]
    assert root.name == f"chat {MODEL}"
    by_name = {s.name: s for s in spans if s is not root}
    for name in names:
        assert name in by_name, f"no {name} span: {sorted(by_name)}"
        child = by_name[name]
        assert child.parent_span_id == root.span_id, name
        assert root.start_ns <= child.start_ns <= child.end_ns <= root.end_ns, name
    return root


@pytest.mark.parametrize("api", ["anthropic", "openai"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_miss_is_one_trace_under_the_clients_span(stack: Stack, rx: OtlpReceiver, api: str, stream: bool) -> None:
    tp, tid, sid = traceparent()
    body = req(api, [{"role": "user", "content": f"trace me {api} {stream} {tid}"}], max_tokens=6, stream=stream)
    r = stack.client().post(PATHS[api], json=body, headers={"traceparent": tp})
    assert r.status_code == 200, r.text
    spans = one_trace(rx, tid, 1 + len(CHILDREN))
    root = check_tree(spans, sid, CHILDREN)
    a = root.attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == MODEL
    assert a["gen_ai.request.max_tokens"] == 6
    assert a["gen_ai.usage.input_tokens"] > 0 and 0 < a["gen_ai.usage.output_tokens"] <= 6
    assert a["gen_ai.response.finish_reasons"] and a["gen_ai.response.finish_reasons"][0]
    assert a["gen_ai.response.id"]
    if not stream:
        assert a["gen_ai.response.id"] == r.json()["id"]
    assert a["server.address"] == "127.0.0.1"
    assert a["zccp.cache.result"] == "MISS"
    assert a["zccp.request_id"] == r.headers["x-request-id"]
    assert isinstance(a["zccp.slot"], int)
    assert a["http.response.status_code"] == 200
    assert root.resource["service.name"] == "zccp"
    # nothing of the prompt or a key in any attribute
    for s in spans:
        assert not any(tid in str(v) and k != "zccp.request_id" for k, v in s.attributes.items())


def test_a_cache_hit_has_a_replay_span(stack: Stack, rx: OtlpReceiver) -> None:
    body = req("anthropic", [{"role": "user", "content": "a hit to trace"}], max_tokens=6)
    c = stack.client()
    assert c.post(PATHS["anthropic"], json=body).headers["x-zccp-cache"] == "MISS"
    for _ in range(100):
        tp, tid, sid = traceparent()
        r = c.post(PATHS["anthropic"], json=body, headers={"traceparent": tp})
        if r.headers["x-zccp-cache"] == "HIT":
            break
    assert r.headers["x-zccp-cache"] == "HIT"
    spans = one_trace(rx, tid, 3)
    root = check_tree(spans, sid, ("zccp.nginx.admit", "zccp.cache.replay"))
    assert root.attributes["zccp.cache.result"] == "HIT"
    assert not {"zccp.queue", "zccp.decode"} & {s.name for s in spans}


def test_an_l1_hit_answered_by_nginx_has_its_span(rx: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory) -> None:
    # nginx sends its L1 hits' records to the engine in batches (zccp.plugins.l1.spans)
    s = Stack(tmp_path_factory.mktemp("l1"), traced(rx), with_redis=True).start()
    try:
        c = s.client()
        for api in ("anthropic", "openai"):
            body = req(api, [{"role": "user", "content": f"an L1 hit to trace {api}"}], max_tokens=6)
            for _ in range(100):
                tp, tid, sid = traceparent()
                r = c.post(PATHS[api], json=body, headers={"traceparent": tp})
                if r.headers.get("x-zccp-cache-layer") == "L1":
                    break
            assert r.status_code == 200 and r.headers.get("x-zccp-cache-layer") == "L1"
            spans = one_trace(rx, tid, 1)
            assert len(spans) == 1      # nginx answered it alone: no engine phase
            root = check_tree(spans, sid, ())
            a = root.attributes
            assert a["zccp.cache.result"] == "HIT" and a["zccp.cache.layer"] == "L1"
            assert a["zccp.request_id"] == r.headers["x-request-id"] and a["zccp.api"] == api
            assert a["http.response.status_code"] == 200 and a["gen_ai.request.model"] == MODEL
            assert root.end_ns >= root.start_ns > 0
        # an unsampled traceparent: no span for that L1 hit
        tid = secrets.token_hex(16)
        r = c.post(PATHS["openai"], json=body, headers={"traceparent": f"00-{tid}-{secrets.token_hex(8)}-00"})
        assert r.headers.get("x-zccp-cache-layer") == "L1"
        tp, marker, _ = traceparent()
        assert c.post(PATHS["openai"], json=body, headers={"traceparent": tp}).status_code == 200
        one_trace(rx, marker, 1)      # a later batch came: the unsampled hit's would have been in it or before
        assert not rx.trace(tid)
    finally:
        s.stop()


def test_l1_hit_spans_nginx_cannot_send_are_counted(rx: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory) -> None:
    # one slot, held by a slow stream: the batch of an L1 hit's span finds no slot free
    slow = {"backend": "null", "null_token_delay_ms": 20, "null_reply": "slow " * 400}
    s = Stack(tmp_path_factory.mktemp("l1drop"), traced(rx, model=slow, shared_memory={"segment_count": 1}),
              with_redis=True).start()
    try:
        c = s.client()
        body = req("openai", [{"role": "user", "content": "an L1 hit whose span is dropped"}], max_tokens=4)
        for _ in range(100):
            tp, tid, _ = traceparent()
            r = c.post(PATHS["openai"], json=body, headers={"traceparent": tp})
            if r.headers.get("x-zccp-cache-layer") == "L1":
                break
        assert r.headers.get("x-zccp-cache-layer") == "L1"
        one_trace(rx, tid, 1)      # that batch went through: the slot is free again
        name = "zccp_nginx_l1_spans_dropped_total"
        assert metric(s, name, reason="not_sent") == 0 and metric(s, name, reason="buffer_full") == 0
        hold = req("openai", [{"role": "user", "content": "hold the slot"}], max_tokens=2000, stream=True)
        with httpx.Client(base_url=s.base_url, timeout=60) as holder:
            for _ in range(100):     # a 429 while nginx still hands the first batch's slot back
                stream = holder.send(holder.build_request("POST", PATHS["openai"], json=hold), stream=True)
                if stream.status_code != 429:
                    break
                stream.close()
                time.sleep(0.05)
            try:
                assert stream.status_code == 200
                chunks = stream.iter_bytes()    # kept: a generator collected would close the stream
                next(chunks)                    # streaming: the one slot is taken until this closes
                tp, tid, _ = traceparent()
                r = c.post(PATHS["openai"], json=body, headers={"traceparent": tp})
                assert r.status_code == 200 and r.headers.get("x-zccp-cache-layer") == "L1"
                for _ in range(300):
                    if metric(s, name, reason="not_sent") > 0:
                        break
                assert metric(s, name, reason="not_sent") == 1
            finally:
                stream.close()
        assert metric(s, name, reason="buffer_full") == 0
        assert not rx.trace(tid)
    finally:
        s.stop()


def test_without_a_traceparent_the_engine_starts_a_trace(stack: Stack, rx: OtlpReceiver) -> None:
    body = req("openai", [{"role": "user", "content": "no parent"}], max_tokens=4)
    r = stack.client().post(PATHS["openai"], json=body)
    rid = r.headers["x-request-id"]
    spans = rx.wait_for(lambda got: any(s.attributes.get("zccp.request_id") == rid for s in got))
    root = next(s for s in spans if s.attributes.get("zccp.request_id") == rid)
    assert root.parent_span_id == ""
    assert len(root.trace_id) == 32 and root.trace_id != "0" * 32


def test_a_malformed_traceparent_is_ignored(stack: Stack, rx: OtlpReceiver) -> None:
    body = req("openai", [{"role": "user", "content": "bad parent"}], max_tokens=4)
    zero_trace = "00-" + "0" * 32 + "-00f067aa0ba902b7-01"
    r = stack.client().post(PATHS["openai"], json=body, headers={"traceparent": zero_trace})
    assert r.status_code == 200
    rid = r.headers["x-request-id"]
    spans = rx.wait_for(lambda got: any(s.attributes.get("zccp.request_id") == rid for s in got))
    root = next(s for s in spans if s.attributes.get("zccp.request_id") == rid)
    assert root.parent_span_id == "" and root.trace_id != "0" * 32


def test_the_trace_goes_on_to_an_upstream(rx: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory) -> None:
    up = Stack(tmp_path_factory.mktemp("up"), traced(rx, model={"backend": "null", "name": "zccp-up"})).start()
    try:
        front = Stack(tmp_path_factory.mktemp("front"), traced(rx, model={"backend": "upstream", "name": MODEL},
                      upstream={"urls": [up.base_url + "/v1"], "api": "openai", "model": "zccp-up"})).start()
        try:
            for stream in (False, True):
                tp, tid, sid = traceparent()
                # a tracestate over 512 bytes: nginx keeps its whole entries within 512
                state = f"rojo=00f067aa0ba902b7,congo=t61rcWkgMzE,{','.join(f'k{i}=' + 'v' * 40 for i in range(20))}"
                kept = state[:state.rindex(",", 0, 513)]
                body = req("anthropic", [{"role": "user", "content": f"via upstream {stream}"}], max_tokens=5,
                           stream=stream)
                r = front.client().post(PATHS["anthropic"], json=body, headers={"traceparent": tp,
                                                                                 "tracestate": state})
                assert r.status_code == 200, r.text
                # the front's root and its upstream call, the upstream stack's root and its spans
                # (the two stacks' spans arrive in either order: wait for the front's root and its call)
                def front_seen(got: list[ReceivedSpan], tid: str = tid, sid: str = sid) -> bool:
                    return any(s.trace_id == tid and s.kind == SERVER and s.parent_span_id == sid for s in got) \
                        and any(s.trace_id == tid and s.kind == CLIENT for s in got)

                spans = [s for s in rx.wait_for(front_seen) if s.trace_id == tid]
                front_root = next(s for s in spans if s.kind == SERVER and s.parent_span_id == sid)
                call = next(s for s in spans if s.kind == CLIENT)
                assert call.name == "chat zccp-up" and call.parent_span_id == front_root.span_id
                def under(s: ReceivedSpan, tid: str = tid, call_id: str = call.span_id) -> bool:
                    return s.trace_id == tid and s.parent_span_id == call_id

                up_root_span = next(s for s in rx.wait_for(lambda got: any(under(s) for s in got)) if under(s))
                assert up_root_span.kind == SERVER and up_root_span.name == "chat zccp-up"
                # the client's tracestate went on with the traceparent (the upstream's nginx kept it)
                assert len(kept) <= 512 and up_root_span.trace_state == kept
                assert front_root.trace_state == kept and call.trace_state == kept
                assert front_root.attributes["gen_ai.usage.output_tokens"] > 0
        finally:
            front.stop()
    finally:
        up.stop()


def test_a_collector_that_is_down_fails_nothing_and_drops_are_counted(tmp_path_factory: pytest.TempPathFactory,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # on through the SDK's environment alone, to a port nobody listens on
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://127.0.0.1:{free_port()}/v1/traces")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    s = Stack(tmp_path_factory.mktemp("down")).start()
    try:
        with s.client() as c:
            for i in range(20):
                body = req("openai", [{"role": "user", "content": f"down {i}"}], max_tokens=4, stream=i % 2 == 1)
                assert c.post(PATHS["openai"], json=body).status_code == 200
        for _ in range(200):
            if metric(s, "zccp_engine_trace_spans_total", result="failed") > 0:
                break
            time.sleep(0.05)
        assert metric(s, "zccp_engine_trace_spans_total", result="failed") > 0
        assert metric(s, "zccp_engine_trace_spans_total", result="exported") == 0
    finally:
        s.stop()


def test_off_by_default_the_sdk_is_not_imported() -> None:
    code = ("import sys, zccp.process.engine, zccp.prep.outcome, zccp.observe.tracing\n"
            "from zccp.config.sections import TracingConfig\n"
            "assert not zccp.observe.tracing.wanted(TracingConfig(), {})\n"
            "assert zccp.observe.tracing.wanted(TracingConfig(), {'OTEL_EXPORTER_OTLP_ENDPOINT': 'http://c:4318'})\n"
            "assert not zccp.observe.tracing.wanted(TracingConfig(enabled=True), {'OTEL_SDK_DISABLED': 'true'})\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    env = {k: v for k, v in ENGINE_ENV.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
