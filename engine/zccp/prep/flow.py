"""One request's life, owned by one object: from the slot's payload to the slot's
response region and the cache.

prepare (zccp.prep.prepare: parse once with orjson, tokenize into the slot's token
array) -> the cache decision (lookup) -> replay a cached answer, or run the model on a
zero-copy view of the token array -> each API's bytes written to the response ring ->
store a complete answer. Client errors come back through the same slot as API-shaped JSON.

Threads: start() and everything up to the model run on the engine's event loop;
the model runs on the model thread (zccp.serving.scheduler, which batches every running
request into one forward per token), writing through this request's zccp.serving.token_sink.Reply,
and hands the finished answer back to the loop for the store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from zccp.transport.abi import CacheReason, CacheStatus, Flag, ffi
from zccp.api import api_for, codec_for
from zccp.api.common import ParseLimits
from zccp.cache.answer import CachedAnswer, literals_in
from zccp.cache.inflight import InFlight
from zccp.cache.keys import CacheKeys, keys_for, slot_masks
from zccp.cache.mask_store import MaskSource
from zccp.cache.sampled import UNSAMPLED, SampledUse, sampled_use
from zccp.cache.scope import tenant_digest
from zccp.cache.store import Lookup, ResponseCache
from zccp.observe.logs import RequestLog
from zccp.observe.metrics import EngineMetrics
from zccp.model.base import ModelBackend
from zccp.model.grammar_cache import GrammarCompiler
from zccp.prep.outcome import Outcome, RequestContext
from zccp.process.handoff import Ended, Handoff, OnEnded, Verdict
from zccp.transport.ring_writer import SlotAbandoned
from zccp.serving.fair_queue import Admission, refusal
from zccp.serving.scheduler import BatchScheduler, Sequence
from zccp.prep.prepare import Prepared, prepare
from zccp.shared_types import Completed, GenerationRequest, GenerationResult, TextDelta
from zccp.serving.choices import ChoiceSink, Choices, all_done, choice_params
from zccp.serving.text_assembly import fixed_result, generate_text
from zccp.serving.token_sink import Reply
from zccp.upstream.client import UpstreamClient
from zccp.upstream.reply import UpstreamReply

log = logging.getLogger("zccp.flow")

_ANTHROPIC = codec_for("anthropic")      # the slot's API when ZCCP_FLAG_API_OPENAI is not set


@dataclass(frozen=True)
class FlowDeps:
    """What every request's flow shares: made once by the engine."""

    backend: ModelBackend
    limits: ParseLimits
    input_view: Callable[[np.ndarray], Any]   # host ids -> the model's view (zccp.transport.device.input_view)
    device_id: int
    metrics: EngineMetrics
    model: BatchScheduler | None                         # the model thread (None: a prep process of a model backend)
    cache: ResponseCache | None                          # None: cache disabled
    masks: MaskSource | None
    inline: bool                                         # the instant null backend: no thread hop
    spawn: Callable[[Awaitable[None]], None]             # run a coroutine on the loop
    call_soon: Callable[..., None]                       # run a callback on the loop, from any thread
    request_log: RequestLog                              # the line per answered request
    tool_parser: str = "none"                            # model.tool_parser: "hermes" | "none"
    inflight: InFlight | None = None                     # identical misses wait for the first (None: off)
    coalesce_wait_s: float = 0.0                         # cache.coalesce_wait_ms: how long they wait
    upstream: UpstreamClient | None = None               # model.backend: upstream: misses go there
    grammars: GrammarCompiler | None = None              # output schemas compiled off the loop (cached)
    # a prep process of a model backend: its misses go to rank 0 (zccp.process.handoff), ended(completed, literals)
    hand: Callable[[Handoff, OnEnded], None] | None = None
    prefix_pins: bool = False                            # the model keeps a prefix cache: breakpoints pin


