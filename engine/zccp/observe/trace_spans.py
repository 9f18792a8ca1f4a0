"""The span process: `python -m zccp.observe.trace_spans`, started by the engine when tracing is on
(zccp.observe.trace_export). It reads the engine's request records from stdin (frames of a length
and a marshal: the engine's own pipe to its own child), encodes each request's spans as
OTLP protobuf (zccp.observe.otlp_encode) and sends them through the SDK's OTLP/HTTP exporter, frames
gathered into posts of up to POST_SPANS spans (or what one schedule delay gathered); on
stdout it reports "exported N" or "failed N" per export for the engine's counter. Here, not
in the engine, so that encoding takes no GIL from the engine's event loop (docs/observability.md).

The SDK's TracerProvider, spans and BatchSpanProcessor are not used: a request's spans are
known whole when its record arrives (no span is live here), the engine's bounded queue and
this process's batches do what the processor would; the SDK gives the resource and the
exporter's transport.
"""

from __future__ import annotations

import io
import marshal
import os
import pickle
import select
import signal
import struct
import sys
import time
from collections.abc import Callable, Mapping
from random import getrandbits
from typing import IO, Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource

from zccp.observe import otlp_encode as pb
from zccp.transport.abi import CACHE_NAMES
from zccp.observe.trace_export import CHILDREN, FRAME, L1, PICKLED, schedule_delay

