"""Pieces shared by the Anthropic and OpenAI front ends: limits, JSON decoding,
strict JSON type checks, turn merging and SSE framing."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Final

import orjson

from ..shared_types import ChatMessage, Role
from .fields import json_type

dumps = orjson.dumps

# Separator used wherever several pieces of text become one (system parts,
# content blocks of one message, consecutive turns of the same role).
JOIN: Final = "\n\n"


@dataclass(frozen=True)
class ParseLimits:
    served_models: frozenset[str]   # model names this server answers to
    max_tokens_cap: int             # largest max_tokens a request may ask for
    default_max_tokens: int         # OpenAI: used when no max_(completion_)tokens is given
    max_queue: int | None = None    # model.max_queue: more choices than this can never be queued


class BodyError(ValueError):
    """The body is not a JSON object; `reason` is "empty", "invalid" or "not_object"."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason
        self.detail = detail


def decode_object(body: bytes | memoryview) -> dict[str, Any]:
    """Parse the request body once; raise BodyError unless it is a JSON object.

    `body` may be a memoryview of shared memory: orjson reads it in place.
    """
    if not body or (len(body) <= 64 and bytes(body).isspace()):
        raise BodyError("empty")
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BodyError("invalid", str(exc)) from None
    if not isinstance(value, dict):
        raise BodyError("not_object", json_type(value))
    return value


def fmt_num(v: float) -> str:
    """Numbers in error messages: 2 rather than 2.0 for whole floats."""
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def marker(block_type: str) -> str:
    """Text that stands in for a non-text content block."""
    return f"[{block_type}]"


def merge_turns(turns: list[tuple[Role, str]]) -> tuple[ChatMessage, ...]:
    """Build the message tuple, joining consecutive turns of the same role."""
    out: list[ChatMessage] = []
    pending_role: Role | None = None
    pending: list[str] = []
    for role, text in turns:
        if role != pending_role and pending_role is not None:
            out.append(ChatMessage(pending_role, pending[0] if len(pending) == 1 else JOIN.join(pending)))
            pending = []
        pending_role = role
        pending.append(text)
    if pending_role is not None:
        out.append(ChatMessage(pending_role, pending[0] if len(pending) == 1 else JOIN.join(pending)))
    return tuple(out)


# --- Server-sent events ---

def sse(payload: bytes, event: str | None = None) -> bytes:
    """One SSE frame; `payload` is already-serialized JSON (never contains a newline)."""
    if event is None:
        return b"data: " + payload + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + payload + b"\n\n"


_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_B62_TABLE = bytes(ord(_B62[b % 62]) for b in range(256))


# Ids are cut from 8 KiB of os.urandom made at a time (one getrandom(2) per ~340 ids, not one
# per response); each character is used once. A forked child starts its own pool.
_ID_POOL_BYTES: Final = 8192
_id_lock = threading.Lock()
_id_pool = ""
_id_at = 0


def _reset_id_pool() -> None:
    global _id_pool, _id_at
    _id_pool, _id_at = "", 0


os.register_at_fork(after_in_child=_reset_id_pool)


def random_id(prefix: str, n: int = 24) -> str:
    """prefix + n base62 characters from os.urandom (one translate per pool, no per-byte loop)."""
    global _id_pool, _id_at
    if n > _ID_POOL_BYTES:
        return prefix + os.urandom(n).translate(_B62_TABLE).decode("ascii")
    with _id_lock:        # the model thread names responses too
        at = _id_at
        if at + n > len(_id_pool):
            _id_pool, at = os.urandom(_ID_POOL_BYTES).translate(_B62_TABLE).decode("ascii"), 0
        _id_at = at + n
        return prefix + _id_pool[at:at + n]