class RequestFlow:
    def __init__(self, ctx: RequestContext, deps: FlowDeps, on_done: Callable[[], None]) -> None:
        self.ctx = ctx
        self.deps = deps
        openai = ctx.view.header.flags & Flag.API_OPENAI
        self.codec = _ANTHROPIC if not openai else codec_for(api_for(True, ctx.view.request.openai_api))
        self.outcome = Outcome(ctx, self.codec, deps.metrics, deps.request_log, on_done)
        self._store_keys: CacheKeys | None = None    # set when the answer will be stored
        self._literals: tuple[str, ...] = ()         # the request's masked values the answer carries
        self._owned: bytes | None = None             # the in-flight key this request owns (coalescing)
        self._use: SampledUse = UNSAMPLED            # what the cache may do with it (cache.sampled)
        self._handed: Handoff | None = None          # rank 0: the prep process's miss this flow runs
        self._keep: Callable[[Completed | None, tuple[str, ...]], None] | None = None

    def resume(self, h: Handoff, keep: Callable[[Completed | None, tuple[str, ...]], None]) -> None:
        """Rank 0: run a prep process's prepared miss (zccp.process.handoff): its prompt is the
        slot's first prompt_len tokens; keep(completed, literals) gets the answer to store."""
        assert h.req is not None
        self._handed, self._keep = h, keep
        self.outcome.started = h.started or self.outcome.started
        self._run_model(Prepared(self.codec, h.req, self.deps.input_view, {}, self.ctx.host_tokens[:h.prompt_len],
                                 h.pins), None)

    # -- the sequence ----------------------------------------------------------------------

    def start(self) -> None:
        """Parse and tokenize, then answer from the cache or the model (on the loop)."""
        prep = self._prepare()
        if prep is None:
            return self.outcome.done()
        if self.deps.hand is not None and (prep.choices > 1 or prep.req.sampling.constraint is not None):
            return self._hand_off(prep, None, whole=True)    # rank 0 serves it from the payload
        if prep.req.sampling.constraint is not None and self.deps.grammars is not None:
            return self.deps.spawn(self._compile_then_serve(prep, self.deps.grammars))
        self._serve(prep)

    async def _compile_then_serve(self, prep: Prepared, grammars: GrammarCompiler) -> None:
        """The output schema compiled in a worker thread (seconds for a large one), while the
        loop serves everyone else; a schema refused or over its time budget is a 400."""
        assert prep.req.sampling.constraint is not None
        compiled: Prepared | None = None
        with self.outcome.guard():
            compiled = replace(prep, grammar=await grammars.compile(prep.req.sampling.constraint, self._salt(prep)))
        if compiled is None:
            return self.outcome.done()
        self._serve(compiled)

    def _serve(self, prep: Prepared) -> None:
        """Answer a prepared request from the cache or the model."""
        deps, ctx = self.deps, self.ctx
        if deps.cache is None or deps.masks is None:
            return self._run_model(prep, None)
        flags = ctx.view.header.flags
        self._use = use = sampled_use(prep.req.sampling, deps.cache.cfg.sampled, flags)
        # an entry holds one choice (one prompt, n = 1) and no logprobs to replay
        uncacheable = prep.req.sampling.logprobs is not None or prep.choices > 1
        if flags & Flag.NO_CACHE and flags & Flag.NO_STORE or uncacheable or not (use.lookup or use.store):
            # Neither lookup nor store: no keys to compute, no Redis round trip.
            sampled = not (use.lookup or use.store)
            reason = "uncacheable" if uncacheable else "sampled" if sampled else "no_cache"
            deps.metrics.cache.inc(result="BYPASS", reason=reason)
            ctx.writer.set_meta(cache_status=CacheStatus.BYPASS,
                                cache_reason=CacheReason.SAMPLED if sampled else CacheReason.NONE)
            return self._run_model(prep, None)
        try:
            keys = keys_for(ctx.view, ctx.payload, prep.req, deps.masks, deps.cache.cfg, prep.doc)
        except Exception:
            log.exception("cache keys failed; serving uncached", extra=ctx.ids())
            keys = None
        deps.spawn(self._serve_cached(prep, keys))

    async def _serve_cached(self, prep: Prepared, keys: CacheKeys | None) -> None:
        deps, ctx, flags = self.deps, self.ctx, self.ctx.view.header.flags
        assert deps.cache is not None
        for waited in (False, True):
            released = deps.inflight.releases if deps.inflight is not None else 0
            if keys is None or flags & Flag.NO_CACHE:
                lookup = Lookup("BYPASS", "unfingerprintable" if keys is None else "no_cache")
            elif not self._use.lookup:
                lookup = Lookup("BYPASS", "sampled")       # stored, not served (cache.sampled: store)
            else:
                lookup = await deps.cache.lookup(keys, lambda: self._masked_values(prep, keys))
            deps.metrics.cache.inc(result=lookup.status, reason=lookup.reason)
            if ctx.view.header.generation != ctx.generation or ctx.cancelled():
                deps.metrics.abandoned.inc()
                self._release_owned()
                return self.outcome.done()   # nginx gave up while Redis (or the first request) answered
            if lookup.answer is not None or waited or not await self._wait_for_twin(keys, lookup, released):
                break
        meta = {"cache_status": getattr(CacheStatus, lookup.status)}
        if lookup.reason == "masked_literal":
            meta["cache_reason"] = CacheReason.MASKED_LITERAL
        elif lookup.reason == "sampled":
            meta["cache_reason"] = CacheReason.SAMPLED
        if lookup.answer is not None:
            meta.update(similarity_ppm=int(lookup.similarity * 1_000_000), age_s=lookup.age_s)
            # what nginx may keep (its L1, by exact key): not a sampled answer that only the
            # requests asking for it may be served (cache.sampled)
            if lookup.status == "HIT" and not flags & Flag.NO_STORE and self._use.l1:
                meta.update(cache_ttl_s=deps.cache.l1_ttl(lookup.answer, lookup.age_s),
                            cache_scope=0 if lookup.shared else 1)
        ctx.writer.set_meta(**meta)   # only while the slot is this request's (issue 20)
        if lookup.answer is not None:
            # an exact HIT of an unmasked request is the stored request: its usage, as nginx's
            # L1 replays it (docs/cache.md); a masked HIT and a NEAR count their own prompt
            own = lookup.status == "HIT" and keys is not None and not keys.masked
            self._release_owned()            # claimed, then found on the second look
            self._replay(prep, lookup.answer, lookup.answer.input_tokens if own else 0)
            return self.outcome.done()
        storable = keys is not None and not flags & Flag.NO_STORE and lookup.status != "ERROR" and self._use.store
        self._run_model(prep, keys if storable else None)

    def _masked_values(self, prep: Prepared, keys: CacheKeys) -> tuple[bytes, ...]:
        """The values the masks replaced in this request (the masked-literal guard's side)."""
        assert self.deps.masks is not None
        masks = slot_masks(self.ctx.view, self.deps.masks) or self.deps.masks.get()
        return keys.request_literals(prep.doc, masks) if masks is not None else ()

    async def _wait_for_twin(self, keys: CacheKeys | None, lookup: Lookup, released: int) -> bool:
        """After a MISS: wait for an identical request being generated (bounded; True: look again),
        or own the key, looking again if an owner released since the lookup began (zccp.cache.inflight)."""
        deps, flags = self.deps, self.ctx.view.header.flags
        if (deps.inflight is None or keys is None or lookup.status != "MISS"
                or flags & (Flag.NO_STORE | Flag.NO_CACHE)):
            return False
        key = keys.exact + keys.placement.store_owner.encode()
        fut = deps.inflight.claim(key)
        if fut is None:
            self._owned = key        # released by _store, once the answer is stored or lost
            return deps.inflight.releases != released
        left = self.ctx.view.header.deadline_ns / 1e9 - time.time()
        done = await InFlight.wait(fut, min(deps.coalesce_wait_s, left - 0.05))
        deps.metrics.coalesced.inc(outcome="answered" if done else "timed_out")
        return done

    def _release_owned(self) -> None:
        """Waiters for this request's key look the cache up again (on the loop)."""
        if self._owned is not None and self.deps.inflight is not None:
            self.deps.inflight.release(self._owned)
            self._owned = None

    def _hand_off(self, prep: Prepared, store: CacheKeys | None, whole: bool = False) -> None:
        """A prep process's miss to rank 0, which owns the model; the answer, once complete,
        is stored here (zccp.process.handoff)."""
        deps, ctx = self.deps, self.ctx
        assert deps.hand is not None
        verdict = None
        if store is not None and deps.cache is not None and deps.masks is not None:
            verdict = Verdict(self._masked_values(prep, store), deps.cache.cfg.ttl_s if self._use.l1 else 0,
                              0 if store.placement.shared else 1)
        req = None if whole else replace(prep.req, messages=(), system="")

        def ended(how: Ended) -> None:
            if how.failed:              # rank 0 answered nothing (it failed on it, or never got it): the 500 here
                with self.outcome.guard():
                    self.outcome.failed(None)
            self._literals = how.literals
            self._store(store, how.completed)
            self.outcome.done()

        deps.metrics.handoffs.inc(kind="whole" if whole else "miss")
        deps.hand(Handoff(ctx.view.index, ctx.generation, req, prep.prompt_len, self._salt(prep), prep.pins, verdict,
                          self.outcome.started, whole), ended)

    def _run_model(self, prep: Prepared, store: CacheKeys | None) -> None:
        self._store_keys = store
        if self.deps.hand is not None:
            return self._hand_off(prep, store)
        if self.deps.upstream is not None:
            return self.deps.spawn(self._run_upstream(prep, store, self.deps.upstream))
        # Streams always leave the loop: a full response ring makes the writer wait for
        # nginx's ack, and the loop must stay free to deliver the notices nginx waits for.
        if self.deps.inline and not prep.req.stream and prep.choices == 1:
            completed = self._execute(prep, store is not None)
            if store is not None or self._owned is not None:
                self._store(store, completed)
            return self.outcome.done()

        def finished(completed: Completed | None) -> None:   # on the model thread
            if store is not None:
                self.deps.call_soon(self._store, store, completed)
            elif self._keep is not None and self._handed is not None and self._handed.verdict is not None:
                self._keep(completed, self._literals)    # for the prep process to store
            self.outcome.done()

        if prep.choices > 1:
            return self._run_choices(prep)
        ctx, n = self.ctx, prep.prompt_len
        reply = Reply(prep.codec, prep.req, ctx.view, ctx.writer, n,
                      self.deps.backend.prompt.detokenizer(prep.host_ids[-8:].tolist()),
                      self._tool_calls(prep.req), self.outcome, lambda result: self._verdict(prep, result),
                      self.deps.backend.prompt.token_bytes)
        seq = Sequence(prep.input_ids, prep.host_ids, prep.req.sampling, reply, ctx.cancelled, finished,
                       salt=self._salt(prep), pins=prep.pins, grammar=prep.grammar)
        model = self.deps.model
        assert model is not None
        if (got := model.submit_all([seq])) is not Admission.OK:
            self.deps.metrics.queue_full.inc()
            with self.outcome.guard():
                self.outcome.client_error(refusal(got, 1, model.limits.max_queue))
            self._release_owned()
            self.outcome.done()

    async def _run_upstream(self, prep: Prepared, store: CacheKeys | None, client: UpstreamClient) -> None:
        """A miss answered by the upstream server (on the loop): the same cache verdict,
        store and ending as a model's answer (zccp.upstream.reply)."""
        completed: Completed | None = None
        try:
            reply = UpstreamReply(prep.codec, prep.req, self.ctx.writer, self.outcome, prep.prompt_len,
                                  self.ctx.cancelled, lambda result: self._verdict(prep, result))
            completed = await reply.run(client, prep.codec.chat_input(prep.doc))
        finally:
            self._store(store, completed)
            self.outcome.done()

    def _run_choices(self, prep: Prepared) -> None:
        """Several choices (n > 1, several prompts): a sequence each, one answer (zccp.serving.choices);
        not cached."""
        ctx, req, fmt = self.ctx, prep.req, self.deps.backend.prompt
        prompts = prep.prompts or ((prep.input_ids, prep.host_ids),)
        lengths = [len(ids) for ids, _ in prompts]
        choices = Choices(prep.codec, req, lengths, ctx.writer, self.outcome)
        total = len(lengths) * req.n
        on_done = all_done(total, self.outcome.done)
        cancelled = lambda: ctx.cancelled() or choices.over   # noqa: E731
        salt = self._salt(prep)                 # the tenant's prefix blocks only
        seqs: list[Sequence] = []
        for i in range(total):
            ids, host = prompts[i // req.n]
            sink = ChoiceSink(choices, i, req, lengths[i // req.n], fmt.detokenizer(host[-8:].tolist()),
                              self._tool_calls(req), fmt.token_bytes)
            seqs.append(Sequence(ids, host, choice_params(req.sampling, i % req.n), sink, cancelled, on_done,
                                 salt=salt, grammar=prep.grammar))
        # all the choices queue, or none: n counts as n in the queue (zccp.serving.fair_queue)
        model = self.deps.model
        assert model is not None
        if (got := model.submit_all(seqs)) is not Admission.OK:
            self.deps.metrics.queue_full.inc()
            with self.outcome.guard():
                self.outcome.client_error(refusal(got, total, model.limits.max_queue))
            self.outcome.done()

    def _salt(self, prep: Prepared) -> bytes:
        """The prefix KV cache's salt: the request's tenant (zccp.serving.prefix_cache), b"" for the
        anonymous one."""
        if self._handed is not None:
            return self._handed.salt
        if (keys := self._store_keys) is not None:
            return keys.tenant or b""
        view = self.ctx.view
        if view.header.flags & Flag.TENANT:
            return bytes(ffi.buffer(view.request.tenant, 32))
        return tenant_digest(prep.req.user) if prep.req.user else b""

    def _tool_calls(self, req: GenerationRequest) -> bool:
        """Parse tool calls out of this answer: tools were offered, and the parser is on."""
        return req.tool_use and self.deps.tool_parser == "hermes"

    def _store(self, keys: CacheKeys | None, completed: Completed | None) -> None:
        """Only complete, successful answers are stored (on the loop); then the requests
        waiting for this one look again."""
        cache = self.deps.cache
        if keys is None or completed is None or cache is None or completed.result.tool_calls:
            self._release_owned()   # an entry keeps text only (CachedAnswer): a tool-call turn is not stored
            return
        entry = CachedAnswer.of(completed, time.time(), self._literals, unmasked=not keys.masked)

        async def store_then_release() -> None:
            try:
                await cache.store(keys, entry)
            finally:
                self._release_owned()

        self.deps.spawn(store_then_release())

    def _verdict(self, prep: Prepared, result: GenerationResult) -> None:
        """_cache_verdict for a model answer; one with tool calls is never cached (nor kept by nginx)."""
        if not result.tool_calls:
            self._cache_verdict(prep, result.text)

    def _cache_verdict(self, prep: Prepared, text: str) -> None:
        """Before the final notice: the masked values the answer carries (kept with the entry
        for the guard) and what nginx may keep of it (meta.cache_ttl_s / cache_scope)."""
        keys, deps = self._store_keys, self.deps
        if self._handed is not None and (v := self._handed.verdict) is not None:   # rank 0, for a prep process
            self._literals = literals_in(text, v.request_literals)
            self.ctx.writer.set_meta(cache_ttl_s=0 if self._literals else v.ttl_s, cache_scope=v.scope)
            return
        if keys is None or deps.cache is None or deps.masks is None:
            return
        # The set nginx applied (keys_for resolved it); the latest should it have gone meanwhile.
        masks = slot_masks(self.ctx.view, deps.masks)
        if masks is None:
            masks = deps.masks.get()
        assert masks is not None
        self._literals = literals_in(text, keys.request_literals(prep.doc, masks))
        self.ctx.writer.set_meta(cache_ttl_s=0 if self._literals or not self._use.l1 else deps.cache.cfg.ttl_s,
                                 cache_scope=0 if keys.placement.shared else 1)

    # -- the steps -------------------------------------------------------------------------

    def _prepare(self) -> Prepared | None:
        """Parse and tokenize (zccp.prep.prepare). Client errors are answered here, through the slot: None."""
        prep: Prepared | None = None
        with self.outcome.guard():
            prep = prepare(self.ctx, self.deps, self.codec)
        return prep

    def _execute(self, prep: Prepared, keep: bool = True) -> Completed | None:
        """The inline path (the instant null backend, not streamed, on the loop): run the
        model and write the answer, start to finish; never raises; None unless the answer
        is complete and successful (and keep: to be stored; else always None)."""
        ctx, codec, req, writer = self.ctx, prep.codec, prep.req, self.ctx.writer
        completed: Completed | None = None
        with self.outcome.guard():
            tools = self._tool_calls(req)
            # the fixed reply whole (no generator, no events), else the token loop
            result = None if ctx.cancelled() else fixed_result(self.deps.backend, prep.prompt_len,
                                                               req.sampling, tools)
            if result is None:
                for ev in generate_text(self.deps.backend, prep.input_ids, req.sampling, ctx.cancelled, tools):
                    if isinstance(ev, GenerationResult):
                        result = ev
            if result is None:
                raise SlotAbandoned("generation stopped without a result")
            ctx.writer.set_meta(completion_len=result.output_tokens)
            if self._store_keys is not None:
                self._verdict(prep, result)
            writer.answer(200, False, codec.render(req, result, codec.new_response_id(), int(time.time())))
            self.outcome.answered(200, result)
            if keep:
                completed = Completed(result, (len(result.text),) if result.text else ())
        return completed

    def _replay(self, prep: Prepared, answer: CachedAnswer, input_tokens: int = 0) -> None:
        """Answer from the cache: the same bytes a fresh answer would have, minus the model.

        A stream is replayed as the same event sequence, with the deltas cut where they
        were first streamed, and written with one write() so that it never floods the
        doorbell with notices (this runs on the event loop). input_tokens: the usage's prompt
        tokens (0: this request's own)."""
        codec, req, writer = prep.codec, prep.req, self.ctx.writer
        with self.outcome.guard("cache replay failed"):
            result = answer.result(input_tokens or prep.prompt_len)
            rid, created = codec.new_response_id(), int(time.time())
            if req.stream:
                enc = codec.stream(req, rid, created, result.input_tokens)
                parts, pos = [enc.start()], 0
                for n in answer.deltas:
                    parts.append(enc.delta(TextDelta(answer.text[pos : pos + n])))
                    pos += n
                parts.append(enc.finish(result))
                data, sse = b"".join(parts), True
            else:
                data, sse = codec.render(req, result, rid, created), False
            self.ctx.writer.set_meta(completion_len=result.output_tokens)
            writer.answer(200, sse, data)
            self.outcome.answered(200, result)
