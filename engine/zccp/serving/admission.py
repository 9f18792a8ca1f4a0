"""Step 4 of the model thread (zccp.serving.scheduler): waiting sequences join the batch.

The waiting tenant whose turn it is (zccp.serving.fair_queue.FairQueue.next: fewest rows held, the
last spare_rows kept for a tenant holding none) is admitted while the batch has a row
(model.max_batch) and the KV bound (model.kv_cache_mb) holds for every admitted sequence at
its longest (prompt + max_tokens, padded to the longest row, with the KV buffers' spare
room). Admission reuses the prefix cache's blocks and gives the sequence its sampler (a
copy of its compiled grammar); a sequence whose admission fails fails alone.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from zccp.serving.fair_queue import FairQueue
from zccp.observe.metrics import EngineMetrics
from zccp.model.base import ModelBackend
from zccp.serving.planner import Planner, room
from zccp.serving.prefix_cache import PrefixCache, cache_write
from zccp.serving.sequences import BatchLimits, Sequence
from zccp.shared_types import ApiError, CacheWrite

if TYPE_CHECKING:
    import torch

log = logging.getLogger("zccp.scheduler")

_NO_IDS = np.empty(0, dtype=np.int32)


class Admitting:
    """BatchScheduler's admission (a mixin: the attributes are the scheduler's)."""

    backend: ModelBackend
    limits: BatchLimits
    planner: Planner
    prefix: PrefixCache | None
    metrics: EngineMetrics
    _waiting: FairQueue
    _live: set[Sequence]
    _prefilling: deque[Sequence]

    def _active(self) -> list[Sequence]:
        raise NotImplementedError

    def _fail(self, seq: Sequence, err: ApiError | None = None) -> None:
        raise NotImplementedError

    def _sink_call(self, seq: Sequence, fn: Callable[..., Any], *args: Any) -> Any:
        raise NotImplementedError

    def _quiet(self) -> bool:
        raise NotImplementedError

    def _fits(self, seq: Sequence) -> bool:
        active = self._active()
        if len(active) >= self.limits.max_batch:
            return False
        worst = room(max([s.worst for s in active] + [self._worst(seq)]))     # spare columns included
        return (len(active) + 1) * worst * self.backend.kv_bytes_per_token <= self.limits.kv_budget_bytes

    def _worst(self, seq: Sequence) -> int:
        n = len(seq.input_ids) if seq.input_ids is not None else 0
        return min(n + seq.params.max_tokens, self.backend.max_context)

    def _admit(self) -> None:
        while (seq := self._waiting.next(self._active(), self.limits.max_batch)) is not None and self._fits(seq):
            self._waiting.pop(seq)
            self._live.add(seq)
            try:
                self._start(seq)
            except ApiError as err:
                self._fail(seq, err)
                continue
            except Exception:
                log.exception("admitting a sequence failed")
                self._fail(seq)
                continue
            if seq.state is not None:
                self._prefilling.append(seq)

    def _start(self, seq: Sequence) -> None:
        backend = self.backend
        assert seq.input_ids is not None
        seq.worst = self._worst(seq)
        ids = backend.check_prompt(seq.input_ids)
        seq.input_ids = None                       # the slot's views are not kept
        n = len(ids)
        blocks: list[torch.Tensor] = []
        if self.prefix is not None:
            seq.keys = self.prefix.chain(seq.host_ids, n // self.prefix.block, seq.salt)
            match = self.prefix.match(seq.host_ids, seq.salt)
            blocks = match.blocks
            seq.reused = match.count * self.prefix.block
        seq.host_ids = _NO_IDS
        seq.state = backend.new_state(blocks)
        seq.ids = ids
        seq.done_tokens = seq.reused
        if seq.params.constraint is not None and seq.grammar is None:
            raise RuntimeError("a constrained sequence was submitted without its compiled grammar")
        if backend.has_logits:   # a backend without names each token itself: nothing to sample
            seq.sampler = backend.sampler(seq.params, seq.grammar, prompt=ids)   # a copy of the compiled grammar
        self.metrics.prefix_reused.inc(seq.reused)
        # what breakpoints write: only a sequence with pins is told (a sink without them takes two arguments)
        written: tuple[CacheWrite, ...] = ()
        if seq.pins and self.prefix is not None:
            written = (cache_write(seq.pins, seq.reused, self.prefix.block),)
        # the plan as the step's prefill will cut it (alone: nothing else admitted or running)
        chunk = self.planner.chunk(alone=not self._prefilling and self._quiet())
        self._sink_call(seq, seq.sink.start, seq.reused, Planner.chunks(seq.reused, n, chunk), *written)
