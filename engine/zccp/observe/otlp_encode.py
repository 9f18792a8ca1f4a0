"""OTLP trace protobuf (opentelemetry/proto/trace/v1/trace.proto), written by hand for the
span process (zccp.observe.trace_spans).

Why not the SDK's encoder: it builds one protobuf message object per span, attribute and
value (opentelemetry-exporter-otlp-proto-common), ~100 us per span on the shared test host,
over 600 us per traced request, which was most of tracing's cost (bench/tracing.md). Here a
span is a few byte strings joined, the constant parts (the resource, the scope, the
engine's fixed attributes, each key) encoded once. The bytes go out through the SDK's own
OTLP/HTTP exporter's transport; tests/unit/test_otlp_encode.py decodes them with the
official opentelemetry-proto and compares with what the SDK's encoder makes.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

_FIXED64 = struct.Struct("<Q")
TIMES = struct.Struct("<BQBQ")     # start_time_unix_nano (7) and end_time_unix_nano (8), fixed64
_DOUBLE = struct.Struct("<d")

# OTLP's SpanKind (the SDK's + 1) and StatusCode
INTERNAL, SERVER, CLIENT = 1, 2, 3
UNSET, OK, ERROR = 0, 1, 2
# Span.flags: the W3C flags' low byte, and whether the parent is known remote or not
HAS_IS_REMOTE, IS_REMOTE = 0x100, 0x200


_SMALL = [bytes((i,)) for i in range(0x80)]


def varint(n: int) -> bytes:
    if 0 <= n < 0x80:
        return _SMALL[n]
    if 0 < n < 0x4000:     # two bytes: a span's length, a token count
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(num: int, data: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    n = len(data)
    return varint(num << 3 | 2) + (_SMALL[n] if n < 0x80 else varint(n)) + data


def any_value(v: Any) -> bytes:
    if isinstance(v, bool):
        return varint(2 << 3) + (b"\x01" if v else b"\x00")
    if isinstance(v, int):
        return varint(3 << 3) + varint(v)
    if isinstance(v, float):
        return varint(4 << 3 | 1) + _DOUBLE.pack(v)
    if isinstance(v, str):
        return field(1, v.encode())
    if isinstance(v, bytes):
        return field(7, v)
    if isinstance(v, Sequence):
        return field(5, b"".join(field(1, any_value(x)) for x in v))
    raise TypeError(f"an attribute of type {type(v).__name__}")


_KEYS: dict[str, bytes] = {}


def key(k: str) -> bytes:
    """An attribute's key, encoded (KeyValue's field 1), made once per key."""
    got = _KEYS.get(k)
    if got is None:
        got = _KEYS[k] = field(1, k.encode())
    return got


def str_attribute(key: bytes, v: str) -> bytes:
    """A span attribute (field 9) of a string value, its key from key()."""
    b = v.encode()
    n = len(b)
    av = b"\x0a" + (_SMALL[n] if n < 0x80 else varint(n)) + b
    n = len(av)
    kv = key + b"\x12" + (_SMALL[n] if n < 0x80 else varint(n)) + av
    n = len(kv)
    return b"\x4a" + (_SMALL[n] if n < 0x80 else varint(n)) + kv


def int_attribute(key: bytes, v: int) -> bytes:
    """A span attribute (field 9) of an integer value, its key from key()."""
    av = b"\x18" + varint(v)
    kv = key + b"\x12" + _SMALL[len(av)] + av
    return b"\x4a" + _SMALL[len(kv)] + kv if len(kv) < 0x80 else field(9, kv)


def key_value(k: str, v: Any) -> bytes:
    """One KeyValue, as a span's or a resource's attribute (field 9 / field 1 around it)."""
    key = _KEYS.get(k)
    if key is None:
        key = _KEYS[k] = field(1, k.encode())
    return key + field(2, any_value(v))


def attributes(num: int, attrs: Mapping[str, Any]) -> bytes:
    return b"".join(field(num, key_value(k, v)) for k, v in attrs.items())


_FEW: dict[tuple[str, Any], bytes] = {}


def few_valued(k: str, v: Any) -> bytes:
    """A span attribute of few values (a status, an API, a finish reason, a slot), encoded once."""
    got = _FEW.get((k, v))
    if got is None:
        if len(_FEW) >= 4096:
            _FEW.clear()
        got = _FEW[(k, v)] = field(9, key_value(k, v))
    return got


def span_attributes(attrs: Mapping[str, Any]) -> bytes:
    """A span's attributes (field 9), strings and integers inline: the per-request part."""
    out = []
    keys = _KEYS
    for k, v in attrs.items():
        key = keys.get(k)
        if key is None:
            key = keys[k] = field(1, k.encode())
        t = type(v)
        if t is str:
            b = v.encode()
            n = len(b)
            av = b"\x0a" + (_SMALL[n] if n < 0x80 else varint(n)) + b
        elif t is int:
            av = b"\x18" + varint(v)
        else:
            av = any_value(v)
        n = len(av)
        kv = key + b"\x12" + (_SMALL[n] if n < 0x80 else varint(n)) + av
        n = len(kv)
        out.append(b"\x4a" + (_SMALL[n] if n < 0x80 else varint(n)) + kv)
    return b"".join(out)


