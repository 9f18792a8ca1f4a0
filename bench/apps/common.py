"""The work B and C do per request: exactly the engine's pipeline, minus shared memory.

parse_request (orjson, same validation) -> the backend's prompt format (the byte
tokenizer, or the hf checkpoint's chat template) into a preallocated int32 token
array (the engine tokenizes into the slot's array) -> the same model backend through
zccp.serving.text_assembly.generate_text, one request at a time per thread (no batching: what a
FastAPI app around a model's generate() does) -> anthropic.render_response /
StreamEncoder. Only the response id differs from what the engine would answer.

Configured from the environment (set by bench/run.py):
  ZCCP_BENCH_BACKEND      null | tiny | hf
  ZCCP_BENCH_MODEL_PATH   hf: the checkpoint directory
  ZCCP_BENCH_MODEL_NAME   served model name (zccp-null / zccp-tiny)
  ZCCP_BENCH_MAX_CONTEXT  model max_context
  ZCCP_BENCH_TOKENS_CAP   token array capacity (ids); the engine's slot holds tokens_kb*256
  ZCCP_BENCH_MAX_TOKENS_CAP  limits.max_tokens_cap
"""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Iterator

import torch

from zccp.api import anthropic
from zccp.api.common import ParseLimits
from zccp.serving.text_assembly import generate_text
from zccp.model.prompt import Prompt
from zccp.model.registry import build_backend
from zccp.model.tokenizer import PromptTooLong
from zccp.shared_types import ApiError, GenerationResult, TextDelta

torch.set_num_threads(1)   # the engine's model.threads default

BACKEND_KIND = os.environ.get("ZCCP_BENCH_BACKEND", "null")
MODEL_NAME = os.environ.get("ZCCP_BENCH_MODEL_NAME", "zccp-null")
MAX_CONTEXT = int(os.environ.get("ZCCP_BENCH_MAX_CONTEXT", "8192"))
TOKENS_CAP = int(os.environ.get("ZCCP_BENCH_TOKENS_CAP", str(256 * 256)))
LIMITS = ParseLimits(
    served_models=frozenset({MODEL_NAME}),
    max_tokens_cap=int(os.environ.get("ZCCP_BENCH_MAX_TOKENS_CAP", "4096")),
    default_max_tokens=256,
)

if BACKEND_KIND == "hf":
    BACKEND = build_backend("hf", name=MODEL_NAME, max_context=MAX_CONTEXT, path=os.environ["ZCCP_BENCH_MODEL_PATH"])
else:
    BACKEND = build_backend(BACKEND_KIND, name=MODEL_NAME, max_context=MAX_CONTEXT)

# The instant null backend runs inline (as the engine does); a real model does not.
INLINE = BACKEND_KIND == "null"

# Preallocated token arrays, one per request in flight (the engine's is the slot's).
_free: queue.SimpleQueue[torch.Tensor] = queue.SimpleQueue()


def _take_tokens() -> torch.Tensor:
    try:
        return _free.get_nowait()
    except queue.Empty:
        return torch.empty(TOKENS_CAP, dtype=torch.int32)


def _never() -> bool:
    return False


class Prepared:
    __slots__ = ("req", "input_ids", "buf")

    def __init__(self, req, input_ids, buf) -> None:
        self.req = req
        self.input_ids = input_ids
        self.buf = buf

    def release(self) -> None:
        self.input_ids = None
        _free.put(self.buf)


def prepare(body: bytes) -> Prepared:
    """Parse + tokenize; raises ApiError like the engine's flow (zccp.prep.prepare.prepare)."""
    return prepare_doc(anthropic.decode_body(body))


def prepare_doc(doc: dict) -> Prepared:
    """prepare() of a body already decoded by anthropic.decode_body."""
    req = anthropic.parse_document(doc, LIMITS)
    out = _take_tokens()
    try:
        n = BACKEND.prompt.encode_into(Prompt(req, lambda: anthropic.chat_input(doc)), out)
    except PromptTooLong as exc:
        _free.put(out)
        raise ApiError(413, "request_too_large",
                       f"prompt is {exc.needed} tokens; a slot holds at most {exc.capacity}") from None
    if n + req.sampling.max_tokens > BACKEND.max_context:
        _free.put(out)
        raise ApiError(400, "invalid_request_error",
                       f"prompt is too long: {n} tokens + max_tokens {req.sampling.max_tokens} > "
                       f"{BACKEND.max_context} maximum", param="max_tokens")
    return Prepared(req, out[:n], out)


def error_reply(err: ApiError) -> tuple[int, bytes]:
    return anthropic.http_status(err), anthropic.render_error(err)


def complete(p: Prepared) -> bytes:
    """Non-streaming: the full JSON response."""
    return complete_with_result(p)[0]


def complete_with_result(p: Prepared) -> tuple[bytes, GenerationResult]:
    """complete(), and the result it rendered (what a cache stores)."""
    rid, created = anthropic.new_response_id(), int(time.time())
    result = None
    try:
        for ev in generate_text(BACKEND, p.input_ids, p.req.sampling, _never):
            if isinstance(ev, GenerationResult):
                result = ev
    finally:
        p.release()
    assert result is not None
    return anthropic.render_response(p.req, result, rid, created), result


def stream(p: Prepared) -> Iterator[bytes]:
    """Streaming: the same SSE bytes the engine writes into the slot."""
    rid, created = anthropic.new_response_id(), int(time.time())
    enc = anthropic.StreamEncoder(p.req, rid, created, int(p.input_ids.numel()))
    yield enc.start()
    result = None
    try:
        for ev in generate_text(BACKEND, p.input_ids, p.req.sampling, _never):
            if isinstance(ev, TextDelta):
                if ev.text:
                    yield enc.delta(ev)
            else:
                result = ev
    finally:
        p.release()
    assert result is not None
    yield enc.finish(result)


def handle(body: bytes) -> tuple[int, bytes | Iterator[bytes], bool]:
    """(status, bytes or an SSE iterator, is_sse) for one request body."""
    try:
        p = prepare(body)
    except ApiError as err:
        status, data = error_reply(err)
        return status, data, False
    if p.req.stream:
        return 200, stream(p), True
    return 200, complete(p), False
