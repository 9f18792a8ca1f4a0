"""The interface every model backend implements: a KV state per sequence, and a
decode batch that advances every running sequence by one token per forward.

zccp.serving.scheduler drives it: prefill a new sequence alone (in chunks, on top of prefix
blocks from zccp.serving.prefix_cache when it has them), join it to the batch, decode the
whole batch one step at a time, let finished or paused rows leave between steps.
generate() runs one sequence through the same calls (the inline path, tests, and
the bench's FastAPI variant).

Input ids arrive as a 1-D int32 tensor that is a zero-copy view of the slot's token
array in shared memory (or a device view of it on the GPU): a backend copies what it
needs and keeps no reference to it.
"""

from __future__ import annotations

import contextlib
import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from zccp.model.grammar import CompiledGrammar, GrammarVocab
from zccp.model.prompt import BYTE_FORMAT, PromptFormat
from zccp.model.sampling_checks import check_sampling
from zccp.serving.planner import Planner
from zccp.shared_types import SamplingParams

if TYPE_CHECKING:
    import torch

    from zccp.model.sampling import Sampler


class DecodeBatch(ABC):
    """The running sequences of one backend, decoded together."""

    @property
    @abstractmethod
    def rows(self) -> int: ...

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Memory its KV state takes now (padding included)."""

    @abstractmethod
    def join(self, state: Any) -> None:
        """Append a prefilled sequence (its state is consumed) as the last row."""

    @abstractmethod
    def leave(self, keep: Sequence[int]) -> None:
        """Keep only rows `keep`, in that order."""

    @abstractmethod
    def park(self, row: int) -> Any:
        """A copy of row `row`'s state, to join again later (call leave() after)."""

    @abstractmethod
    def decode(self, tokens: Sequence[int]) -> torch.Tensor | list[int]:
        """Feed each row its next token; the logits of the next position, [rows, vocab]
        (or, for a backend whose output is fixed, the next tokens themselves)."""


_F = TypeVar("_F", bound=Callable[..., Any])


def inference_mode(fn: _F) -> _F:
    """torch.inference_mode() around fn (a generator: around each resume), torch imported at
    fn's first call: a backend without torch never calls one of these."""
    wrapped: Callable[..., Any] | None = None

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal wrapped
        if wrapped is None:
            import torch

            wrapped = torch.inference_mode()(fn)
        return wrapped(*args, **kwargs)

    return cast(_F, call)


