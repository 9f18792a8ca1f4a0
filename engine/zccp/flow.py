"""One request, from the slot's payload to the slot's response region.

parse (once, orjson, in the engine) -> tokenize into the slot's token array ->
model reads a zero-copy view of it -> each API's bytes written to the response
ring. Client errors come back through the same slot as API-shaped JSON.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from zccp.abi import Flag
from zccp.api import anthropic as anthropic_api
from zccp.api import openai as openai_api
from zccp.api.common import ParseLimits
from zccp.cache import CachedAnswer
from zccp.arena import SlotView
from zccp.generation import generate_text
from zccp.metrics import EngineMetrics
from zccp.model.base import ModelBackend
from zccp.model.tokenizer import PromptTooLong, encode_chat_into
from zccp.request import ApiError, GenerationRequest, GenerationResult, TextDelta
from zccp.response import ResponseWriter, SlotAbandoned

log = logging.getLogger("zccp.pipeline")


@dataclass
class RequestContext:
    view: SlotView
    generation: int
    payload: memoryview            # the body in shared memory, validated length
    tokens: torch.Tensor           # the slot's whole token array (int32 view of the mmap)
    writer: ResponseWriter
    cancelled: Callable[[], bool]
    context_id: str


@dataclass(frozen=True)
class PipelineDeps:
    backend: ModelBackend
    limits: ParseLimits
    input_view: Callable[[torch.Tensor], torch.Tensor]   # device seam
    device_id: int
    metrics: EngineMetrics


def api_for(flags: int) -> ModuleType:
    return openai_api if flags & Flag.API_OPENAI else anthropic_api


@dataclass(frozen=True)
class Prepared:
    """A parsed, tokenized request, ready for the model."""

    api: ModuleType
    req: GenerationRequest
    input_ids: torch.Tensor
    started: float
    doc: dict[str, Any]              # the parsed body (the fingerprint may reuse it, and mask it)


def _parse_and_tokenize(ctx: RequestContext, deps: PipelineDeps,
                        api: ModuleType) -> tuple[GenerationRequest, torch.Tensor, dict[str, Any]]:
    doc = api.decode_body(ctx.payload)
    req = api.parse_document(doc, deps.limits)
    try:
        n = encode_chat_into(req.system, req.messages, ctx.tokens)
    except PromptTooLong as exc:
        raise ApiError(413, "request_too_large",
                       f"prompt is {exc.needed} tokens; a slot holds at most {exc.capacity}") from None
    h, meta = ctx.view.header, ctx.view.meta
    h.tokens_len = n
    meta.prompt_len = n
    meta.max_tokens = req.sampling.max_tokens
    meta.gpu_device_id = deps.device_id
    # The prefill plan, shown to the client as X-ZCCP-Plan: chunks of the backend's
    # prefill_chunk tokens through the KV cache, or one pass (0).
    chunk = getattr(deps.backend, "prefill_chunk", 0)
    meta.plan_chunks = -(-n // chunk) if chunk and n > chunk else 0
    limit = deps.backend.max_context
    if n + req.sampling.max_tokens > limit:
        raise ApiError(400, "invalid_request_error",
                       f"prompt is too long: {n} tokens + max_tokens {req.sampling.max_tokens} > {limit} maximum",
                       param="max_tokens" if n < limit else "messages")
    return req, deps.input_view(ctx.tokens[:n]), doc


def prepare(ctx: RequestContext, deps: PipelineDeps) -> Prepared | None:
    """Parse and tokenize. Client errors are answered here, through the slot: None."""
    api = api_for(ctx.view.header.flags)
    started = time.perf_counter()
    try:
        try:
            req, input_ids, doc = _parse_and_tokenize(ctx, deps, api)
        except ApiError as err:
            ctx.writer.begin(api.http_status(err), sse=False)
            ctx.writer.write(api.render_error(err))
            ctx.writer.finish()
            _log_done(ctx, deps, api, api.http_status(err), started)
            return None
    except SlotAbandoned as exc:
        _abandoned(ctx, deps, exc)
        return None
    except Exception:
        log.exception("request failed", extra={"context_id": ctx.context_id})
        _fail(ctx, deps, api, None)
        return None
    return Prepared(api, req, input_ids, started, doc)


@dataclass(frozen=True)
class Completed:
    """A complete, successful answer: what the cache may store."""

    result: GenerationResult
    deltas: tuple[int, ...]          # lengths of the text deltas as streamed (one for non-streamed)


def execute(ctx: RequestContext, deps: PipelineDeps, prep: Prepared) -> Completed | None:
    """Run the model and write the answer, start to finish; never raises."""
    steps = execute_steps(ctx, deps, prep)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def execute_steps(ctx: RequestContext, deps: PipelineDeps, prep: Prepared) -> Generator[None, None, Completed | None]:
    """Run the model and write the answer, yielding after every generated token so one
    model thread can interleave many requests. Never raises; returns None unless the
    answer is complete and successful."""
    api, req, input_ids, writer = prep.api, prep.req, prep.input_ids, ctx.writer
    encoder = None
    deltas: list[int] = []
    try:
        rid, created = api.new_response_id(), int(time.time())
        events = generate_text(deps.backend, input_ids, req.sampling, ctx.cancelled)
        result: GenerationResult | None = None
        if req.stream:
            encoder = api.StreamEncoder(req, rid, created, int(input_ids.numel()))
            writer.begin(200, sse=True)
            writer.write(encoder.start())
            for ev in events:
                if isinstance(ev, TextDelta):
                    if ev.text:
                        deltas.append(len(ev.text))
                        writer.write(encoder.delta(ev))
                    yield
                else:
                    result = ev
            if result is None:
                raise SlotAbandoned("generation stopped without a result")
            writer.write(encoder.finish(result))
        else:
            for ev in events:
                if isinstance(ev, GenerationResult):
                    result = ev
                else:
                    yield
            if result is None:
                raise SlotAbandoned("generation stopped without a result")
            writer.begin(200, sse=False)
            writer.write(api.render_response(req, result, rid, created))
            deltas = [len(result.text)] if result.text else []
        ctx.view.meta.completion_len = result.output_tokens
        writer.finish()
        _log_done(ctx, deps, api, 200, prep.started, result)
        return Completed(result, tuple(deltas))
    except SlotAbandoned as exc:
        _abandoned(ctx, deps, exc)
    except Exception:
        log.exception("request failed", extra={"context_id": ctx.context_id})
        _fail(ctx, deps, api, encoder)
    return None


def replay(ctx: RequestContext, deps: PipelineDeps, prep: Prepared, answer: CachedAnswer) -> None:
    """Answer from the cache: the same bytes a fresh answer would have, minus the model.

    A stream is replayed as the same event sequence, with the deltas cut where they
    were first streamed, and written with one write() so that it never floods the
    doorbell with notices (this runs on the event loop)."""
    api, req, writer = prep.api, prep.req, ctx.writer
    try:
        result = answer.result(int(prep.input_ids.numel()))
        rid, created = api.new_response_id(), int(time.time())
        if req.stream:
            enc = api.StreamEncoder(req, rid, created, result.input_tokens)
            parts, pos = [enc.start()], 0
            for n in answer.deltas:
                parts.append(enc.delta(TextDelta(answer.text[pos : pos + n])))
                pos += n
            parts.append(enc.finish(result))
            writer.begin(200, sse=True)
            writer.write(b"".join(parts))
        else:
            writer.begin(200, sse=False)
            writer.write(api.render_response(req, result, rid, created))
        ctx.view.meta.completion_len = result.output_tokens
        writer.finish()
        _log_done(ctx, deps, api, 200, prep.started, result)
    except SlotAbandoned as exc:
        _abandoned(ctx, deps, exc)
    except Exception:
        log.exception("cache replay failed", extra={"context_id": ctx.context_id})
        _fail(ctx, deps, api, None)


def _abandoned(ctx: RequestContext, deps: PipelineDeps, exc: SlotAbandoned) -> None:
    deps.metrics.abandoned.inc()
    log.info("request abandoned: %s", exc, extra={"context_id": ctx.context_id})


def _fail(ctx: RequestContext, deps: PipelineDeps, api: ModuleType, encoder: object | None) -> None:
    deps.metrics.requests.inc(api=_api_name(api), status="500")
    err = ApiError(500, "api_error", "the engine failed while serving this request")
    writer = ctx.writer
    try:
        if not writer.started:
            writer.begin(500, sse=False)
            writer.write(api.render_error(err))
        elif encoder is not None:
            writer.write(encoder.error(err))
        writer.finish(failed=True)
    except SlotAbandoned:
        pass


def _api_name(api: ModuleType) -> str:
    return "openai" if api is openai_api else "anthropic"


def _log_done(ctx: RequestContext, deps: PipelineDeps, api: ModuleType, status: int, started: float,
              result: GenerationResult | None = None) -> None:
    elapsed = time.perf_counter() - started
    m = deps.metrics
    m.requests.inc(api=_api_name(api), status=str(status))
    m.seconds.inc(elapsed)
    if result is not None:
        m.tokens_in.inc(result.input_tokens)
        m.tokens_out.inc(result.output_tokens)
    if not log.isEnabledFor(logging.DEBUG):
        return  # nginx's access log has a line per request; this one costs ~20% of a null request
    log.debug(
        "request done",
        extra={
            "context_id": ctx.context_id,
            "slot": ctx.view.index,
            "generation": ctx.generation,
            "status": status,
            "api": _api_name(api),
            "duration_ms": round(elapsed * 1000, 3),
            "tokens_in": result.input_tokens if result else None,
            "tokens_out": result.output_tokens if result else None,
        },
    )
