"""The slot requests that are not a generation (request.kind, set by nginx per location):

  COUNT_TOKENS  POST /v1/messages/count_tokens: {"input_tokens": n}, exact: the
                served model's own prompt format (chat template, tools included)
                counts what a generation with the same input would prefill.
  MODELS        GET /v1/models (the payload is empty) or GET /v1/models/{id} (the
                payload is the id): the API flag nginx set picks OpenAI's or
                Anthropic's shape.
  WARMUP        POST /v1/zccp/warmup (nginx lets only loopback and unix-socket
                clients through): a Messages body (max_tokens optional, messages may
                be empty) whose prompt, without the generation prompt, is prefilled
                and kept in the prefix cache, so later requests that start the same
                way prefill only the rest.
  PURGE         POST /v1/zccp/purge (nginx: loopback clients only): a purge request
                (zccp.cache.purge) in, {"purged": n, ...} out; on the event loop,
                since Redis answers asynchronously.

Each ends through its zccp.prep.outcome.Outcome (errors through the slot, the log line,
the request metric), as a generation does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import orjson

from zccp.transport.abi import Flag, Kind
from zccp.api import anthropic, codec_for
from zccp.api.codec import ModelInfo
from zccp.cache.purge import parse_purge, purge
from zccp.prep.flow import FlowDeps
from zccp.model.prompt import Prompt
from zccp.model.tokenizer import PromptTooLong
from zccp.prep.outcome import Outcome, RequestContext
from zccp.transport.ring_writer import SlotAbandoned
from zccp.serving.scheduler import Sequence
from zccp.shared_types import ApiError, ApiKind, GenerationRequest, SamplingParams
from zccp.serving.token_sink import WarmupReply

if TYPE_CHECKING:
    from zccp.cache.redis_target import RedisClient

log = logging.getLogger("zccp.endpoints")

_NO_SAMPLING = SamplingParams(max_tokens=0, temperature=0.0)


class EndpointFlow:
    def __init__(self, ctx: RequestContext, deps: FlowDeps, on_done: Callable[[], None], kind: int,
                 models: list[ModelInfo], redis: RedisClient | None,
                 on_epoch: Callable[[int], None] | None = None) -> None:
        self.ctx = ctx
        self.deps = deps
        self.kind = kind
        self.models = models
        self._redis = redis            # PURGE: None when the cache is disabled
        self._on_epoch = on_epoch      # PURGE: the new purge epoch into this engine's control page
        # A purge always answers in Anthropic's error shape (nginx sets no API flag for it).
        api: ApiKind = "openai" if ctx.view.header.flags & Flag.API_OPENAI and kind != Kind.PURGE else "anthropic"
        self.codec = codec_for(api)
        self.outcome = Outcome(ctx, self.codec, deps.metrics, deps.request_log, on_done)

    def start(self) -> None:
        if self.kind == Kind.PURGE:
            return self.deps.spawn(self._purge())
        with self.outcome.guard():
            if self.kind == Kind.MODELS:
                self._answer(self._models())
            elif self.kind == Kind.COUNT_TOKENS:
                self._answer(anthropic.render_count(self.deps.backend.prompt.count(self._prompt(
                    anthropic.parse_count_tokens))))
            elif self.kind == Kind.WARMUP:
                self._warmup()
                return                                   # answered from the model thread
            else:
                raise ApiError(400, "invalid_request_error", f"request kind {self.kind} is not served here")
        self.outcome.done()

    def _answer(self, body: bytes) -> None:
        w = self.ctx.writer
        w.begin(200, sse=False)
        w.write(body)
        w.finish()
        self.outcome.answered(200)

    def _models(self) -> bytes:
        wanted = bytes(self.ctx.payload).decode("utf-8", "replace")
        if not wanted:
            return self.codec.render_models(self.models)
        for m in self.models:
            if m.name == wanted:
                return self.codec.render_model(m)
        raise ApiError(404, "not_found_error", f"model: {wanted}", "model")

    def _prompt(self, parse: Callable[..., GenerationRequest]) -> Prompt:
        doc = anthropic.decode_body(self.ctx.payload)
        return Prompt(parse(doc, self.deps.limits), lambda: anthropic.chat_input(doc))

    def _warmup(self) -> None:
        """Submit the prefix to the model (it answers, and ends the request); an ApiError
        when it cannot."""
        ctx, deps = self.ctx, self.deps
        prompt = self._prompt(anthropic.parse_warmup)
        try:
            n = deps.backend.prompt.encode_into(prompt, ctx.tokens, generation_prompt=False)
        except PromptTooLong as exc:
            raise ApiError(413, "request_too_large",
                           f"prompt is {exc.needed} tokens; a slot holds at most {exc.capacity}") from None
        if n == 0 or n > deps.backend.max_context:
            raise ApiError(400, "invalid_request_error",
                           f"the prefix is {n} tokens; it must be 1 to {deps.backend.max_context}", "messages")
        if not ctx.writer.set_meta(prompt_len=n):
            raise SlotAbandoned(f"slot {ctx.view.index}: claimed again while the warm-up was prepared")
        ctx.view.header.tokens_len = n
        sink = WarmupReply(prompt.req.model, ctx.view, ctx.writer, n, self.outcome)
        seq = Sequence(deps.input_view(ctx.host_tokens[:n]), ctx.host_tokens[:n], _NO_SAMPLING, sink,
                       ctx.cancelled, lambda _: self.outcome.done(), prefill_only=True)
        assert deps.model is not None           # a prep process hands warm-ups to rank 0 whole
        if not deps.model.submit(seq):
            deps.metrics.queue_full.inc()
            raise ApiError(429, "rate_limit_error", "the model's queue is full; retry shortly")

    async def _purge(self) -> None:
        """POST /v1/zccp/purge: the JSON body in, {"purged": n, ...} out (on the loop)."""
        try:
            with self.outcome.guard():
                if self._redis is None:
                    raise ApiError(409, "invalid_request_error", "the cache is disabled (cache.enabled: false)")
                try:
                    req = parse_purge(orjson.loads(bytes(self.ctx.payload)))
                except orjson.JSONDecodeError as exc:
                    raise ApiError(400, "invalid_request_error", f"body: not valid JSON: {exc}") from None
                except ValueError as exc:
                    raise ApiError(400, "invalid_request_error", str(exc)) from None
                try:
                    n = await purge(self._redis, req, self._on_epoch)
                except Exception as exc:   # redis down, a timeout: say so, nothing else breaks
                    log.warning("purge failed: %s", exc, extra=self.ctx.ids())
                    raise ApiError(503, "api_error", f"purge failed: {exc}") from None
                log.info("cache purged: %s, %d keys", req.describe(), n, extra=self.ctx.ids())
                self._answer(orjson.dumps({"purged": n, **req.describe()}))
        finally:
            self.outcome.done()
