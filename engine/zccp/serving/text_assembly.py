"""The generation loop every backend shares: tokens -> text deltas -> one result.

TextAssembler turns one sequence's generated token ids into what the client sees:
the backend's incremental detokenizer (never half a character; invalid bytes become
U+FFFD), stop sequences applied to the generated text (text that might be the start
of one is held back until it can no longer be, or until generation ends), then the
tool-call parser when the request offered tools (zccp.serving.hermes_tools). The batch scheduler
feeds it one token per step; generate_text() drives it from a backend's generate()
for a single sequence (the inline path, the bench's FastAPI variant, tests).

Cancellation (generate_text): cancelled() is checked before every token is pulled;
once it returns True the iterator ends at once, WITHOUT a GenerationResult (the
caller discards the request anyway), and the backend's generator is closed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from zccp.model.prompt import Detokenizer
from zccp.shared_types import GenerationResult, SamplingParams, StopReason, TextDelta, ToolCall
from zccp.serving.hermes_tools import Event, HermesParser

if TYPE_CHECKING:
    import torch


class StopMatcher:
    """Finds stop sequences in streamed text, holding back possible prefixes.

    feed(text) returns (released_text, matched_stop_or_None). After a match,
    released_text is everything before the stop sequence and the matcher is done.
    flush() releases what is still held back (call when generation ends).
    """

    def __init__(self, stops: Sequence[str]) -> None:
        # Empty stop strings would match everywhere; they are ignored.
        self.stops = tuple(dict.fromkeys(s for s in stops if s))
        self.pending = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        if not self.stops:
            return text, None
        buf = self.pending + text
        best_at, best = -1, None
        for s in self.stops:
            i = buf.find(s)
            # earliest start wins; at the same start the shorter one (it completed first)
            if i >= 0 and (best is None or i < best_at or (i == best_at and len(s) < len(best))):
                best_at, best = i, s
        if best is not None:
            self.pending = ""
            return buf[:best_at], best
        hold = self._held_suffix(buf)
        self.pending = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], None

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out

    def _held_suffix(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of a stop. Only the
        lengths k whose prefix ends with buf's last character are compared (str.rfind finds
        them): a few per stop, not one per length (16 stops of 256 bytes, every token)."""
        best, last = 0, buf[-1:]
        if not last:
            return 0
        for s in self.stops:
            k = min(len(s) - 1, len(buf))
            while k > best:
                k = s.rfind(last, 0, k) + 1              # the longest k' <= k with s[k' - 1] == last
                if k <= best:
                    break
                if buf.endswith(s[:k]):
                    best = k
                    break
                k -= 1
        return best


class TextAssembler:
    """One sequence's generated ids -> events (text, tool calls: zccp.serving.hermes_tools), in order."""

    def __init__(self, detok: Detokenizer, stops: Sequence[str], tools: HermesParser | None = None,
                 budget: int | None = None, min_tokens: int = 0) -> None:
        self._detok = detok
        self._unstoppable = min_tokens if stops else 0   # vLLM's min_tokens: no stop sequence before
        self._matcher = StopMatcher(stops)
        self._tools = tools
        self._text: list[str] = []
        self.tool_calls: list[ToolCall] = []
        self.stop_sequence: str | None = None     # set when a stop sequence ended the text
        # a forced call's budget (docs/tools.md): max_tokens counts the tokens of its arguments
        # only; the fixed wrapper around them is free (the scheduler's cap allows for it)
        self.budget = budget if tools is not None else None
        self.billed = 0                            # tokens counted against the budget so far
        self.spent = False                         # a token past the budget arrived: the answer ends

    @property
    def done(self) -> bool:
        """A stop sequence ended the text, or a forced call's budget is spent."""
        return self.stop_sequence is not None or self.spent

    @property
    def text(self) -> str:
        return "".join(self._text)

    def feed(self, token: int) -> list[Event]:
        """The events one more token releases (none once a stop sequence matched)."""
        if self.stop_sequence is not None or self.spent:     # done, without the property's call
            return []
        tools = self._tools
        if self.budget is None or tools is None:
            return self._step(token)
        # billed: a token inside the arguments, or one that starts them; one more than the
        # budget allows is not shown (it ends the answer, as max_tokens does)
        inside, before = tools.in_args, tools.args_chars
        if inside and self.billed >= self.budget:
            self.spent = True
            return []
        events = self._step(token)
        if inside or tools.args_chars > before:
            self.billed += 1
        return events

    def _step(self, token: int) -> list[Event]:
        text = self._detok.step(token)
        if self._unstoppable:
            self._unstoppable -= 1
            return self._events(self._matcher.flush() + text, final=False) if text else []
        if not text:
            return []
        released, self.stop_sequence = self._matcher.feed(text)
        return self._events(released, final=self.stop_sequence is not None)

    def finish(self) -> list[Event]:
        """Release what is held back, at the end of the generation."""
        if self.stop_sequence is not None:
            return []
        if self.spent:
            return self._events("", final=True)
        # A dangling partial character becomes U+FFFD; it may still complete a stop.
        tail = self._detok.flush()
        released, self.stop_sequence = self._matcher.feed(tail) if tail else ("", None)
        if self.stop_sequence is None:
            released += self._matcher.flush()
        return self._events(released, final=True)

    def stop_reason(self, reason: StopReason) -> StopReason:
        """The reason to report: a stop sequence if one matched, and tool_use for a turn
        that ended with tool calls (not for one cut short by max_tokens)."""
        if self.stop_sequence is not None:
            reason = "stop_sequence"
        if self.spent:
            return "max_tokens"
        return "tool_use" if self.tool_calls and reason != "max_tokens" else reason

    def _events(self, text: str, final: bool) -> list[Event]:
        if self._tools is None:          # text alone: one delta, nothing to sort
            if not text:
                return []
            self._text.append(text)
            return [TextDelta(text)]
        out = self._tools.feed(text) if text else []
        if final:
            out += self._tools.finish()
        for ev in out:
            if isinstance(ev, TextDelta):
                self._text.append(ev.text)
            elif isinstance(ev, ToolCall):
                self.tool_calls.append(ev)
        return out


