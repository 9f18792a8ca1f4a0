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

Each reuses RequestFlow's endings (errors through the slot, logs, metrics).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from zccp.abi import Kind
from zccp.api import anthropic
from zccp.api.codec import ModelInfo
from zccp.flow import FlowDeps, RequestContext, RequestFlow
from zccp.model.prompt import Prompt
from zccp.model.tokenizer import PromptTooLong
from zccp.token_sink import Endings, WarmupReply
from zccp.shared_types import ApiError, GenerationRequest, SamplingParams
from zccp.ring_writer import SlotAbandoned
from zccp.scheduler import Sequence

log = logging.getLogger("zccp.endpoints")

_NO_SAMPLING = SamplingParams(max_tokens=0, temperature=0.0)


class EndpointFlow(RequestFlow):
    def __init__(self, ctx: RequestContext, deps: FlowDeps, on_done: Callable[[], None], kind: int,
                 models: list[ModelInfo]) -> None:
        super().__init__(ctx, deps, on_done)
        self.kind = kind
        self.models = models

    def start(self) -> None:
        started = time.perf_counter()
        try:
            try:
                if self.kind == Kind.MODELS:
                    self._answer(self._models(), started)
                elif self.kind == Kind.COUNT_TOKENS:
                    self._answer(anthropic.render_count(self.deps.backend.prompt.count(self._prompt(
                        anthropic.parse_count_tokens))), started)
                elif self.kind == Kind.WARMUP:
                    if self._warmup(started):
                        return                                   # answered from the model thread
                else:
                    raise ApiError(400, "invalid_request_error", f"request kind {self.kind} is not served here")
            except ApiError as err:
                self._answer_error(err, started)
        except SlotAbandoned as exc:
            self._abandoned(exc)
        except Exception:
            log.exception("request failed", extra=self.ctx.ids())
            self._fail(None)
        self._done()

    def _answer(self, body: bytes, started: float) -> None:
        w = self.ctx.writer
        w.begin(200, sse=False)
        w.write(body)
        w.finish()
        self._log_done(200, started)

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

    def _warmup(self, started: float) -> bool:
        """Submit the prefix to the model; False when it was answered here (an error)."""
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
        ctx.view.header.tokens_len = n
        ctx.view.meta.prompt_len = n
        sink = WarmupReply(prompt.req.model, ctx.view, ctx.writer, n,
                           Endings(self._log_done, self._abandoned, self._fail, lambda result: None), started)
        seq = Sequence(deps.input_view(ctx.tokens[:n]), ctx.tokens[:n].numpy(), _NO_SAMPLING, sink,
                       ctx.cancelled, lambda _: self._done(), prefill_only=True)
        if not deps.model.submit(seq):
            deps.metrics.queue_full.inc()
            raise ApiError(429, "rate_limit_error", "the model's queue is full; retry shortly")
        return True