# an INTERNAL child span is: b"\x12" + its length, then b"\x0a\x10" + the trace id, b"\x12\x08" +
# its id, [the tracestate's field 3,] b"\x22\x08" + the root's id, its name's field 5, b"\x30\x01"
# (INTERNAL), the two times, its attributes, pb.INTERNAL_TAIL. The fixed part's length:
_CHILD_FIXED = 2 + 16 + 2 + 8 + pb.TIMES.size + len(pb.INTERNAL_TAIL)
_CHILD_TAIL = pb.INTERNAL_TAIL
_MISS_CHILDREN = ("zccp.nginx.admit", "zccp.engine.prepare", "zccp.queue", "zccp.prefill", "zccp.decode")
_REQUEST_ID, _TENANT, _INPUT, _OUTPUT, _RESPONSE_ID = (pb.key(k) for k in (
    "zccp.request_id", "zccp.tenant", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.response.id"))
ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
MAX_FRAME = 64 << 20
# spans per export: the SDK's transport costs ~1.7-2 ms of CPU per post whatever its size (a
# post of one span as much as one of 3,000: requests' environment and proxy lookups, the
# headers, the sendall), so the frames are gathered into posts of up to 8,192 spans (~1.5 MB,
# far below what collectors take) or what one OTEL_BSP_SCHEDULE_DELAY gathered, not the SDK's 512
POST_SPANS = 8192


def _read(inp: IO[bytes] | io.RawIOBase, n: int) -> bytes:
    """n bytes from the pipe (raw: a read may return fewer), fewer at its end."""
    data = inp.read(n) or b""
    while len(data) < n:
        more = inp.read(n - len(data))
        if not more:
            break
        data += more
    return data


def read_frame(inp: IO[bytes] | io.RawIOBase) -> Any:
    """The next frame's batch (zccp.observe.trace_export.frame), or None at the end of the pipe (the
    engine stopped or died)."""
    head = _read(inp, FRAME.size)
    if len(head) < FRAME.size:
        return None
    (n,) = FRAME.unpack(head)
    pickled, n = n & PICKLED, n & ~PICKLED
    if n > MAX_FRAME:
        raise ValueError(f"a frame of {n} bytes")
    data = _read(inp, n)
    if len(data) < n:
        return None
    return pickle.loads(data) if pickled else marshal.loads(data)


class SpanEncoder:
    """A record's spans as OTLP protobuf (zccp.observe.trace_export.RequestTrace.end writes the record)."""

    def __init__(self, static: dict[str, Any]) -> None:
        attrs: dict[str, Any] = {}
        if not os.environ.get("OTEL_SERVICE_NAME") and "service.name" not in os.environ.get(
                "OTEL_RESOURCE_ATTRIBUTES", ""):
            attrs["service.name"] = "zccp"
        # the SDK's resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, the SDK's own), encoded once
        self.request = pb.RequestEncoder(dict(Resource.create(attrs).attributes), "zccp")
        model: str = static["model"]
        fixed: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model,
                                 "server.address": static["server.address"]}
        if static.get("server.port") is not None:
            fixed["server.port"] = static["server.port"]
        if static.get("engine"):
            fixed["zccp.engine"] = static["engine"]
        self.fixed = pb.attributes(9, fixed)
        self.names = {n: pb.field(5, n.encode()) for n in (f"chat {model}", *CHILDREN)}
        self.root_name = self.names[f"chat {model}"]
        self.root_kind = self.root_name + b"\x30\x02"                              # the name, then SERVER
        self.child_names = {n: self.names[n] + b"\x30\x01" for n in CHILDREN}   # the name, then INTERNAL
        self._cache_attr: dict[str, bytes] = {}
        self._upstream: dict[str, tuple[bytes, bytes]] = {}
        self._packers: dict[tuple[str, int, bytes], tuple[struct.Struct, bytes, bytes]] = {}
        self._roots: dict[tuple[Any, ...], bytes] = {}
        self._misses: dict[tuple[str, int], tuple[struct.Struct, tuple[bytes, ...]]] = {}
        self._l1_attrs: dict[tuple[int, str], bytes] = {}    # an L1 hit's attributes but its request id
        self._inputs: dict[int, bytes] = {}                  # the token counts' attributes, by count
        self._outputs: dict[int, bytes] = {}

    def _cache(self, cache: str) -> bytes:
        got = self._cache_attr.get(cache)
        if got is None:
            got = self._cache_attr[cache] = pb.attributes(9, {"zccp.cache.result": cache})
        return got

    def _upstream_parts(self, model: str) -> tuple[bytes, bytes]:
        got = self._upstream.get(model)
        if got is None:
            if len(self._upstream) > 64:
                self._upstream.clear()
            got = self._upstream[model] = (pb.field(5, f"chat {model}".encode()), pb.attributes(
                9, {"gen_ai.operation.name": "chat", "gen_ai.request.model": model}))
        return got

    def _root_fixed(self, cache: str, status: int, slot: int, api: str, max_tokens: int,
                    finish: str | None) -> bytes:
        """The root's few-valued attributes, encoded once per combination (bounded)."""
        key = (cache, status, slot, api, max_tokens, finish)
        got = self._roots.get(key)
        if got is None:
            few = pb.few_valued
            got = self.fixed + self._cache(cache) + few("http.response.status_code", status) + \
                few("zccp.slot", slot) + few("zccp.api", api)
            if max_tokens:
                got += few("gen_ai.request.max_tokens", max_tokens)
            if finish is not None:
                got += few("gen_ai.response.finish_reasons", (finish,))
            if len(self._roots) >= 4096:
                self._roots.clear()
            self._roots[key] = got
        return got

    @staticmethod
    def _tokens(cache: dict[int, bytes], key: bytes, n: int) -> bytes:
        """A token count's attribute, encoded once per count (bounded)."""
        if len(cache) >= 4096:
            cache.clear()
        got = cache[n] = pb.int_attribute(key, n)
        return got

    def _packer(self, name: str, n_under: int, attrs: bytes) -> tuple[struct.Struct, bytes, bytes]:
        """A child span's struct (its id packed little-endian: random bits either way), its lead
        (b"\\x12", the span's length, the trace id's tag) and its name with its kind; made once
        per name, tracestate length and attributes (bounded)."""
        key = (name, n_under, attrs)
        got = self._packers.get(key)
        if got is None:
            nm = self.child_names[name]
            lead = b"\x12" + pb.varint(_CHILD_FIXED + n_under + len(nm) + len(attrs)) + b"\x0a\x10"
            got = (struct.Struct(f"<{len(lead)}s16s2sQ{n_under}s{len(nm)}sBQBQ{len(attrs)}s{len(_CHILD_TAIL)}s"),
                   lead, nm)
            if len(self._packers) >= 1024:
                self._packers.clear()
            self._packers[key] = got
        return got

    def _miss(self, cache: str, n_under: int) -> tuple[struct.Struct, tuple[bytes, ...]]:
        """A miss's five children (nginx's admission, prepare, queue, prefill, decode) as one
        struct: per request only the trace id, the ids, `under` and the times are packed, the
        rest is its constants (each span's lead and length, name, kind, attributes, tail), made
        once per cache result and tracestate length (bounded)."""
        key = (cache, n_under)
        got = self._misses.get(key)
        if got is None:
            fmt, prev = ["<"], b""
            consts: list[bytes] = []
            for name in _MISS_CHILDREN:
                attrs = self._cache(cache) if name == "zccp.engine.prepare" else b""
                nm = self.child_names[name] + b"\x39"        # then start_time_unix_nano
                lead = prev + b"\x12" + pb.varint(_CHILD_FIXED + n_under + len(nm) - 1 + len(attrs)) + b"\x0a\x10"
                fmt.append(f"{len(lead)}s16s2sQ{n_under}s{len(nm)}sQBQ")
                consts += (lead, nm)
                prev = attrs + _CHILD_TAIL
            fmt.append(f"{len(prev)}s")
            consts.append(prev)
            if len(self._misses) >= 1024:
                self._misses.clear()
            got = self._misses[key] = (struct.Struct("".join(fmt)), tuple(consts))
        return got

    def spans(self, rec: tuple[Any, ...]) -> tuple[bytes, int]:
        """A request's spans (their bytes, how many): per request only the ids, the times and
        the few per-request attributes are encoded, the rest made once (_miss, _packer, _root_fixed)."""
        (ids, flags, tid, root_id, (nginx_start, admit_us), wall0, perf0, (submitted, admitted, first, last),
         now, upstream, status, cache, slot, request_id, api, max_tokens, tenant, usage, response_id,
         tracestate) = rec
        cache = CACHE_NAMES.get(cache, "NONE")
        parent = 0
        if ids is not None:
            ptid, psid = int.from_bytes(ids[0], "big"), int.from_bytes(ids[1], "big")
            if ptid and psid:
                parent, tid = psid, tid or ptid
        tid_b = (tid or getrandbits(128) or 1).to_bytes(16, "big")
        root_b = (root_id or getrandbits(64) or 1).to_bytes(8, "big")
        nginx_start = nginx_start or wall0
        # the client's tracestate on every span of its trace (the SDK's children inherit it)
        state = pb.field(3, tracestate.encode()) if tracestate else b""
        under = state + b"\x22\x08" + root_b
        rnd = getrandbits
        if submitted and admitted and first and admit_us:      # a miss that reached its first token
            st, (l0, n0, l1, n1, l2, n2, l3, n3, l4, n4, end) = self._miss(cache, len(under))
            t_sub = wall0 + int((submitted - perf0) * 1e9)
            t_adm = wall0 + int((admitted - perf0) * 1e9)
            t_first = wall0 + int((first - perf0) * 1e9)
            out = [st.pack(l0, tid_b, b"\x12\x08", rnd(64) or 1, under, n0, nginx_start, 0x41,
                           nginx_start + admit_us * 1000,
                           l1, tid_b, b"\x12\x08", rnd(64) or 1, under, n1, wall0, 0x41, t_sub,
                           l2, tid_b, b"\x12\x08", rnd(64) or 1, under, n2, t_sub, 0x41, t_adm,
                           l3, tid_b, b"\x12\x08", rnd(64) or 1, under, n3, t_adm, 0x41, t_first,
                           l4, tid_b, b"\x12\x08", rnd(64) or 1, under, n4, t_first, 0x41,
                           wall0 + int((last - perf0) * 1e9) if last else now, end)]
            count = 6
        else:
            out = []
            packer, n_under, tail = self._packer, len(under), _CHILD_TAIL

            def child(name: str, start: int, end: int, attrs: bytes = b"") -> None:
                st, lead, nm = packer(name, n_under, attrs)
                out.append(st.pack(lead, tid_b, b"\x12\x08", rnd(64) or 1, under, nm, 0x39, start, 0x41, end,
                                   attrs, tail))

            if admit_us:
                child("zccp.nginx.admit", nginx_start, nginx_start + admit_us * 1000)
            if submitted:
                t_sub = wall0 + int((submitted - perf0) * 1e9)
                child("zccp.engine.prepare", wall0, t_sub, self._cache(cache))
                if admitted:
                    t_adm = wall0 + int((admitted - perf0) * 1e9)
                    child("zccp.queue", t_sub, t_adm)
                if first:
                    t_first = wall0 + int((first - perf0) * 1e9)
                    if admitted:
                        child("zccp.prefill", t_adm, t_first)
                    child("zccp.decode", t_first, wall0 + int((last - perf0) * 1e9) if last else now)
            elif status == 200:
                child("zccp.cache.replay", wall0, now, self._cache(cache))
            count = len(out) + 1
        if upstream is not None:
            up_id, up_model, up_start = upstream
            name, up_attrs = self._upstream_parts(up_model)
            out.append(pb.span(tid_b, up_id, int.from_bytes(root_b, "big"), name, pb.CLIENT, up_start, now, up_attrs,
                               pb.ERROR if status != 200 else pb.UNSET, trace_state=state))
            count += 1
        finish = usage[2] if usage is not None else None
        attrs = [self._roots.get((cache, status, slot, api, max_tokens, finish)) or
                 self._root_fixed(cache, status, slot, api, max_tokens, finish),
                 pb.str_attribute(_REQUEST_ID, request_id)]
        if tenant is not None:
            attrs.append(pb.str_attribute(_TENANT, tenant.hex()))     # a digest's first 8 bytes
        if usage is not None:
            n_in, n_out = usage[0], usage[1]
            attrs += (self._inputs.get(n_in) or self._tokens(self._inputs, _INPUT, n_in),
                      self._outputs.get(n_out) or self._tokens(self._outputs, _OUTPUT, n_out))
        if response_id:
            attrs.append(pb.str_attribute(_RESPONSE_ID, response_id))
        out.append(pb.span_message(tid_b, root_b, state, parent.to_bytes(8, "big") if parent else b"",
                                   self.root_kind, min(nginx_start, wall0), now, attrs,
                                   pb.tail(pb.ERROR if status >= 500 else pb.UNSET, bool(parent))))
        return b"".join(out), count

    def l1(self, rec: tuple[Any, ...]) -> tuple[bytes, int]:
        """An L1 hit's one span (nginx answered it alone): the request span, under the client's."""
        _, tid_b, sid_b, flags, status, start, dur_us, api, request_id = rec
        parent = tid = 0
        if tid_b is not None:
            ptid, psid = int.from_bytes(tid_b, "big"), int.from_bytes(sid_b, "big")
            if ptid and psid:
                parent, tid = psid, ptid
        fixed = self._l1_attrs.get((status, api))
        if fixed is None:
            few = pb.few_valued
            if len(self._l1_attrs) >= 1024:
                self._l1_attrs.clear()
            fixed = self._l1_attrs[(status, api)] = self.fixed + self._cache("HIT") + \
                few("zccp.cache.layer", "L1") + few("http.response.status_code", status) + few("zccp.api", api)
        attrs = fixed + pb.str_attribute(_REQUEST_ID, request_id)
        return pb.span((tid or getrandbits(128) or 1).to_bytes(16, "big"), getrandbits(64) or 1, parent,
                           self.root_name, pb.SERVER, start, start + dur_us * 1000, attrs,
                           pb.ERROR if status >= 500 else pb.UNSET, parent_remote=bool(parent)), 1


class BytesExporter(OTLPSpanExporter):
    """The SDK's OTLP/HTTP exporter (its endpoint, headers, TLS, compression, timeout and retry
    from the OTEL_EXPORTER_OTLP_* environment), sending a request already encoded."""

    def export_encoded(self, data: bytes) -> bool:
        return bool(self._client.export(data).success)


def post_spans(env: Mapping[str, str] = os.environ) -> int:
    """Spans per export: OTEL_BSP_MAX_EXPORT_BATCH_SIZE when set, else POST_SPANS."""
    try:
        return max(1, min(int(env.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "")), 1 << 16))
    except ValueError:
        return POST_SPANS