# an INTERNAL span under a local parent ends so: Status{}, flags (zccp.observe.trace_spans writes those inline)
INTERNAL_TAIL = b"\x7a\x00\x85\x01" + struct.pack("<I", HAS_IS_REMOTE)


def _tail(status: int, parent_remote: bool) -> bytes:
    """Status{code}, as the SDK's, then the flags."""
    return (b"\x7a\x02\x18" + varint(status) if status else b"\x7a\x00") + b"\x85\x01" + \
        struct.pack("<I", HAS_IS_REMOTE | IS_REMOTE if parent_remote else HAS_IS_REMOTE)


_KINDS = [b"\x30" + varint(k) for k in range(6)]
_TAILS = {(s, r): _tail(s, r) for s in (UNSET, OK, ERROR) for r in (False, True)}


def tail(status: int, parent_remote: bool) -> bytes:
    """A span's Status and flags, made once per status and parent."""
    return _TAILS.get((status, parent_remote)) or _tail(status, parent_remote)


def span_message(trace_id: bytes, span_id: bytes, trace_state: bytes, parent_id: bytes, name_kind: bytes,
                 start: int, end: int, attrs: Sequence[bytes], tail_bytes: bytes) -> bytes:
    """One Span message's bytes from parts already encoded: ids as bytes (parent_id b"" for
    none), name_kind: the name's field then the kind's, attrs: attribute fields, tail_bytes:
    tail(). span() below, and the span process's root spans (their parts made once)."""
    body = b"".join((b"\x0a\x10", trace_id, b"\x12\x08", span_id, trace_state,
                     b"\x22\x08" + parent_id if parent_id else b"", name_kind,
                     TIMES.pack(0x39, start, 0x41, end), *attrs, tail_bytes))
    n = len(body)
    return b"\x12" + (_SMALL[n] if n < 0x80 else varint(n)) + body


def span(trace_id: bytes, span_id: int, parent_id: int, name: bytes, kind: int, start: int, end: int,
         attrs: bytes = b"", status: int = UNSET, parent_remote: bool = False, trace_state: bytes = b"") -> bytes:
    """One Span message's bytes. trace_id: 16 bytes; name: field(5, ...) made once per name;
    attrs: attributes(9, ...) or pieces of it; trace_state: field(3, ...) or b""."""
    return span_message(trace_id, span_id.to_bytes(8, "big"), trace_state,
                        parent_id.to_bytes(8, "big") if parent_id else b"", name + _KINDS[kind], start, end,
                        (attrs,), tail(status, parent_remote))


class RequestEncoder:
    """ExportTraceServiceRequest bytes of many spans, the resource and scope encoded once."""

    def __init__(self, resource_attrs: Mapping[str, Any], scope_name: str) -> None:
        self._resource = field(1, attributes(1, resource_attrs))
        self._scope = field(1, field(1, scope_name.encode()))

    def encode(self, spans: Sequence[bytes]) -> bytes:
        """One join: each nested copy of a ~0.5 MB request was a fresh allocation's page faults
        (~4 us per miss record of the span process's time)."""
        inner = len(self._scope) + sum(map(len, spans))
        head = b"\x12" + varint(inner)
        return b"".join((b"\x0a", varint(len(self._resource) + len(head) + inner), self._resource, head,
                         self._scope, *spans))
