"""The generation loop every backend shares: tokens -> text deltas -> one result.

generate_text() pulls byte token ids from a backend, decodes them incrementally as
UTF-8 (never emitting half a character; invalid bytes become U+FFFD), applies stop
sequences to the generated text, and yields TextDelta values followed by exactly
one GenerationResult. Text that might be the beginning of a stop sequence is held
back until it can no longer be one (or until generation ends, when it is released).

Cancellation: cancelled() is checked before every token is pulled; once it returns
True the iterator ends at once, WITHOUT a GenerationResult (the caller discards the
request anyway), and the backend's generator is closed.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterator, Sequence

import torch

from zccp.model.base import ModelBackend
from zccp.request import GenerationResult, SamplingParams, StopReason, TextDelta


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
        """Length of the longest suffix of buf that is a proper prefix of a stop."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:k]):
                    best = k
                    break
        return best


def generate_text(
    backend: ModelBackend,
    input_ids: torch.Tensor,
    params: SamplingParams,
    cancelled: Callable[[], bool],
) -> Iterator[TextDelta | GenerationResult]:
    """Stream a completion as TextDelta values, then one GenerationResult.

    Errors the backend raises when called (e.g. ValueError for a prompt that does
    not fit its context) surface on the first next().
    """
    input_tokens = int(input_ids.numel())
    max_tokens = params.max_tokens
    if cancelled():
        return
    tokens = backend.generate(input_ids, params, cancelled)
    del input_ids  # the shared-memory view must not outlive the backend's use of it

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    matcher = StopMatcher(params.stop)
    parts: list[str] = []
    output_tokens = 0
    stop_reason: StopReason = "end_turn"
    stop_sequence: str | None = None
    one = bytearray(1)

    try:
        while output_tokens < max_tokens:
            if cancelled():
                return
            tok = next(tokens, None)
            if tok is None:
                break
            output_tokens += 1
            if not 0 <= tok < 256:
                continue  # special ids carry no text
            one[0] = tok
            text = decoder.decode(one)
            if not text:
                continue  # inside a multi-byte character
            released, stop_sequence = matcher.feed(text)
            if released:
                parts.append(released)
                yield TextDelta(released)
            if stop_sequence is not None:
                stop_reason = "stop_sequence"
                break
        else:
            stop_reason = "max_tokens"
    finally:
        close = getattr(tokens, "close", None)
        if close is not None:
            close()
    if cancelled():
        return

    if stop_sequence is None:
        # A dangling partial character becomes U+FFFD; it may still complete a stop.
        tail = decoder.decode(b"", final=True)
        released, stop_sequence = matcher.feed(tail) if tail else ("", None)
        if stop_sequence is not None:
            stop_reason = "stop_sequence"
        else:
            released += matcher.flush()
        if released:
            parts.append(released)
            yield TextDelta(released)

    yield GenerationResult(
        text="".join(parts),
        stop_reason=stop_reason,
        stop_sequence=stop_sequence,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
    )
