"""The shared-memory ABI, loaded from shm_abi/zccp_abi.h (the one source of truth).

Nothing here restates an offset or a constant: the header is handed to cffi as
it is, constants are read back from its enums, and the sizes the header itself
promises (ZCCP_*_SIZE) are asserted at import time.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import cffi

from zccp.config.paths import abi_header

HEADER_PATH = abi_header()
ffi = cffi.FFI()
# A pointer to one of the header's structs (ffi.cast): its fields exist only at run time,
# read from zccp_abi.h, so to the type checker it is Any.
CData = Any
ffi.cdef(HEADER_PATH.read_text(encoding="utf-8"))
_lib = ffi.dlopen(None)  # only for reading enum constants


def const(name: str) -> int:
    """An enum constant from the header, e.g. const("ZCCP_SLOT_MAGIC")."""
    return int(getattr(_lib, name))


ABI_VERSION = const("ZCCP_ABI_VERSION")
CONTROL_MAGIC = const("ZCCP_CONTROL_MAGIC")
SLOT_MAGIC = const("ZCCP_SLOT_MAGIC")
PAGE_SIZE = const("ZCCP_PAGE_SIZE")
META_OFFSET = const("ZCCP_SLOT_META_OFFSET")
SIG_OFFSET = const("ZCCP_SLOT_SIG_OFFSET")
REQ_OFFSET = const("ZCCP_SLOT_REQ_OFFSET")
MINHASH_COUNT = const("ZCCP_MINHASH_COUNT")
CSF_BANDS = const("ZCCP_CSF_BANDS")
RING_SIZE = const("ZCCP_RING_SIZE")
NOTICE_SIZE = const("ZCCP_NOTICE_SIZE")
REQUEST_ID_MAX = const("ZCCP_REQUEST_ID_MAX")
TRACESTATE_MAX = const("ZCCP_TRACESTATE_MAX")
L1_SPAN_SIZE = const("ZCCP_L1_SPAN_SIZE")
SOCKET_PATH_MAX = const("ZCCP_SOCKET_PATH_MAX")

# The header states its own sizes; a compiler/ABI mismatch fails here, loudly.
for _struct, _size in (
    ("struct zccp_control", "ZCCP_CONTROL_SIZE"),
    ("struct zccp_slot_header", "ZCCP_SLOT_HEADER_SIZE"),
    ("struct zccp_slot_meta", "ZCCP_SLOT_META_SIZE"),
    ("struct zccp_slot_signature", "ZCCP_SLOT_SIG_SIZE"),
    ("struct zccp_slot_request", "ZCCP_SLOT_REQ_SIZE"),
    ("struct zccp_ring", "ZCCP_RING_SIZE"),
    ("struct zccp_notice", "ZCCP_NOTICE_SIZE"),
    ("struct zccp_l1_span", "ZCCP_L1_SPAN_SIZE"),
):
    if ffi.sizeof(_struct) != const(_size):
        raise ImportError(f"ABI mismatch: sizeof({_struct}) = {ffi.sizeof(_struct)} != {_size}")
if ffi.sizeof("struct zccp_slot_header") != META_OFFSET:
    raise ImportError("ABI mismatch: the meta block must follow the slot header")
if META_OFFSET + ffi.sizeof("struct zccp_slot_meta") != SIG_OFFSET:
    raise ImportError("ABI mismatch: the signature must follow the meta block")
if SIG_OFFSET + ffi.sizeof("struct zccp_slot_signature") != REQ_OFFSET:
    raise ImportError("ABI mismatch: the request block must follow the signature")
if REQ_OFFSET + ffi.sizeof("struct zccp_slot_request") > PAGE_SIZE:
    raise ImportError("ABI mismatch: header, meta, signature and request must fit in the first page of a slot")
if ffi.sizeof("struct zccp_slot_signature") != 4 * MINHASH_COUNT:
    raise ImportError("ABI mismatch: signature size != 4 * ZCCP_MINHASH_COUNT")
if ffi.sizeof(ffi.typeof("struct zccp_slot_request").fields[2][1].type) != REQUEST_ID_MAX:
    raise ImportError("ABI mismatch: request.request_id must hold ZCCP_REQUEST_ID_MAX bytes")


_STRUCT_CODES = {"uint8_t": "B", "int32_t": "i", "uint32_t": "I", "int64_t": "q", "uint64_t": "Q"}


def packer(name: str) -> struct.Struct:
    """A struct.Struct for `struct <name>` (scalar fields only: the doorbell frames), derived
    from the header's layout as cffi computed it, padding included: packing a frame costs a
    fraction of building it through cffi, and nothing restates the layout."""
    t: Any = ffi.typeof(f"struct {name}")
    fmt, pos = "=", 0
    for _, f in t.fields:
        if f.offset > pos:
            fmt += f"{f.offset - pos}x"
        fmt += _STRUCT_CODES[f.type.cname]
        pos = f.offset + ffi.sizeof(f.type)
    if ffi.sizeof(t) > pos:
        fmt += f"{ffi.sizeof(t) - pos}x"
    out = struct.Struct(fmt)
    if out.size != ffi.sizeof(t):  # pragma: no cover - a field type missing from _STRUCT_CODES
        raise ImportError(f"ABI: struct {name} does not pack as laid out")
    return out


def _enum(name: str, prefix: str) -> Any:
    """The header's `enum <name>` as a class of int constants, named without `prefix`:
    _enum("zccp_slot_state", "ZCCP_STATE_").FREE == ZCCP_STATE_FREE. Names and values
    come from the header alone."""
    members = ffi.typeof(f"enum {name}").relements
    consts = {k[len(prefix):]: int(v) for k, v in members.items() if k.startswith(prefix)}
    if len(consts) != len(members):
        raise ImportError(f"ABI: every member of enum {name} must start with {prefix}")
    return type(name, (), consts)


State = _enum("zccp_slot_state", "ZCCP_STATE_")            # slot life cycle
Flag = _enum("zccp_slot_flags", "ZCCP_FLAG_")              # header.flags bits
Kind = _enum("zccp_request_kind", "ZCCP_KIND_")            # request.kind
OpenAIApi = _enum("zccp_openai_api", "ZCCP_OPENAI_")       # request.openai_api
CacheStatus = _enum("zccp_cache_status", "ZCCP_CACHE_")    # meta.cache_status
CacheReason = _enum("zccp_cache_reason", "ZCCP_REASON_")   # meta.cache_reason
Op = _enum("zccp_op", "ZCCP_OP_")                          # doorbell opcodes
EngineState = _enum("zccp_engine_state", "ZCCP_ENGINE_")   # control.engine_state
# meta.cache_status -> its X-ZCCP-Cache name (NONE has none)
CACHE_NAMES: dict[int, str] = {v: k for k, v in vars(CacheStatus).items() if isinstance(v, int) and k != "NONE"}


@dataclass(frozen=True)
class SlotLayout:
    """Where each region of a slot lives; every region starts on a page boundary."""

    slot_count: int
    slot_size: int
    payload_offset: int
    payload_cap: int
    tokens_offset: int
    tokens_cap: int          # u32 ids
    response_offset: int
    response_cap: int

    @property
    def arena_size(self) -> int:
        return PAGE_SIZE + self.slot_count * self.slot_size

    def slot_base(self, index: int) -> int:
        return PAGE_SIZE + index * self.slot_size

    @classmethod
    def build(cls, slot_count: int, slot_size: int, tokens_bytes: int, response_bytes: int) -> SlotLayout:
        for name, v in (("slot_size", slot_size), ("tokens", tokens_bytes), ("response", response_bytes)):
            if v <= 0 or v % PAGE_SIZE:
                raise ValueError(f"{name} must be a positive multiple of {PAGE_SIZE}, got {v}")
        payload_cap = slot_size - PAGE_SIZE - tokens_bytes - response_bytes
        if payload_cap < PAGE_SIZE:
            raise ValueError("slot too small for its regions")
        tokens_offset = PAGE_SIZE + payload_cap
        return cls(
            slot_count=slot_count,
            slot_size=slot_size,
            payload_offset=PAGE_SIZE,
            payload_cap=payload_cap,
            tokens_offset=tokens_offset,
            tokens_cap=tokens_bytes // 4,
            response_offset=tokens_offset + tokens_bytes,
            response_cap=response_bytes,
        )