def export(exporter: BytesExporter, encoder: pb.RequestEncoder, spans: list[bytes], counts: list[int],
           report: Callable[[str, int], None], per: int = POST_SPANS,
           keep: bool = False) -> tuple[list[bytes], list[int]]:
    """`spans[i]`: a request's spans, `counts[i]` of them, in posts of up to `per` spans (a
    request's spans are never split: one with more than `per` goes alone). keep: a last part
    of less than `per` is not sent but returned, to gather more."""
    n, i = len(spans), 0
    while i < n:
        j, total = i + 1, counts[i]
        while j < n and total + counts[j] <= per:
            total += counts[j]
            j += 1
        if keep and j == n and total < per:
            break
        try:
            ok = exporter.export_encoded(encoder.encode(spans[i:j]))
        except Exception:      # an exporter bug loses this batch, not the process
            ok = False
        report("exported" if ok else "failed", total)
        i = j
    return spans[i:], counts[i:]


def encode_batch(encoder: SpanEncoder, batch: list[tuple[Any, ...]],
                 report: Callable[[str, int], None]) -> tuple[list[bytes], list[int]]:
    """The spans of a batch of records, per record (its bytes, its span count). A record that
    cannot be encoded (a value out of its field's range: nginx's timestamps come from shared
    memory) is lost alone, counted `invalid`, never half-sent; the span process goes on (it
    used to die, and tracing with it)."""
    spans: list[bytes] = []
    counts: list[int] = []
    invalid = 0
    l1, request = encoder.l1, encoder.spans
    for rec in batch:
        try:
            data, n = (l1 if rec[0] == L1 else request)(rec)
        except Exception:
            invalid += 1
            continue
        spans.append(data)
        counts.append(n)
    if invalid:
        report("invalid", invalid)
    return spans, counts


