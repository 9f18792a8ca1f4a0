"""A test OTLP/HTTP trace receiver: a real HTTP server on loopback taking POST /v1/traces
(protobuf ExportTraceServiceRequest, decoded with the official opentelemetry-proto), keeping
every span it got, with its resource's attributes."""

from __future__ import annotations

import gzip
import os
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    return getattr(v, kind) if kind else None


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status_code: int
    trace_state: str = ""


@dataclass
class OtlpReceiver:
    spans: list[ReceivedSpan] = field(default_factory=list)
    posts: int = 0
    keep: bool = True       # False: count the spans only (a bench's receiver, on the measured host)
    count: int = 0

    def __post_init__(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"   # keep-alive, as a collector's: no connection per export

            def do_POST(self) -> None:   # noqa: N802 (http.server's name)
                n = int(self.headers.get("content-length", "0"))
                data = self.rfile.read(n)
                if self.headers.get("content-encoding") == "gzip":
                    data = gzip.decompress(data)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                req = ExportTraceServiceRequest()
                req.ParseFromString(data)
                receiver._add(req)
                body = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _add(self, req: ExportTraceServiceRequest) -> None:
        if not self.keep:
            n = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
            with self._lock:
                self.count += n
                self.posts += 1
            return
        got = []
        for rs in req.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(ReceivedSpan(s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                                            s.kind, s.start_time_unix_nano, s.end_time_unix_nano,
                                            {a.key: _value(a.value) for a in s.attributes}, resource,
                                            s.status.code, s.trace_state))
        with self._lock:
            self.spans.extend(got)
            self.count += len(got)
            self.posts += 1

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(self, pred: Any, timeout: float = 30) -> list[ReceivedSpan]:
        """The spans once pred(spans) holds (the exporter sends in batches, on its own thread)."""
        end = time.monotonic() + timeout
        while True:
            with self._lock:
                spans = list(self.spans)
            if pred(spans) or time.monotonic() > end:
                return spans
            time.sleep(0.05)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def receiving() -> Iterator[OtlpReceiver]:
    """A receiver, with the engines' exporter told to send every 50 ms (OTEL_BSP_SCHEDULE_DELAY,
    read by the engines the test starts meanwhile); both put back after."""
    r = OtlpReceiver()
    old = os.environ.get("OTEL_BSP_SCHEDULE_DELAY")
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "50"
    try:
        yield r
    finally:
        if old is None:
            os.environ.pop("OTEL_BSP_SCHEDULE_DELAY", None)
        else:
            os.environ["OTEL_BSP_SCHEDULE_DELAY"] = old
        r.close()
