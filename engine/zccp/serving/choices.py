"""Several choices in one answer: OpenAI's `n` > 1, and /v1/completions' several prompts
(each prompt n choices; choice i = prompt i // n, its (i % n)-th sample, as vLLM numbers them).

Each choice is its own sequence in the batch scheduler (its own sampler; a request seed
s gives a prompt's choice j the seed s + j, so the choices differ and each is reproducible).
Its ChoiceSink assembles its text (zccp.serving.token_sink.AnswerText: logprobs included). Not
streamed: when the last choice ends, the collector renders the one JSON answer (choices in
index order) through the codec's render_choices. Streamed (an API with stream_choice:
/v1/completions, /v1/chat/completions): each choice's chunks carry its index and go into the
ring as they come (its opening chunk when it starts, if the API has one), its finish chunk
when it ends, the usage chunk and [DONE] once, after the last; every write carries the
output tokens of all choices so far (the committed mark nginx settles a cut stream on).
Usage: each prompt once, every completion summed. The request ends through its Outcome, once; a failure
or an abandoned slot ends it at once and cancels the other choices.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from zccp.api.codec import ApiCodec, ChoiceStream
from zccp.model.prompt import Detokenizer
from zccp.model.sampling_checks import Drawn
from zccp.prep.outcome import Outcome
from zccp.transport.ring_writer import ResponseWriter, SlotAbandoned
from zccp.shared_types import (
    NO_WRITE,
    ApiError,
    CacheWrite,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    StopReason,
    ToolArgsDelta,
    ToolCall,
    ToolCallStart,
)
from zccp.serving.hermes_tools import Event
from zccp.serving.token_sink import AnswerText, SlotOutput


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    return params if params.seed is None else replace(params, seed=params.seed + index)


class Choices(SlotOutput):
    """The shared answer of every choice (the slot side: written once, ended once).
    prompt_tokens: each prompt's length, in prompt order (req.n choices each)."""

    def __init__(self, codec: ApiCodec, req: GenerationRequest, prompt_tokens: list[int], writer: ResponseWriter,
                 outcome: Outcome) -> None:
        super().__init__(writer, outcome)
        assert codec.render_choices is not None      # programmer error: the API has one choice only
        self._codec = codec
        self._req = req
        self._prompt_tokens = prompt_tokens
        self._results: list[GenerationResult | None] = [None] * (len(prompt_tokens) * req.n)
        self._cached = [0] * len(prompt_tokens)      # reused prompt tokens, per prompt
        self._created = int(time.time())
        self._encoders: list[ChoiceStream] = []
        if req.stream:
            assert codec.stream_choice is not None   # programmer error: the parser lets no such stream in
            rid = codec.new_response_id()
            self._encoders = [codec.stream_choice(req, rid, self._created, 0, 0, index=i)
                              for i in range(len(self._results))]
        self.over = False          # failed or abandoned: the other choices are cancelled
        self.fed = 0               # output tokens of every choice so far (the committed mark)

    def generated(self) -> None:
        """Every choice's tokens so far, in the slot's completion_len (a whole answer's only:
        a stream's are in its committed mark)."""
        self._writer.count_tokens(self.fed)

    def encoder(self, index: int) -> ChoiceStream | None:
        return self._encoders[index] if self._encoders else None

    def started(self, index: int, cached_tokens: int, plan_chunks: int = 0) -> None:
        p = index // self._req.n
        self._cached[p] = max(self._cached[p], cached_tokens)
        if plan_chunks and not self._writer.started:     # X-ZCCP-Plan: the choices share one prompt
            self._writer.set_meta(plan_chunks=plan_chunks)
        if self._encoders:
            if not self._writer.started:
                self._writer.begin(200, sse=True)
            if head := self._encoders[index].start():        # chat's role chunk; b"" for completions
                self._writer.write_nowait(head, self.fed)

    def send(self, enc: ChoiceStream, events: list[Event]) -> None:
        for ev in events:
            if isinstance(ev, ToolCallStart):
                out = enc.tool_start(ev)
            elif isinstance(ev, ToolArgsDelta):
                out = enc.tool_args(ev)
            else:
                out = enc.tool_call(ev) if isinstance(ev, ToolCall) else enc.delta(ev)
            if out:
                self._writer.write_nowait(out, self.fed)

    def ended(self, index: int, result: GenerationResult) -> None:
        if self.over:
            return
        self._results[index] = result
        if self._encoders:
            self._writer.write_nowait(self._encoders[index].finish_choice(result), self.fed)
        if any(r is None for r in self._results):
            return
        results = [r for r in self._results if r is not None]
        out = sum(r.output_tokens for r in results)
        total = replace(results[0], input_tokens=sum(self._prompt_tokens), output_tokens=out,
                        cached_tokens=sum(self._cached), logprobs=None)
        if self._encoders:
            self._writer.write_nowait(self._encoders[0].close(total), out)
        else:
            assert self._codec.render_choices is not None
            self._writer.begin(200, sse=False)
            self._writer.write_nowait(self._codec.render_choices(self._req, results, total, self._created), out)
        self._writer.set_meta(completion_len=out)   # only while the slot is this request's (issue 20)
        self._result = total

    def fail(self, err: ApiError | None = None) -> None:
        if not self.over:
            self.over = True
            self._outcome.failed(self._encoders[0] if self._encoders else None, err)

    def abandoned(self, exc: SlotAbandoned) -> None:
        if not self.over:
            self.over = True
            self._outcome.abandoned(exc)


class ChoiceSink:
    """One choice's sequence: its text assembled here, its part of the answer written by Choices."""

    def __init__(self, choices: Choices, index: int, req: GenerationRequest, prompt_tokens: int,
                 detok: Detokenizer, tool_calls: bool, token_bytes: Callable[[int], bytes] | None = None) -> None:
        self._choices = choices
        self._index = index
        self._prompt_tokens = prompt_tokens
        self._text = AnswerText(req, detok, tool_calls, token_bytes)
        self._enc = choices.encoder(index)

    def start(self, cached_tokens: int, plan_chunks: int, written: CacheWrite = NO_WRITE) -> None:
        self._choices.started(self._index, cached_tokens, plan_chunks)      # OpenAI's n: no breakpoints

    def kept(self, tokens: int) -> None:
        pass

    def token(self, token: int, drawn: Drawn | None = None) -> bool:
        self._choices.fed += 1
        events = self._text.feed(token, drawn)
        if self._enc is not None:
            self._choices.send(self._enc, events)
        else:                          # a whole answer: the count nginx settles if it times out first
            self._choices.generated()
        return self._text.stopped

    def end(self, reason: StopReason, output_tokens: int) -> bool:
        events = self._text.finish()
        if self._enc is not None:
            self._choices.send(self._enc, events)
        self._choices.ended(self._index, self._text.result(reason, self._prompt_tokens, output_tokens))
        return True

    def flush(self) -> bool:
        return self._choices.flush()

    @property
    def blocked(self) -> bool:
        return self._choices.blocked

    def fail(self, err: ApiError | None = None) -> None:
        self._choices.fail(err)

    def abandoned(self, exc: SlotAbandoned) -> None:
        self._choices.abandoned(exc)


def all_done(n: int, then: Callable[[], None]) -> Callable[[object], None]:
    """An on_done for each of n sequences that calls `then` once, after the last."""
    left = [n]

    def one(_: object) -> None:
        left[0] -= 1
        if left[0] == 0:
            then()
    return one