class ModelBackend(ABC):
    name: str                          # served model name, e.g. "zccp-tiny"
    max_context: int                   # prompt + completion tokens the backend accepts
    vocab_size: int
    eos_ids: frozenset[int] = frozenset()
    prefill_chunk: int = 0             # configured chunk cap; 0: the planner decides
    prompt: PromptFormat = BYTE_FORMAT
    prefix_blocks: bool = False        # take_block() works: prompt prefixes can be reused
    # Computes with torch: its prompts come as torch views, the model thread runs in inference
    # mode. A backend without (null, upstream) gets numpy views and torch is never imported
    # (registry.backend_uses_torch names them before they are built).
    uses_torch: bool = True

    @property
    def device(self) -> torch.device:
        import torch

        return torch.device("cpu")

    @property
    def kv_bytes_per_token(self) -> int:
        """KV memory one token of one sequence takes (0: no KV state)."""
        return 0

    @property
    def activation_bytes_per_token(self) -> int:
        """Rough transient memory one prefill token takes (the planner's unit)."""
        return 0

    @property
    def identity(self) -> bytes:
        """What makes two backends' KV states interchangeable (prefix-cache key salt)."""
        return self.name.encode()

    # -- the scheduler's calls -----------------------------------------------------------

    @abstractmethod
    def new_state(self, blocks: Sequence[torch.Tensor] = ()) -> Any:
        """A sequence's KV state: empty, or the prefix that `blocks` hold."""

    @abstractmethod
    def state_length(self, state: Any) -> int:
        """Tokens in the state (the next token's position)."""

    @abstractmethod
    def prefill(self, state: Any, ids: torch.Tensor) -> torch.Tensor | int:
        """Run ids (1-D long, on the device) at positions state_length.. and append them
        to the state; the raw logits at the last position, [vocab] (or the next token,
        for a backend whose output is fixed)."""

    def prefill_many(self, states: Sequence[Any], chunks: Sequence[torch.Tensor]) -> list[torch.Tensor | int]:
        """prefill() of several sequences, chunks[i] appended to states[i]; each one's
        output as prefill() gives it. This default runs them one by one; a backend whose
        forward takes a padded batch does them in one forward (zccp.model.hf)."""
        return [self.prefill(state, ids) for state, ids in zip(states, chunks, strict=True)]

    @abstractmethod
    def new_batch(self) -> DecodeBatch: ...

    def take_block(self, state: Any, start: int, end: int) -> torch.Tensor | None:
        """Positions [start, end) of the state as a prefix block (None: no prefix reuse)."""
        return None

    def process_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Applied before sampling (e.g. the tiny model's allowed-token mask)."""
        return logits

    # False for a backend that chooses tokens without logits (no grammar, no logprobs)
    has_logits: bool = True

    _grammar: GrammarVocab | None = None

    def grammar_vocab(self) -> GrammarVocab:
        """The vocabulary a grammar masks, built once (on first use)."""
        if self._grammar is None:
            self._grammar = self._make_grammar_vocab()
        return self._grammar

    def _make_grammar_vocab(self) -> GrammarVocab:
        raise NotImplementedError(f"{type(self).__name__} has no logits to constrain")

    def sampler(self, params: SamplingParams, compiled: CompiledGrammar | None = None,
                prompt: Any = ()) -> Sampler:
        """The next-token chooser of one sequence (prompt: its ids, read for repetition_penalty;
        with its own grammar matcher when the
        answer is constrained: a copy of `compiled`, or compiled here when not given,
        generate()'s path; the scheduler always gives it)."""
        grammar = None
        if compiled is not None:
            grammar = compiled.matcher()
        elif params.constraint is not None:
            grammar = self.grammar_vocab().matcher(params.constraint)
        from zccp.model.sampling import Sampler

        return Sampler(params, self.device, grammar, self.eos_ids, prompt)

    def choose(self, out: torch.Tensor | int, sampler: Sampler) -> int:
        """One sequence's next token from prefill()'s or a one-row decode()'s output."""
        if isinstance(out, int):
            return out
        return sampler(self.process_logits(out))

    def inference(self) -> contextlib.AbstractContextManager[Any]:
        """The model thread's mode: torch's inference mode for a backend that computes with it."""
        if not self.uses_torch:
            return contextlib.nullcontext()
        import torch

        return torch.inference_mode()

    def to(self, device: torch.device | str) -> ModelBackend:
        return self

    # -- one sequence ------------------------------------------------------------------

    def check_prompt(self, input_ids: torch.Tensor) -> torch.Tensor:
        """A validated copy of the prompt ids: 1-D long on the model's device."""
        import torch

        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 1:
            raise ValueError("input_ids must be a 1-D tensor")
        n = input_ids.numel()
        if n == 0:
            raise ValueError("input_ids is empty")
        if n > self.max_context:
            raise ValueError(f"prompt ({n} tokens) exceeds the model's context of {self.max_context}")
        ids = input_ids.to(device=self.device, dtype=torch.long, copy=True)
        lo, hi = torch.aminmax(ids)
        if int(lo) < 0 or int(hi) >= self.vocab_size:
            raise ValueError(f"input_ids must be in [0, {self.vocab_size}), got [{int(lo)}, {int(hi)}]")
        return ids

    def prefill_chunked(self, state: Any, ids: torch.Tensor, chunk: int) -> torch.Tensor | int:
        """prefill() in chunks whose boundaries are absolute multiples of `chunk` (0: one
        pass), so a prompt prefilled on top of reused blocks computes the same chunks."""
        start = self.state_length(state)
        logits = None
        pos = 0
        while pos < ids.numel():
            end = Planner.chunk_end(start + pos, start + ids.numel(), chunk) - start
            logits = self.prefill(state, ids[pos:end])
            pos = end
        assert logits is not None, "prefill of no tokens"
        return logits

    @inference_mode
    def prefill_logits(self, input_ids: torch.Tensor, chunk: int = 0) -> torch.Tensor:
        """Raw logits at the last prompt position, prefilled in `chunk`-token chunks."""
        out = self.prefill_chunked(self.new_state(), self.check_prompt(input_ids), chunk)
        assert not isinstance(out, int), "this backend has no logits"
        return out.clone()

    def generate(
        self,
        input_ids: torch.Tensor,
        params: SamplingParams,
        cancelled: Callable[[], bool],
    ) -> Iterator[int]:
        """Yield generated token ids until EOS (not yielded), params.max_tokens, or cancelled().

        Validates eagerly (ValueError here, not on the first next()); the prompt is
        copied before this returns, so the caller's view is never referenced later."""
        ids = self.check_prompt(input_ids)
        check_sampling(params)
        if ids.numel() + params.max_tokens > self.max_context:
            raise ValueError(
                f"prompt ({ids.numel()} tokens) + max_tokens ({params.max_tokens}) exceeds "
                f"the model's context of {self.max_context} tokens"
            )
        return self._generate(ids, params, cancelled)

    # As a decorator (not a `with` inside the body) so inference mode is entered
    # around each resume of the generator and never leaks into the consumer.
    @inference_mode
    def _generate(self, ids: torch.Tensor, params: SamplingParams, cancelled: Callable[[], bool]) -> Iterator[int]:
        if params.max_tokens == 0 or cancelled():
            return
        state = self.new_state()
        sampler = self.sampler(params, prompt=ids)
        logits = self.prefill_chunked(state, ids, self.prefill_chunk)
        del ids
        batch = self.new_batch()
        batch.join(state)
        produced = 0
        while True:
            if cancelled():
                return
            tok = self.choose(logits, sampler)
            if tok in self.eos_ids:
                return
            yield tok
            produced += 1
            if produced >= params.max_tokens or cancelled() or tok in params.stop_token_ids:
                return
            logits = batch.decode((tok,))[0]
