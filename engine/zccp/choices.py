"""OpenAI's `n` > 1 (not streamed): n sequences of one request, one answer.

Each choice is its own sequence in the batch scheduler (its own sampler; a request seed
s gives choice i the seed s + i, so the choices differ and each is reproducible). Its
ChoiceSink assembles its text; when the last choice ends, the collector renders the one
JSON answer (choices in index order, usage: the prompt once, the completions summed)
into the slot and ends the request through its Outcome, once. A failure or an abandoned
slot ends the request at once and cancels the other choices.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from zccp.api.openai import render_choices
from zccp.arena import SlotView
from zccp.hermes_tools import HermesParser
from zccp.model.prompt import Detokenizer
from zccp.model.sampling import Drawn
from zccp.outcome import Outcome
from zccp.ring_writer import ResponseWriter, SlotAbandoned
from zccp.shared_types import NO_WRITE, CacheWrite, GenerationRequest, GenerationResult, SamplingParams, StopReason
from zccp.text_assembly import TextAssembler
from zccp.token_sink import SlotOutput


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    return params if params.seed is None else replace(params, seed=params.seed + index)


class Choices(SlotOutput):
    """The shared answer of n choices (the slot side: written once, ended once)."""

    def __init__(self, req: GenerationRequest, n: int, view: SlotView, writer: ResponseWriter,
                 prompt_tokens: int, outcome: Outcome) -> None:
        super().__init__(writer, outcome)
        self._req = req
        self._view = view
        self._prompt_tokens = prompt_tokens
        self._results: list[GenerationResult | None] = [None] * n
        self._cached = 0
        self.over = False          # failed or abandoned: the other choices are cancelled

    def started(self, cached_tokens: int) -> None:
        self._cached = max(self._cached, cached_tokens)

    def ended(self, index: int, result: GenerationResult) -> None:
        self._results[index] = result
        if self.over or any(r is None for r in self._results):
            return
        results = [r for r in self._results if r is not None]
        out = sum(r.output_tokens for r in results)
        self._writer.begin(200, sse=False)
        self._writer.write_nowait(render_choices(self._req, results, self._prompt_tokens, self._cached,
                                                 int(time.time())))
        self._writer.set_meta(completion_len=out)   # only while the slot is this request's (issue 20)
        self._result = replace(results[0], output_tokens=out, cached_tokens=self._cached)

    def fail(self) -> None:
        if not self.over:
            self.over = True
            self._outcome.failed(None)

    def abandoned(self, exc: SlotAbandoned) -> None:
        if not self.over:
            self.over = True
            self._outcome.abandoned(exc)


class ChoiceSink:
    """One choice's sequence: its text assembled here, its answer written by Choices."""

    def __init__(self, choices: Choices, index: int, req: GenerationRequest, prompt_tokens: int,
                 detok: Detokenizer, tool_calls: bool) -> None:
        self._choices = choices
        self._index = index
        self._prompt_tokens = prompt_tokens
        self._asm = TextAssembler(detok, req.sampling.stop, HermesParser() if tool_calls else None)

    def start(self, cached_tokens: int, plan_chunks: int, written: CacheWrite = NO_WRITE) -> None:
        self._choices.started(cached_tokens)      # OpenAI's n: no breakpoints

    def kept(self, tokens: int) -> None:
        pass

    def token(self, token: int, drawn: Drawn | None = None) -> bool:
        self._asm.feed(token)
        return self._asm.stop_sequence is not None

    def end(self, reason: StopReason, output_tokens: int) -> bool:
        self._asm.finish()
        self._choices.ended(self._index, GenerationResult(
            text=self._asm.text, stop_reason=self._asm.stop_reason(reason), stop_sequence=self._asm.stop_sequence,
            input_tokens=self._prompt_tokens, output_tokens=output_tokens, tool_calls=tuple(self._asm.tool_calls)))
        return True

    def flush(self) -> bool:
        return self._choices.flush()

    @property
    def blocked(self) -> bool:
        return self._choices.blocked

    def fail(self) -> None:
        self._choices.fail()

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
