"""Step 5 of the model thread (zccp.serving.scheduler): the step's prefill.

What the step's token budget leaves beside the running rows (model.step_tokens, at least
one chunk; zccp.serving.planner) is prefilled (a prompt alone in the model: up to the memory plan's
chunk, the budget does not cut it): the next chunks of several waiting sequences go into
ONE forward when they fit (Planner.group_rows); a group that fails is retried one sequence
at a time, so only a sequence whose own prefill fails is failed. A sequence whose prefill
completes keeps its new prefix blocks, samples its first token and joins the batch.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zccp.observe.metrics import EngineMetrics
from zccp.model.base import DecodeBatch, ModelBackend
from zccp.serving.planner import Planner
from zccp.serving.prefix_cache import PrefixCache
from zccp.serving.sequences import Sequence
from zccp.shared_types import ApiError, StopReason

if TYPE_CHECKING:
    import torch

    from zccp.model.sampling import Choice, Sampler

log = logging.getLogger("zccp.scheduler")

# What became of a sequence after one token (BatchScheduler._emit).
RUN, PARK, OUT = "run", "park", "out"


class Prefilling:
    """BatchScheduler's prefill (a mixin: the attributes are the scheduler's)."""

    backend: ModelBackend
    planner: Planner
    prefix: PrefixCache | None
    metrics: EngineMetrics
    _prefilling: deque[Sequence]
    _rows: list[Sequence]
    _parked: list[Sequence]
    _batch: DecodeBatch

    def _fail(self, seq: Sequence, err: ApiError | None = None) -> None:
        raise NotImplementedError

    def _sink_call(self, seq: Sequence, fn: Callable[..., Any], *args: Any) -> Any:
        raise NotImplementedError

    def _finish(self, seq: Sequence, reason: StopReason) -> None:
        raise NotImplementedError

    def _choose(self, out: torch.Tensor | list[int], samplers: list[Sampler | None]) -> list[Choice]:
        raise NotImplementedError

    def _emit(self, seq: Sequence, tok: Choice) -> str:
        raise NotImplementedError

    def _quiet(self) -> bool:
        raise NotImplementedError

    def _prefill(self) -> None:
        # a lone prompt (nothing else in the model) is prefilled in chunks sized by memory
        # alone: no stream decodes beside it, so the step budget would only add forwards
        chunk = self.planner.chunk(alone=len(self._prefilling) == 1 and self._quiet())
        budget = Planner.prefill_budget(chunk, len(self._rows))   # the running rows decode this step too
        self.metrics.prefill_steps.inc()
        if self._rows:
            self.metrics.mixed_steps.inc()
        step = budget
        while self._prefilling and budget > 0:
            group = self._group(chunk, budget)
            spans = [(seq.done_tokens, Planner.chunk_end(seq.done_tokens, self._prompt_len(seq), chunk))
                     for seq in group]
            cost = len(group) * max(b - a for a, b in spans)
            if cost > budget and budget < step:
                break                                          # the first group always runs; others if they fit
            chunks = [self._ids(seq)[a:b] for seq, (a, b) in zip(group, spans, strict=True)]
            outs = self._prefill_group(group, chunks)
            budget -= cost
            first: list[tuple[Sequence, torch.Tensor | int]] = []
            for seq, (a, b), out in zip(group, spans, outs, strict=True):
                if out is None:
                    continue                                   # its prefill failed: it was failed alone
                self.metrics.prefilled.inc(b - a)
                seq.done_tokens = b
                if b < self._prompt_len(seq):
                    continue                                   # more chunks in a later forward
                self._prefilling.remove(seq)
                seq.ids = None
                self._sink_call(seq, seq.sink.kept, self._keep_prefix(seq))
                if seq.state is None:
                    continue                                   # the slot was abandoned meanwhile
                if seq.prefill_only or seq.params.max_tokens == 0:
                    seq.state = None
                    self._finish(seq, "end_turn" if seq.prefill_only else "max_tokens")
                    continue
                first.append((seq, out))
            if first:
                self._first_tokens(first)

    def _prefill_group(self, group: list[Sequence], chunks: list[torch.Tensor]) -> list[torch.Tensor | int | None]:
        """One forward for the group; when it fails, each sequence alone, so that only the
        ones whose own prefill fails are failed (None in their place)."""
        try:
            return list(self.backend.prefill_many([seq.state for seq in group], chunks))
        except Exception:
            log.exception("prefill failed" if len(group) == 1 else "group prefill failed; retrying each alone")
        if len(group) == 1:
            self._fail(group[0])
            return [None]
        outs: list[torch.Tensor | int | None] = []
        for seq, ids in zip(group, chunks, strict=True):
            outs.extend(self._prefill_group([seq], [ids]))
        return outs

    def _group(self, chunk: int, budget: int) -> list[Sequence]:
        """The prefilling sequences whose next chunks go into one forward (Planner.group_rows)."""
        rows = []
        for seq in self._prefilling:
            start = seq.done_tokens
            rows.append((start, Planner.chunk_end(start, self._prompt_len(seq), chunk) - start))
        seqs = list(self._prefilling)
        return [seqs[i] for i in Planner.group_rows(rows, min(budget, self.planner.group(chunk)))]

    @staticmethod
    def _ids(seq: Sequence) -> torch.Tensor:
        assert seq.ids is not None                             # set at admission, dropped once prefilled
        return seq.ids

    def _prompt_len(self, seq: Sequence) -> int:
        return len(self._ids(seq))

    def _first_tokens(self, first: list[tuple[Sequence, torch.Tensor | int]]) -> None:
        """The first token of each sequence whose prefill completed: sampled together, then
        each joins the batch (or parks, or is done)."""
        logits = [out for _, out in first if not isinstance(out, int)]
        rows: torch.Tensor | list[int]
        if len(logits) == len(first):
            import torch

            rows = torch.stack(logits)
        else:
            rows = [int(out) for _, out in first]
        toks = self._choose(rows, [seq.sampler for seq, _ in first])
        for (seq, _), tok in zip(first, toks, strict=True):
            outcome = self._emit(seq, tok)
            if outcome == RUN:
                self._batch.join(seq.state)
                seq.state = None
                self._rows.append(seq)
            elif outcome == PARK:
                self._parked.append(seq)
            else:
                seq.state = None

    def _keep_prefix(self, seq: Sequence) -> int:
        """Store the prompt's new full blocks; how many prompt tokens the cache now holds."""
        if self.prefix is None or not seq.keys:
            return 0
        b, state = self.prefix.block, seq.state
        self.prefix.insert(seq.keys, seq.reused // b, lambda i: self.backend.take_block(state, i * b, (i + 1) * b),
                           shared=seq.salt is None)
        if seq.pins:
            refused = self.prefix.pins_refused
            for pin in seq.pins:
                self.prefix.pin(seq.keys[: pin.tokens // b], pin.ttl_s)
            self.metrics.pins_refused.inc(self.prefix.pins_refused - refused)
            self.metrics.prefix_pinned.set(self.prefix.pinned_bytes)
        return self.prefix.held(seq.keys) * b
