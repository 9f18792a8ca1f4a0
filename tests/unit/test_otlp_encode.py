"""The hand-written OTLP encoder (zccp.observe.otlp_encode) against the SDK's own encoder: the same
spans give the same message once decoded by the official opentelemetry-proto; and the span
process's encoding of a request record decodes to the tree the engine means."""

from __future__ import annotations

import time
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from zccp.observe import otlp_encode as pb
from zccp.transport.abi import CacheStatus
from zccp.observe.trace_spans import SpanEncoder

TID = 0x0AF7651916CD43DD8448EB211C80319C
ATTRS: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.max_tokens": 6,
                         "gen_ai.response.finish_reasons": ("end_turn",), "zccp.request_id": "r" * 200,
                         "big": 1 << 40, "neg": -3, "ratio": 0.25, "yes": True, "raw": b"\x00\x01"}


def decoded(data: bytes) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    req.ParseFromString(data)
    return req


def test_the_same_spans_encode_as_the_sdks() -> None:
    resource = Resource.create({"service.name": "zccp", "k": "v"})
    scope = InstrumentationScope("zccp")
    parent = SpanContext(TID, 0x00F067AA0BA902B7, is_remote=True, trace_flags=TraceFlags(1))
    root = SpanContext(TID, 0x1122334455667788, is_remote=False, trace_flags=TraceFlags(1))
    sdk = [ReadableSpan("chat m", root, parent, resource, ATTRS, kind=SpanKind.SERVER,
                        status=Status(StatusCode.ERROR), start_time=10, end_time=2_000_000_000_123,
                        instrumentation_scope=scope),
           ReadableSpan("zccp.queue", SpanContext(TID, 0x99, False, TraceFlags(1)), root, resource, {},
                        start_time=11, end_time=12, instrumentation_scope=scope)]
    ours = pb.RequestEncoder(dict(resource.attributes), "zccp").encode([
        pb.span(TID.to_bytes(16, "big"), 0x1122334455667788, 0x00F067AA0BA902B7, pb.field(5, b"chat m"), pb.SERVER,
                10, 2_000_000_000_123, pb.span_attributes(ATTRS), pb.ERROR, parent_remote=True),
        pb.span(TID.to_bytes(16, "big"), 0x99, 0x1122334455667788, pb.field(5, b"zccp.queue"), pb.INTERNAL, 11, 12)])
    assert decoded(ours) == decoded(encode_spans(sdk).SerializeToString())


def record(**over: Any) -> tuple[Any, ...]:
    now = time.time_ns()
    fields: dict[str, Any] = dict(
        ids=(TID.to_bytes(16, "big"), (0xB7).to_bytes(8, "big")), flags=0x101, tid=0, root_id=0,
        nginx=(now - 5_000_000, 300), wall0=now - 4_000_000, perf0=100.0, times=(100.001, 100.002, 100.003, 100.004),
        now=now, upstream=None, status=200, cache=CacheStatus.MISS, slot=3, request_id="rid", api="anthropic",
        max_tokens=6, tenant=b"\x01" * 8, usage=(10, 6, "end_turn"), response_id="msg_1", tracestate="")
    fields.update(over)
    return tuple(fields.values())