def main() -> None:
    # the engine's signals are the engine's: this process ends when its pipe does
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    inp = io.FileIO(sys.stdin.fileno(), "rb", closefd=False)     # unbuffered: select sees what is unread
    out = sys.stdout.buffer
    sys.stdout = sys.stderr            # nothing else may write into the counts

    def report(what: str, n: int) -> None:
        out.write(f"{what} {n}\n".encode())
        out.flush()

    static = read_frame(inp)
    if static is None:
        return
    encoder = SpanEncoder(static)
    endpoint = static.get("endpoint") or (None if any(os.environ.get(v) for v in ENDPOINT_VARS)
                                          else "http://localhost:4318/v1/traces")
    exporter = BytesExporter(endpoint=endpoint, timeout=5)
    per, delay = post_spans(), schedule_delay()
    spans: list[bytes] = []
    counts: list[int] = []
    try:
        # frames are gathered until a post's worth of spans or, from the first, one schedule delay
        end, due = False, 0.0
        while not end:
            full = False
            while not full:
                if spans and not select.select([inp], [], [], max(0.0, due - time.monotonic()))[0]:
                    break
                batch = read_frame(inp)
                if batch is None:
                    end = True
                    break
                if not spans:
                    due = time.monotonic() + delay
                got, n = encode_batch(encoder, batch, report)
                spans += got
                counts += n
                full = sum(counts) >= per
            # full: the whole posts now, the rest gathers on (from now, one delay); else all of it
            spans, counts = export(exporter, encoder.request, spans, counts, report, per, keep=full and not end)
            due = time.monotonic() + delay
    finally:
        exporter.shutdown()


if __name__ == "__main__":
    main()
