"""One answer's output side, fed a token at a time by the batch scheduler.

Generated ids -> zccp.serving.text_assembly.TextAssembler (detokenizer, stop sequences, tool
calls) -> the API's stream encoder (SSE) or, at the end, its rendered JSON -> the
slot's response ring. Writes never wait: what the ring cannot take yet stays in the
writer (write_nowait) and `blocked` tells the scheduler to park this sequence until
flush() has written it. The request ends through its zccp.prep.outcome.Outcome: the log
line and metrics of a finished answer, an abandoned slot, a failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import orjson

from zccp.api.codec import ApiCodec, StreamEncoder
from zccp.transport.arena import SlotView
from zccp.serving.hermes_tools import Event, HermesParser, is_forced_call
from zccp.model.prompt import Detokenizer
from zccp.prep.outcome import Outcome
from zccp.transport.ring_writer import ResponseWriter, SlotAbandoned
from zccp.model.sampling_checks import Drawn
from zccp.shared_types import (
    NO_WRITE,
    ApiError,
    CacheWrite,
    Completed,
    GenerationRequest,
    GenerationResult,
    StopReason,
    TextDelta,
    TokenLogprob,
    ToolArgsDelta,
    ToolCall,
    ToolCallStart,
)
from zccp.serving.text_assembly import TextAssembler


class SlotOutput:
    """What every model answer does with its slot: write without waiting, finish once
    everything is written, and end through the request's Outcome. `verdict` is the
    cache's say on a finished answer, before the final notice."""

    def __init__(self, writer: ResponseWriter, outcome: Outcome,
                 verdict: Callable[[GenerationResult], None] | None = None) -> None:
        self._writer = writer
        self._outcome = outcome
        self._verdict = verdict
        self._result: GenerationResult | None = None      # set by end(): finish once flushed
        self._finished = False

    def kept(self, tokens: int) -> None:
        pass

    def flush(self) -> bool:
        if not self._writer.flush_pending():
            return False
        if self._result is not None and not self._finished:
            self._finished = True
            if self._verdict is not None:
                self._verdict(self._result)
            self._writer.finish()
            self._outcome.answered(200, self._result)
        return True

    @property
    def blocked(self) -> bool:
        return self._writer.pending > 0

    def fail(self, err: ApiError | None = None) -> None:
        self._outcome.failed(None, err)

    def abandoned(self, exc: SlotAbandoned) -> None:
        self._outcome.abandoned(exc)


class AnswerText:
    """One sequence's text: generated ids -> the TextAssembler's events (detokenizer, stop
    sequences, tool calls), each text delta carrying the logprobs of the tokens since the
    previous one when the request asks for logprobs (Reply's and each choice's)."""

    def __init__(self, req: GenerationRequest, detok: Detokenizer, tool_calls: bool,
                 token_bytes: Callable[[int], bytes] | None = None, stream_tools: bool = False) -> None:
        # a forced call (docs/tools.md): its arguments are the budget, stop sequences do not cut it
        forced = tool_calls and is_forced_call(req.sampling.constraint)
        self._asm = TextAssembler(detok, () if forced else req.sampling.stop,
                                  HermesParser(stream_tools) if tool_calls else None,
                                  req.sampling.max_tokens if forced else None, req.sampling.min_tokens)
        self._name = token_bytes or (lambda _: b"")
        self._logprobs: list[TokenLogprob] | None = [] if req.sampling.logprobs is not None else None
        self._unsent = 0                         # logprobs not sent yet (they go with the next delta)

    @property
    def stopped(self) -> bool:
        """A stop sequence ended the text (or a forced call's budget is spent)."""
        return self._asm.done

    def feed(self, token: int, drawn: Drawn | None) -> list[Event]:
        if self._logprobs is not None and drawn is not None:
            name = self._name
            self._logprobs.append(TokenLogprob(name(drawn[0]), drawn[1], tuple((name(i), lp) for i, lp in drawn[2])))
        return self._attach(self._asm.feed(token))

    def finish(self) -> list[Event]:
        """The held-back text; the last tokens' logprobs in a delta of their own when no text
        is left to carry them."""
        events = self._attach(self._asm.finish())
        if self._logprobs and self._unsent < len(self._logprobs):
            events.append(TextDelta("", tuple(self._logprobs[self._unsent:])))
            self._unsent = len(self._logprobs)
        return events

    def _attach(self, events: list[Event]) -> list[Event]:
        lps = self._logprobs
        if not lps or self._unsent == len(lps):
            return events
        for i, ev in enumerate(events):
            if isinstance(ev, TextDelta):
                events[i] = TextDelta(ev.text, tuple(lps[self._unsent:]))
                self._unsent = len(lps)
                break
        return events

    def result(self, reason: StopReason, input_tokens: int, output_tokens: int, cached_tokens: int = 0,
               cache_write: CacheWrite = NO_WRITE) -> GenerationResult:
        asm = self._asm
        if asm.budget is not None:
            output_tokens = asm.billed           # a forced call: the tokens of its arguments
        return GenerationResult(
            text=asm.text, stop_reason=asm.stop_reason(reason), stop_sequence=asm.stop_sequence,
            input_tokens=input_tokens, output_tokens=output_tokens, tool_calls=tuple(asm.tool_calls),
            cached_tokens=cached_tokens, cache_write=cache_write,
            logprobs=tuple(self._logprobs) if self._logprobs is not None else None)