def test_a_records_spans_form_the_requests_tree() -> None:
    enc = SpanEncoder({"model": "m", "engine": "e0", "server.address": "127.0.0.1", "server.port": 8000})
    data, n = enc.spans(record(upstream=(0x77, "up-model", time.time_ns()), tracestate="rojo=00f067aa0ba902b7"))
    spans = list(decoded(enc.request.encode([data])).resource_spans[0].scope_spans[0].spans)
    assert n == len(spans) == 7
    root = next(s for s in spans if s.kind == pb.SERVER)
    assert root.name == "chat m" and root.parent_span_id == (0xB7).to_bytes(8, "big")
    assert {s.trace_id for s in spans} == {TID.to_bytes(16, "big")}
    assert {s.trace_state for s in spans} == {"rojo=00f067aa0ba902b7"}
    names = {s.name: s for s in spans if s is not root}
    assert set(names) == {"zccp.nginx.admit", "zccp.engine.prepare", "zccp.queue", "zccp.prefill", "zccp.decode",
                          "chat up-model"}
    for s in names.values():
        assert s.parent_span_id == root.span_id
        assert root.start_time_unix_nano <= s.start_time_unix_nano <= s.end_time_unix_nano <= root.end_time_unix_nano
    assert names["chat up-model"].kind == pb.CLIENT and names["chat up-model"].span_id == (0x77).to_bytes(8, "big")
    a = {kv.key: kv.value for kv in root.attributes}
    assert a["gen_ai.request.model"].string_value == "m" and a["server.port"].int_value == 8000
    assert a["zccp.cache.result"].string_value == "MISS" and a["zccp.api"].string_value == "anthropic"
    assert a["gen_ai.usage.output_tokens"].int_value == 6 and a["zccp.tenant"].string_value == "01" * 8
    assert a["gen_ai.response.finish_reasons"].array_value.values[0].string_value == "end_turn"


def test_without_a_parent_a_record_starts_a_trace_and_a_hit_replays() -> None:
    enc = SpanEncoder({"model": "m", "engine": "", "server.address": "h", "server.port": None})
    data, n = enc.spans(record(ids=None, flags=0, times=(0.0, 0.0, 0.0, 0.0), cache=CacheStatus.HIT, usage=None,
                               status=200))
    spans = list(decoded(enc.request.encode([data])).resource_spans[0].scope_spans[0].spans)
    assert n == len(spans) == 3
    root = next(s for s in spans if s.kind == pb.SERVER)
    assert root.parent_span_id == b"" and len(root.trace_id) == 16 and any(root.trace_id)
    assert {s.trace_state for s in spans} == {""}
    assert sorted(s.name for s in spans if s is not root) == ["zccp.cache.replay", "zccp.nginx.admit"]
    assert "zccp.engine" not in {kv.key for kv in root.attributes}


def test_l1_records_are_bounded_and_encode_as_one_span() -> None:
    from zccp.transport.abi import L1_SPAN_SIZE, ffi
    from zccp.observe.trace_export import l1_records

    rec = ffi.new("struct zccp_l1_span *")
    ffi.memmove(rec.trace_id, TID.to_bytes(16, "big"), 16)
    ffi.memmove(rec.parent_span_id, (0xB7).to_bytes(8, "big"), 8)
    rec.trace_flags, rec.status, rec.start_ns, rec.duration_us, rec.api = 0x101, 200, 10**18, 1500, 1
    rec.request_id_len = 5
    ffi.memmove(rec.request_id, b"rid-1", 5)
    good = bytes(ffi.buffer(rec, L1_SPAN_SIZE))
    rec.status, rec.request_id_len, rec.duration_us, rec.trace_flags = 70000, 4_000_000_000, 2**32 - 1, 0x1
    ffi.memmove(rec.request_id, b"\x00\xff\n", 3)
    hostile = bytes(ffi.buffer(rec, L1_SPAN_SIZE))
    recs = l1_records(good + hostile + b"\x01" * 50)     # a partial record at the end: ignored
    assert len(recs) == 2
    assert recs[0][1:] == (TID.to_bytes(16, "big"), (0xB7).to_bytes(8, "big"), 0x101, 200, 10**18, 1500, "openai",
                           "rid-1")
    h = recs[1]
    assert h[1] is None and h[4] == 0 and h[6] <= 3_600_000_000 and h[8] == ""   # no traceparent: a new trace
    enc = SpanEncoder({"model": "m", "engine": "", "server.address": "h", "server.port": None})
    out = [enc.l1(r) for r in recs]
    assert [n for _, n in out] == [1, 1]
    spans = list(decoded(enc.request.encode([d for d, _ in out])).resource_spans[0].scope_spans[0].spans)
    assert [s.kind for s in spans] == [pb.SERVER, pb.SERVER]
    assert spans[0].parent_span_id == (0xB7).to_bytes(8, "big") and spans[0].trace_id == TID.to_bytes(16, "big")
    assert spans[0].end_time_unix_nano - spans[0].start_time_unix_nano == 1_500_000
    a = {kv.key: kv.value for kv in spans[0].attributes}
    assert a["zccp.cache.layer"].string_value == "L1" and a["zccp.request_id"].string_value == "rid-1"
    assert spans[1].parent_span_id == b"" and any(spans[1].trace_id)


