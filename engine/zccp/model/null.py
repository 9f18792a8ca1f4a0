"""A backend with no model: it answers every prompt with the same fixed reply.

Used to benchmark the pipeline (nginx, shared memory, parsing, rendering,
streaming) without any model cost, and by tests as a model whose output is known
(e.g. a reply that holds a <tool_call>). It looks at the prompt's length only (through
the usage count), never at its contents. In a batch it names each row's next token
itself (the reply's next byte, EOS after the last): no logits, no sampling, no tensor
work per step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from zccp.model.base import DecodeBatch, ModelBackend
from zccp.model.tokenizer import EOS, VOCAB_SIZE
from zccp.shared_types import SamplingParams

if TYPE_CHECKING:
    import torch

DEFAULT_REPLY = "Hello from the ZCCP null backend."


class _State:
    __slots__ = ("prompt_len", "length")

    def __init__(self) -> None:
        self.prompt_len = 0
        self.length = 0


class NullBackend(ModelBackend):
    def __init__(
        self,
        reply: str = DEFAULT_REPLY,
        name: str = "zccp-null",
        max_context: int = 8192,
        token_delay_ms: float = 0.0,
        fail_after: int = -1,
    ) -> None:
        self.name = name
        self.has_logits = False           # its tokens are fixed: no grammar, no logprobs
        self.uses_torch = False           # its prompts are numpy views: the engine never imports torch
        self.max_context = max_context
        self.vocab_size = VOCAB_SIZE
        self.eos_ids = frozenset({EOS})
        # Simulates a model's time per forward (benchmarks, tests of long requests).
        self.token_delay_s = token_delay_ms / 1000.0
        self.reply = reply
        self._ids: tuple[int, ...] = tuple(reply.encode("utf-8"))
        # Fault injection: raise after this many tokens (-1: never), as a model that
        # fails mid-answer would; the tests drive the engine's failure paths with it.
        self.fail_after = fail_after

    def generate(
        self,
        input_ids: torch.Tensor | np.ndarray,
        params: SamplingParams,
        cancelled: Callable[[], bool],
    ) -> Iterator[int]:
        # The inline path's fast replay (no tensors). Slice eagerly: the returned iterator
        # holds no reference to input_ids. Truncation is per byte token, so a short
        # max_tokens may cut a multi-byte character (then U+FFFD), like any byte model.
        return self._replay(self._ids[: max(params.max_tokens, 0)], cancelled)

    def fixed_reply(self, params: SamplingParams) -> tuple[int, ...] | None:
        """Every token of the answer at once, when nothing can happen between them (no
        per-token delay, no injected failure): generate_text then skips the token loop."""
        if self.token_delay_s or self.fail_after >= 0:
            return None
        return self._ids[: max(params.max_tokens, 0)]

    def _replay(self, ids: tuple[int, ...], cancelled: Callable[[], bool]) -> Iterator[int]:
        for n, tok in enumerate(ids):
            if n == self.fail_after:
                raise RuntimeError(f"null backend: injected failure after {n} tokens (model.null_fail_after)")
            if cancelled():
                return
            if self.token_delay_s:
                time.sleep(self.token_delay_s)
            yield tok

    # -- the scheduler's calls -----------------------------------------------------------

    def check_prompt(self, input_ids: torch.Tensor | np.ndarray) -> np.ndarray:   # type: ignore[override]
        """The prompt's ids as a 1-D array (a copy), checked as the torch backends' are."""
        host = input_ids if isinstance(input_ids, np.ndarray) else input_ids.cpu().numpy()   # a torch caller's
        ids = np.array(host, dtype=np.int64).reshape(-1)
        if not len(ids):
            raise ValueError("input_ids is empty")
        if len(ids) > self.max_context:
            raise ValueError(f"prompt ({len(ids)} tokens) exceeds the model's context of {self.max_context}")
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            raise ValueError(f"input_ids must be in [0, {self.vocab_size})")
        return ids

    def new_state(self, blocks: Sequence[torch.Tensor] = ()) -> _State:
        return _State()

    def state_length(self, state: _State) -> int:
        return state.length

    def prefill(self, state: _State, ids: torch.Tensor | np.ndarray) -> int:
        if self.token_delay_s:
            time.sleep(self.token_delay_s)
        state.length += len(ids)
        state.prompt_len = state.length
        return self._next(state)

    def new_batch(self) -> DecodeBatch:
        return _NullBatch(self)

    def _next(self, s: _State) -> int:
        k = s.length - s.prompt_len
        if k == self.fail_after:
            raise RuntimeError(f"null backend: injected failure after {k} tokens (model.null_fail_after)")
        return self._ids[k] if k < len(self._ids) else EOS


class _NullBatch(DecodeBatch):
    def __init__(self, backend: NullBackend) -> None:
        self._backend = backend
        self._states: list[_State] = []

    @property
    def rows(self) -> int:
        return len(self._states)

    @property
    def nbytes(self) -> int:
        return 0

    def join(self, state: Any) -> None:
        self._states.append(state)

    def leave(self, keep: Sequence[int]) -> None:
        self._states = [self._states[i] for i in keep]

    def park(self, row: int) -> Any:
        return self._states[row]

    def decode(self, tokens: Sequence[int]) -> list[int]:
        if self._backend.token_delay_s:
            time.sleep(self._backend.token_delay_s)
        for s in self._states:
            s.length += 1
        return [self._backend._next(s) for s in self._states]