class Reply(SlotOutput):
    """A generation's answer: tokens in, the API's bytes out."""

    def __init__(self, codec: ApiCodec, req: GenerationRequest, view: SlotView, writer: ResponseWriter,
                 prompt_tokens: int, detok: Detokenizer, tool_calls: bool, outcome: Outcome,
                 verdict: Callable[[GenerationResult], None],
                 token_bytes: Callable[[int], bytes] | None = None) -> None:
        super().__init__(writer, outcome, verdict)
        self._codec = codec
        self._req = req
        self._view = view
        self._prompt_tokens = prompt_tokens
        self._text = AnswerText(req, detok, tool_calls, token_bytes, stream_tools=req.stream)
        self._encoder: StreamEncoder | None = None
        self._cached = 0
        self._written = NO_WRITE
        self._deltas: list[int] = []            # text delta lengths as streamed (cache replay)
        self._fed = 0                           # output tokens so far (meta.committed_mark)
        outcome.submitted = time.perf_counter()

    def start(self, cached_tokens: int, plan_chunks: int, written: CacheWrite = NO_WRITE) -> None:
        self._outcome.admitted = time.perf_counter()
        self._cached = cached_tokens
        self._written = written
        self._writer.set_meta(plan_chunks=plan_chunks)     # X-ZCCP-Plan, sent with the first bytes
        if self._req.stream:
            # cache writes only to an encoder that reports them (Anthropic's; the others take 5 arguments)
            extra = (written,) if written.total else ()
            self._outcome.response_id = rid = self._codec.new_response_id()
            self._encoder = self._codec.stream(self._req, rid, int(time.time()),
                                               self._prompt_tokens, cached_tokens, *extra)
            self._writer.begin(200, sse=True)
            self._writer.write_nowait(self._encoder.start())

    def token(self, token: int, drawn: Drawn | None = None) -> bool:
        if not self._fed:
            self._outcome.first_token = time.perf_counter()
        self._fed += 1
        if self._encoder is None:
            # a whole answer sends nothing until its end: the count so far is what nginx
            # settles should its client leave (meta.completion_len, counted up)
            self._writer.count_tokens(self._fed)
        self._send(self._text.feed(token, drawn))
        return self._text.stopped

    def end(self, reason: StopReason, output_tokens: int) -> Completed:
        self._outcome.last_token = time.perf_counter()
        self._send(self._text.finish())
        result = self._text.result(reason, self._prompt_tokens, output_tokens, self._cached, self._written)
        if self._encoder is not None:
            self._writer.write_nowait(self._encoder.finish(result), output_tokens)
        else:
            self._writer.begin(200, sse=False)
            self._outcome.response_id = rid = self._codec.new_response_id()
            self._writer.write_nowait(self._codec.render(self._req, result, rid, int(time.time())), output_tokens)
            self._deltas = [len(result.text)] if result.text else []
        self._writer.set_meta(completion_len=result.output_tokens)
        self._result = result
        return Completed(result, tuple(self._deltas))

    def fail(self, err: ApiError | None = None) -> None:
        self._outcome.failed(self._encoder, err)

    def _send(self, events: list[Event]) -> None:
        enc = self._encoder
        if enc is None:
            return
        for ev in events:
            if isinstance(ev, TextDelta):          # the usual event first
                if ev.text or ev.logprobs:
                    if ev.text:
                        self._deltas.append(len(ev.text))
                    self._writer.write_nowait(enc.delta(ev), self._fed)
            elif isinstance(ev, ToolCall):
                self._writer.write_nowait(enc.tool_call(ev), self._fed)
            elif isinstance(ev, ToolCallStart):
                self._writer.write_nowait(enc.tool_start(ev), self._fed)
            elif isinstance(ev, ToolArgsDelta):
                self._writer.write_nowait(enc.tool_args(ev), self._fed)


class WarmupReply(SlotOutput):
    """POST /v1/zccp/warmup's answer: the prefix is prefilled and its blocks kept."""

    def __init__(self, model: str, view: SlotView, writer: ResponseWriter, prompt_tokens: int,
                 outcome: Outcome) -> None:
        super().__init__(writer, outcome)
        self._model = model
        self._view = view
        self._prompt_tokens = prompt_tokens
        self._reused = 0
        self._kept = 0

    def start(self, cached_tokens: int, plan_chunks: int, written: CacheWrite = NO_WRITE) -> None:
        self._reused = cached_tokens
        self._writer.set_meta(plan_chunks=plan_chunks)

    def kept(self, tokens: int) -> None:
        self._kept = tokens

    def token(self, token: int, drawn: Drawn | None = None) -> bool:
        raise AssertionError("a warm-up generates nothing")   # programmer error

    def end(self, reason: StopReason, output_tokens: int) -> dict[str, str | int]:
        body: dict[str, str | int] = {"type": "warmup", "model": self._model, "prompt_tokens": self._prompt_tokens,
                "reused_tokens": self._reused, "cached_tokens": self._kept}
        self._writer.begin(200, sse=False)
        self._writer.write_nowait(orjson.dumps(body))
        self._result = GenerationResult("", "end_turn", None, self._prompt_tokens, 0, cached_tokens=self._reused)
        return body