def test_spans_go_out_in_posts_of_the_export_batch_size() -> None:
    from tests.support.otlp_receiver import OtlpReceiver
    from zccp.observe.trace_spans import POST_SPANS, BytesExporter, encode_batch, export, post_spans

    assert post_spans({}) == POST_SPANS and post_spans({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "512"}) == 512
    assert post_spans({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "x"}) == POST_SPANS
    assert post_spans({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "0"}) == 1
    enc = SpanEncoder({"model": "m", "engine": "", "server.address": "h", "server.port": None})
    out, counts = encode_batch(enc, [record()] * 3, lambda what, n: None)     # 6 spans each
    assert counts == [6, 6, 6]
    rx = OtlpReceiver(keep=False)
    exporter = BytesExporter(endpoint=rx.url + "/v1/traces", timeout=5)
    reports: list[tuple[str, int]] = []
    try:
        export(exporter, enc.request, out, counts, lambda what, n: reports.append((what, n)), 12)
        export(exporter, enc.request, out, counts, lambda what, n: reports.append((what, n)), 5)
        export(exporter, enc.request, out, counts, lambda what, n: reports.append((what, n)))
        # gathering (the span process's loop): the full posts go, the rest is kept for more
        assert export(exporter, enc.request, out, counts, lambda what, n: reports.append((what, n)), 12,
                      keep=True) == (out[2:], [6])
    finally:
        exporter.shutdown()
        rx.close()
    # a request's spans are never split: with room for 5, each goes alone
    assert reports == [("exported", 12), ("exported", 6)] + [("exported", 6)] * 3 + [("exported", 18), ("exported", 12)]
    assert (rx.posts, rx.count) == (7, 66)


def test_frames_to_the_span_process_round_trip_marshal_or_pickle() -> None:
    import io
    from http import HTTPStatus

    from zccp.observe.trace_export import FRAME, PICKLED, frame
    from zccp.observe.trace_spans import read_frame

    plain, odd = [record(), record(ids=None)], [record(status=HTTPStatus.OK)]
    data = frame(plain) + frame(odd) + frame({"model": "m", "server.port": None})
    assert not FRAME.unpack_from(data)[0] & PICKLED      # plain values: marshal
    stream = io.BytesIO(data + frame(plain)[:-1])        # a frame cut short ends the stream
    assert read_frame(stream) == plain
    got = read_frame(stream)
    assert got == odd and got[0][10] is HTTPStatus.OK           # a value marshal cannot write: pickled
    assert read_frame(stream) == {"model": "m", "server.port": None}
    assert read_frame(stream) is None


def test_a_record_that_cannot_be_encoded_is_lost_alone_and_counted() -> None:
    """A value out of its field's range (nginx's timestamps come from shared memory) used to
    raise out of the span process's loop: the process died and tracing with it."""
    from zccp.observe.trace_spans import encode_batch

    enc = SpanEncoder({"model": "m", "engine": "", "server.address": "h", "server.port": None})
    reports: list[tuple[str, int]] = []
    spans, counts = encode_batch(enc, [record(), record(nginx=(-1, -1)), record(wall0=-1), record()],
                                 lambda what, n: reports.append((what, n)))
    assert reports == [("invalid", 2)] and counts == [6, 6]
    got = list(decoded(enc.request.encode(spans)).resource_spans[0].scope_spans[0].spans)
    assert len(got) == 12 and sum(1 for s in got if s.kind == pb.SERVER) == 2   # two whole trees, no half
    assert encode_batch(enc, [record()], lambda what, n: reports.append((what, n)))[0] and len(reports) == 1
