"""What the batch scheduler runs (zccp.serving.scheduler): one Sequence per generated answer (a
request, or one of its n choices), its Sink (the output side, zccp.serving.token_sink), and the
batch's bounds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from zccp.serving.hermes_tools import is_forced_call, wrapper_tokens
from zccp.model.grammar import CompiledGrammar
from zccp.model.sampling_checks import Drawn
from zccp.transport.ring_writer import SlotAbandoned
from zccp.shared_types import NO_WRITE, ApiError, CacheWrite, Pin, SamplingParams, StopReason

if TYPE_CHECKING:
    import torch

    from zccp.model.sampling import Sampler


class Sink(Protocol):
    """The output side of one sequence (zccp.serving.token_sink): it renders and writes the answer."""

    def start(self, cached_tokens: int, plan_chunks: int, written: CacheWrite = NO_WRITE) -> None:
        """Admitted: the prompt's reused tokens, its prefill plan and (only for a sequence
        with pins) what its breakpoints will write into the prefix cache are known."""

    def kept(self, tokens: int) -> None:
        """The prefill is done; the prefix cache now holds this many of its prompt tokens."""

    def token(self, token: int, drawn: Drawn | None = None) -> bool:
        """One generated token (and its logprobs when asked for); True when the answer is
        complete (a stop sequence)."""

    def end(self, reason: StopReason, output_tokens: int) -> Any:
        """Generation is over; the value on_done receives once everything is written."""

    def flush(self) -> bool:
        """Write what a full ring held back; True when nothing is pending (and, after
        end(), the answer is finished)."""

    @property
    def blocked(self) -> bool:
        """Bytes are waiting for room in the response ring."""

    def fail(self, err: ApiError | None = None) -> None:
        """This sequence failed: answer with `err` (None: the engine's 500). Called with
        no argument unless there is an error to name (a sink may take none)."""

    def abandoned(self, exc: SlotAbandoned) -> None:
        """The slot is no longer ours."""


@dataclass(eq=False)
class Sequence:
    """What the flow submits: one request's prompt and where its tokens go."""

    input_ids: torch.Tensor | None        # the model's view of the slot's token array
    host_ids: np.ndarray                  # the same ids on the CPU (prefix-block hashing)
    params: SamplingParams
    sink: Sink
    cancelled: Callable[[], bool]
    on_done: Callable[[Any], None]        # on the model thread; the sink's end() value, or None
    prefill_only: bool = False            # a warm-up: prefill and keep the prefix blocks, no output
    salt: bytes | None = None             # the tenant's prefix-cache salt; None: shared (a warm-up)
    pins: tuple[Pin, ...] = ()            # prefixes to pin in the prefix cache (cache_control)
    # params.constraint compiled off the loop (zccp.model.grammar_cache): the model thread never compiles
    grammar: CompiledGrammar | None = None
    # -- the model thread's state ---------------------------------------------------------
    state: Any = field(default=None, repr=False)
    ids: torch.Tensor | None = field(default=None, repr=False)
    keys: list[bytes] = field(default_factory=list, repr=False)
    sampler: Sampler | None = field(default=None, repr=False)
    done_tokens: int = 0                  # prompt tokens in the state (reused or prefilled)
    reused: int = 0
    produced: int = 0
    last: int = 0
    worst: int = 0                        # prompt + max_tokens: its longest possible row
    result: Any = None

    def __post_init__(self) -> None:
        # a forced call's max_tokens counts its arguments only (docs/tools.md): the scheduler's
        # cap allows for the fixed wrapper; the sink stops the answer at the caller's budget
        c = self.params.constraint
        if is_forced_call(c) and c is not None and not self.prefill_only:
            self.params = replace(self.params, max_tokens=self.params.max_tokens + wrapper_tokens(c))

    @property
    def tenant(self) -> bytes:
        """Whose share this sequence is counted in (zccp.serving.fair_queue): the tenant digest
        nginx wrote into the slot (the verified key's tenant, or cache.tenant_source's), the
        same value as the prefix-cache salt; b"" for the anonymous and warm-ups."""
        return self.salt or b""


@dataclass(frozen=True)
class BatchLimits:
    max_batch: int                        # rows decoded together (prefilling and parked included)
    max_queue: int                        # sequences waiting for admission
    kv_budget_bytes: int
