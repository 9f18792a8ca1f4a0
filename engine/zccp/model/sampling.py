"""Choosing the next token from logits: every backend, every row of a batch.

One Sampler per sequence (its own torch.Generator, so a seeded request draws the same
tokens whatever else shares its batch); sample_rows() picks the next token of every
row of a batched step, with one argmax for all the greedy rows.

A row's failure is its own: no client number reaches a shared tensor unguarded (a
temperature too small to divide by is greedy; logits are shifted by their maximum before
they are scaled, so nothing overflows), and a row whose distribution is still invalid, or
whose grammar allows no token, comes back from sample_rows() as its ApiError while every
other row gets its token (docs/isolation.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from zccp.model.sampling_checks import Drawn as Drawn, check_sampling as check_sampling   # their home before
from zccp.shared_types import ApiError, SamplingParams

if TYPE_CHECKING:
    from zccp.model.grammar import GrammarMatcher


# Below this a temperature is greedy: dividing by it would overflow float32 (1e-300 is 0.0
# there), and the distribution it means is the argmax anyway.
GREEDY_BELOW = 1e-5


def no_token_allowed() -> ApiError:
    """The error of a row that cannot go on: nothing its grammar (and the model's vocabulary)
    allows is left, e.g. a schema whose next character the model cannot write."""
    return ApiError(400, "invalid_request_error", "the output grammar allows no token the model can produce at "
                    "this point: the JSON schema (or tool schema) cannot be completed with this model's vocabulary")


def invalid_distribution(what: str) -> ApiError:
    return ApiError(500, "api_error", f"sampling failed: the next-token distribution is invalid ({what})")


class Sampler:
    """temperature -> top_k -> top_p -> multinomial; argmax when temperature == 0."""

    __slots__ = ("greedy", "temperature", "top_k", "top_p", "gen", "grammar", "bias", "presence", "frequency",
                 "counts", "plain", "top_logprobs", "last", "_bias_ids", "_bias_values", "extra", "min_p")

    def __init__(self, params: SamplingParams, device: torch.device, grammar: GrammarMatcher | None = None,
                 eos: frozenset[int] = frozenset(), prompt: Any = ()) -> None:
        self.grammar = grammar               # masks what it does not allow, consumes each token drawn
        self.bias = params.logit_bias
        # the bias as two tensors, made at the first step (when the vocabulary's width is known)
        self._bias_ids: torch.Tensor | None = None
        self._bias_values: torch.Tensor | None = None
        self.presence = params.presence_penalty
        self.frequency = params.frequency_penalty
        self.counts: dict[int, int] = {}     # how often each token was drawn (the penalties)
        self.top_logprobs = params.logprobs  # None: no logprobs
        self.last: Drawn | None = None       # the last token's logprob and alternatives (when asked for)
        self.greedy = params.temperature < GREEDY_BELOW
        self.temperature = params.temperature
        self.top_k = params.top_k
        self.top_p = params.top_p
        self.min_p = params.min_p
        # vLLM's ignore_eos, min_tokens and repetition_penalty: None (nothing per token) unless asked for
        self.extra = Extensions.of(params, eos, prompt)
        self.gen: torch.Generator | None = None
        if not self.greedy:
            self.gen = torch.Generator(device=device)
            if params.seed is not None:
                self.gen.manual_seed(params.seed)
            else:
                self.gen.seed()
        # nothing but an argmax: sample_rows does these rows together
        self.plain = (self.greedy and grammar is None and not self.bias and not self.presence
                      and not self.frequency and self.top_logprobs is None and self.extra is None)

    def __call__(self, logits: torch.Tensor) -> int:
        """The next token from one row of logits (1-D)."""
        if self.grammar is not None and self.top_logprobs is None and (tok := self.grammar.forced()) is not None:
            # fixed text (a forced call's wrapper): nothing to draw, if the model may write it at all
            if not tok < logits.shape[-1] or float(logits[tok]) == float("-inf"):
                raise no_token_allowed()
            self.grammar.accept(tok)
            if self.presence or self.frequency:
                self.counts[tok] = self.counts.get(tok, 0) + 1
            if self.extra is not None:
                self.extra.drawn(tok)
            return tok
        if self.bias or self.presence or self.frequency:
            logits = self._adjusted(logits)
        if self.extra is not None:
            logits = self.extra.adjust(logits)
        if self.grammar is not None:
            logits = self.grammar.mask(logits)
        tok = self._draw(logits)
        if self.extra is not None:
            self.extra.drawn(tok)
        if self.grammar is not None:
            self.grammar.accept(tok)
        if self.top_logprobs is not None:
            self.last = self._logprobs(logits, tok)
        if self.presence or self.frequency:
            self.counts[tok] = self.counts.get(tok, 0) + 1
        return tok

    def _logprobs(self, logits: torch.Tensor, tok: int) -> Drawn:
        lp = torch.log_softmax(logits.float(), dim=-1)
        top: tuple[tuple[int, float], ...] = ()
        if self.top_logprobs:
            vals, ids = torch.topk(lp, min(self.top_logprobs, lp.numel()))
            top = tuple(zip(ids.tolist(), vals.tolist(), strict=True))
        return tok, float(lp[tok]), top

    def _adjusted(self, logits: torch.Tensor) -> torch.Tensor:
        """logit_bias added, presence and frequency penalties subtracted (OpenAI's
        definition, over the tokens generated so far); ids outside the vocabulary ignored.
        Two index_add_ per step, not a Python loop per entry (300 entries, every token, on
        the model thread every row shares)."""
        logits = logits.float().clone()
        if self.bias:
            if self._bias_ids is None or self._bias_values is None:
                n = logits.shape[-1]
                kept = [(tok, b) for tok, b in self.bias if 0 <= tok < n]
                self._bias_ids = torch.tensor([t for t, _ in kept], dtype=torch.long, device=logits.device)
                self._bias_values = torch.tensor([b for _, b in kept], dtype=torch.float32, device=logits.device)
            logits.index_add_(0, self._bias_ids, self._bias_values)
        if self.counts:
            ids = torch.tensor(list(self.counts), dtype=torch.long, device=logits.device)
            drawn = torch.tensor(list(self.counts.values()), dtype=torch.float32, device=logits.device)
            logits.index_add_(0, ids, drawn * -self.frequency - self.presence)
        return logits

    def _draw(self, logits: torch.Tensor) -> int:
        """One token; ApiError when the row has no valid choice (nothing allowed, or logits
        that are not numbers): the caller fails this row alone."""
        logits = logits.float()
        top = float(logits.max())
        if top == float("-inf"):
            raise no_token_allowed()
        if not math.isfinite(top):
            raise invalid_distribution(f"maximum logit {top}")
        if self.greedy:
            return int(torch.argmax(logits))
        # shifted by the maximum first: every value <= 0, so dividing by a small temperature
        # goes to -inf at worst, never to inf - inf = NaN
        logits = (logits - top) / self.temperature
        if self.top_k is not None and self.top_k < logits.numel():
            kth = torch.topk(logits, self.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if not bool(torch.isfinite(probs).all()):
            raise invalid_distribution("not finite")
        if self.top_p is not None and self.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            # Drop a token when the tokens before it already cover top_p (keeps >= 1).
            before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
            sorted_probs = sorted_probs.masked_fill(before >= self.top_p, 0.0)
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        if self.min_p:           # vLLM's: below min_p x the most likely token's probability is out
            probs = probs.masked_fill(probs < self.min_p * probs.max(), 0.0)
        return int(torch.multinomial(probs, 1, generator=self.gen))


class Extensions:
    """vLLM's ignore_eos, min_tokens and repetition_penalty for one sequence, as vLLM applies
    them: EOS masked out for good (ignore_eos), EOS and stop_token_ids masked until min_tokens
    tokens were drawn; a token seen in the prompt or the output has a positive logit divided
    by the penalty and a negative one multiplied by it."""

    __slots__ = ("always", "until", "min_tokens", "count", "penalty", "seen", "_prompt")

    def __init__(self, params: SamplingParams, eos: frozenset[int], prompt: Any) -> None:
        self.always = sorted(eos) if params.ignore_eos else []
        self.until = sorted(eos | set(params.stop_token_ids)) if params.min_tokens else []
        self.min_tokens = params.min_tokens
        self.count = 0                   # tokens drawn so far
        self.penalty = params.repetition_penalty
        self.seen: torch.Tensor | None = None   # [V] bool: seen in prompt or output (made at the first step)
        self._prompt = prompt if self.penalty != 1.0 else ()

    @classmethod
    def of(cls, params: SamplingParams, eos: frozenset[int], prompt: Any) -> Extensions | None:
        if params.ignore_eos or params.min_tokens or params.repetition_penalty != 1.0:
            return cls(params, eos, prompt)
        return None

    def adjust(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.float().clone()
        n = logits.shape[-1]
        if self.penalty != 1.0:
            if self.seen is None:
                self.seen = torch.zeros(n, dtype=torch.bool, device=logits.device)
                ids = torch.as_tensor(self._prompt, dtype=torch.long).reshape(-1).to(logits.device)
                self.seen[ids[(ids >= 0) & (ids < n)]] = True
                self._prompt = ()
            penalised = torch.where(logits > 0, logits / self.penalty, logits * self.penalty)
            logits = torch.where(self.seen, penalised, logits)
        held = self.always + self.until if self.count < self.min_tokens else self.always
        if held:
            logits[[t for t in held if t < n]] = float("-inf")
        return logits

    def drawn(self, tok: int) -> None:
        self.count += 1
        if self.seen is not None and 0 <= tok < self.seen.shape[0]:
            self.seen[tok] = True


# A row's next token, or why that row cannot go on (the scheduler fails it alone).
Choice = int | Exception


def sample_rows(logits: torch.Tensor, samplers: Sequence[Sampler]) -> list[Choice]:
    """The next token of every row of `logits` ([B, V]), row i by samplers[i]; a row whose
    sampler raises gets its exception in its place, the others their tokens."""
    greedy = [i for i, s in enumerate(samplers) if s.plain]
    out: list[Choice] = [0] * len(samplers)
    if greedy:
        picks = torch.argmax(logits[greedy] if len(greedy) < len(samplers) else logits, dim=-1).tolist()
        for i, t in zip(greedy, picks, strict=True):
            out[i] = t
    for i, s in enumerate(samplers):
        if not s.plain:
            try:
                out[i] = s(logits[i])
            except Exception as exc:     # this row's failure, not the batch's
                out[i] = exc
    return out