def generate_text(
    backend: Any,
    input_ids: torch.Tensor,
    params: SamplingParams,
    cancelled: Callable[[], bool],
    tools: bool = False,
) -> Iterator[Event | GenerationResult]:
    """Stream a completion as TextDelta (and ToolCall) values, then one GenerationResult.

    `backend` needs generate() and prompt (a ModelBackend). Errors the backend raises
    when called (e.g. ValueError for a prompt that does not fit its context) surface
    on the first next().
    """
    input_tokens = len(input_ids)
    max_tokens = params.max_tokens
    if cancelled():
        return
    fixed = getattr(backend, "fixed_reply", None)
    ids = fixed(params) if fixed is not None and not tools and not params.stop else None
    if ids is not None:
        yield from _whole(backend, ids, input_tokens, max_tokens)
        return
    tokens = backend.generate(input_ids, params, cancelled)
    del input_ids  # the shared-memory view must not outlive the backend's use of it
    asm = TextAssembler(backend.prompt.detokenizer(()), params.stop, HermesParser() if tools else None,
                        min_tokens=params.min_tokens)
    output_tokens = 0
    stop_reason: StopReason = "end_turn"
    try:
        while output_tokens < max_tokens:
            if cancelled():
                return
            tok = next(tokens, None)
            if tok is None:
                break
            output_tokens += 1
            yield from asm.feed(tok)
            if asm.stop_sequence is not None:
                break
        else:
            stop_reason = "max_tokens"
    finally:
        close = getattr(tokens, "close", None)
        if close is not None:
            close()
    if cancelled():
        return
    yield from asm.finish()
    yield GenerationResult(
        text=asm.text,
        stop_reason=asm.stop_reason(stop_reason),
        stop_sequence=asm.stop_sequence,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        tool_calls=tuple(asm.tool_calls),
    )


def _whole(backend: Any, ids: Sequence[int], input_tokens: int,
           max_tokens: int) -> Iterator[TextDelta | GenerationResult]:
    """generate_text for an answer known whole in advance (no stops, no tools): the same
    events and result as the token loop, from one detokenization pass."""
    result = _whole_result(backend, ids, input_tokens, max_tokens)
    if result.text:
        yield TextDelta(result.text)
    yield result


def fixed_result(backend: Any, input_tokens: int, params: SamplingParams, tools: bool) -> GenerationResult | None:
    """generate_text's final result, without its events, for a backend that knows its answer
    whole (the null model's fixed reply); None: run generate_text (the inline path's shortcut)."""
    fixed = getattr(backend, "fixed_reply", None)
    ids = fixed(params) if fixed is not None and not tools and not params.stop else None
    return None if ids is None else _whole_result(backend, ids, input_tokens, params.max_tokens)


def _whole_result(backend: Any, ids: Sequence[int], input_tokens: int, max_tokens: int) -> GenerationResult:
    return GenerationResult(
        text=_whole_text(backend.prompt, tuple(ids)),
        stop_reason="max_tokens" if len(ids) >= max_tokens else "end_turn",
        stop_sequence=None,
        input_tokens=input_tokens,
        output_tokens=len(ids),
        tool_calls=(),
    )


@lru_cache(maxsize=256)
def _whole_text(fmt: Any, ids: tuple[int, ...]) -> str:
    """A fixed reply's text: a fresh detokenizer over the same ids always spells the same
    text, so it is detokenized once per (format, ids), not once per request (~12 µs of a
    null-model miss). Bounded: a backend has one fixed reply, cut at each max_tokens."""
    detok = fmt.detokenizer(())
    return "".join([detok.step(t) for t in ids]) + detok.flush()
