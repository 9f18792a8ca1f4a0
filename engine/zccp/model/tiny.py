"""A tiny decoder-only transformer with deterministic random weights.

It exists to exercise the whole pipeline (shared-memory prompt views, prefill,
KV-cached decoding, sampling, streaming, cancellation) with a real model's shape
and cost profile, without downloading weights. Same seed -> bit-identical weights;
same weights + prompt + sampling params (+ seed) -> identical tokens (for a fixed
torch thread count, since float reductions depend on it).

Architecture: byte embedding, n_layers pre-norm blocks (RMSNorm -> causal
multi-head self-attention with rotary position embeddings -> residual; RMSNorm ->
GELU MLP -> residual), final RMSNorm, output head (untied by default; tying it to
the embedding, TinyConfig.tie_embeddings=True, makes greedy output one repeated byte).

Output restriction: logits of everything but printable ASCII (32..126), newline
(10) and EOS are masked to -inf, and EOS gets a fixed additive bias
(TinyConfig.eos_bias, default DEFAULT_EOS_BIAS). With random weights greedy
decoding quickly falls into a cycle; whether EOS wins somewhere on the way is
decided by the prompt, so some prompts end after a handful of tokens and others
run to max_tokens. The default was chosen empirically (see DEFAULT_EOS_BIAS).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from zccp.config import ModelConfig
from zccp.model.base import ModelBackend
from zccp.model.tokenizer import EOS, VOCAB_SIZE
from zccp.request import SamplingParams

# EOS's raw logit is pinned at 0 (its head column is zero), so its final logit is
# exactly eos_bias and the model stops as soon as no allowed token's raw logit
# beats it. Raw logits of the default model have a std of ~2.7 over the vocabulary
# and a max of ~5-9. Measured on 20 short chat prompts (greedy, max_tokens=64,
# default config): 3.0 -> all run to 64; 4.0 -> 18/20 run to 64; 4.5 -> 10/20 end
# after 2..37 tokens, 10/20 run to 64; 5.0 -> all end within 35; 6.0 -> most end
# after 0-2 tokens. 4.5 gives both outcomes; tests/unit/test_tiny_model.py checks
# that both occur and that greedy replies are not empty.
DEFAULT_EOS_BIAS = 4.5

_ROPE_BASE = 10000.0
_NORM_EPS = 1e-6


_M = ModelConfig   # the defaults a user gets are config.yaml's, defined once there


@dataclass(frozen=True)
class TinyConfig:
    name: str = _M.name
    d_model: int = _M.d_model
    n_layers: int = _M.n_layers
    n_heads: int = _M.n_heads
    d_ff: int = _M.d_ff
    max_context: int = _M.max_context
    seed: int = _M.seed
    prefill_chunk: int = _M.prefill_chunk   # 0 = whole prompt in one pass
    tie_embeddings: bool = False    # tied: greedy degenerates to one repeated byte
    eos_bias: float = DEFAULT_EOS_BIAS
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError("d_model must be divisible by n_heads")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError("head dim (d_model / n_heads) must be even for rotary embeddings")
        for f in ("d_model", "n_layers", "n_heads", "d_ff", "max_context"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1")
        if self.prefill_chunk < 0:
            raise ValueError("prefill_chunk must be >= 0")


def allowed_token_ids() -> list[int]:
    """The ids TinyTransformer can emit: printable ASCII, newline and EOS."""
    return [10, *range(32, 127), EOS]


class _Layer:
    __slots__ = ("attn_norm", "wqkv", "wo", "mlp_norm", "w1", "w2")

    def __init__(self, **kw: torch.Tensor) -> None:
        for k, v in kw.items():
            setattr(self, k, v)


class TinyTransformer(ModelBackend):
    def __init__(self, config: TinyConfig | None = None) -> None:
        self.config = cfg = config or TinyConfig()
        self.name = cfg.name
        self.max_context = cfg.max_context
        self.prefill_chunk = cfg.prefill_chunk
        self._device = torch.device(cfg.device)
        self._n_heads = cfg.n_heads
        self._head_dim = cfg.d_model // cfg.n_heads

        # Weights are drawn on the CPU from a private generator (bit-identical for a
        # seed on any machine), then moved to the target device.
        g = torch.Generator(device="cpu").manual_seed(cfg.seed)
        d, f = cfg.d_model, cfg.d_ff

        def normal(*shape: int, std: float) -> torch.Tensor:
            return (torch.randn(*shape, generator=g, dtype=torch.float32) * std).to(self._device)

        def ones(n: int) -> torch.Tensor:
            return torch.ones(n, dtype=torch.float32, device=self._device)

        # Variance-preserving init (std 1/sqrt(fan_in)) so the blocks actually shape
        # the output instead of the residual stream being just the input embedding.
        self._embed = normal(VOCAB_SIZE, d, std=1.0)
        self._layers = [
            _Layer(
                attn_norm=ones(d),
                wqkv=normal(d, 3 * d, std=1 / math.sqrt(d)),
                wo=normal(d, d, std=1 / math.sqrt(d)),
                mlp_norm=ones(d),
                w1=normal(d, f, std=1 / math.sqrt(d)),
                w2=normal(f, d, std=1 / math.sqrt(f)),
            )
            for _ in range(cfg.n_layers)
        ]
        self._final_norm = ones(d)
        # logits = norm(h) @ head; scaled so raw logits have a std of ~2-3.
        head = self._embed.t() if cfg.tie_embeddings else normal(VOCAB_SIZE, d, std=1.0).t()
        self._head = (head * (2.5 / math.sqrt(d))).contiguous()
        # EOS's raw logit is pinned at 0 (zero head column), so its final logit is
        # exactly eos_bias: the model stops when no allowed token beats eos_bias.
        self._head[:, EOS] = 0.0

        # Rotary tables for every position (max_context x head_dim/2).
        hd = self._head_dim
        inv_freq = 1.0 / (_ROPE_BASE ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        angles = torch.outer(torch.arange(cfg.max_context, dtype=torch.float64), inv_freq)
        self._cos = angles.cos().to(torch.float32).to(self._device)
        self._sin = angles.sin().to(torch.float32).to(self._device)

        # Additive logit offset: -inf outside the allowed set, +eos_bias on EOS.
        offset = torch.full((VOCAB_SIZE,), float("-inf"), dtype=torch.float32)
        offset[allowed_token_ids()] = 0.0
        offset[EOS] = cfg.eos_bias
        self._logit_offset = offset.to(self._device)

    # ------------------------------------------------------------------ interface

    @property
    def device(self) -> torch.device:
        return self._device

    def to(self, device: torch.device | str) -> "TinyTransformer":
        """Move every weight/table to `device` (in place); returns self.

        Weights stay bit-identical (they are drawn on the CPU at construction).
        """
        dev = torch.device(device)
        self._embed = self._embed.to(dev)
        self._final_norm = self._final_norm.to(dev)
        self._head = self._head.to(dev)
        self._cos = self._cos.to(dev)
        self._sin = self._sin.to(dev)
        self._logit_offset = self._logit_offset.to(dev)
        for layer in self._layers:
            for k in _Layer.__slots__:
                setattr(layer, k, getattr(layer, k).to(dev))
        self._device = dev
        return self

    def weights(self) -> dict[str, torch.Tensor]:
        """All parameter tensors by name (for tests and inspection)."""
        out = {"embed": self._embed, "final_norm": self._final_norm, "head": self._head}
        for i, layer in enumerate(self._layers):
            for k in _Layer.__slots__:
                out[f"layers.{i}.{k}"] = getattr(layer, k)
        return out

    def generate(
        self,
        input_ids: torch.Tensor,
        params: SamplingParams,
        cancelled: Callable[[], bool],
    ) -> Iterator[int]:
        """Validate eagerly (ValueError here, not on first next()), then stream tokens.

        The prompt is copied (to int64 on the model's device) before this returns, so
        the caller's shared-memory view is never referenced afterwards.
        """
        ids = self._check_prompt(input_ids)
        if params.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {params.max_tokens}")
        if ids.numel() + params.max_tokens > self.max_context:
            raise ValueError(
                f"prompt ({ids.numel()} tokens) + max_tokens ({params.max_tokens}) exceeds "
                f"the model's context of {self.max_context} tokens"
            )
        _check_sampling(params)
        return self._generate(ids, params, cancelled)

    @torch.inference_mode()
    def prefill_logits(self, input_ids: torch.Tensor, chunk: int = 0) -> torch.Tensor:
        """Raw logits (before masking/bias) at the last prompt position.

        chunk > 0 feeds the prompt through the KV cache `chunk` tokens at a time.
        """
        ids = self._check_prompt(input_ids)
        cache = self._new_cache(ids.numel())
        return self._prefill(ids, cache, chunk).clone()

    # ------------------------------------------------------------------ internals

    def _check_prompt(self, input_ids: torch.Tensor) -> torch.Tensor:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 1:
            raise ValueError("input_ids must be a 1-D tensor")
        n = input_ids.numel()
        if n == 0:
            raise ValueError("input_ids is empty")
        if n > self.max_context:
            raise ValueError(f"prompt ({n} tokens) exceeds the model's context of {self.max_context}")
        ids = input_ids.to(device=self._device, dtype=torch.long, copy=True)
        lo, hi = torch.aminmax(ids)
        if int(lo) < 0 or int(hi) >= VOCAB_SIZE:
            raise ValueError(f"input_ids must be in [0, {VOCAB_SIZE}), got [{int(lo)}, {int(hi)}]")
        return ids

    def _new_cache(self, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = (self._n_heads, length, self._head_dim)
        return [
            (
                torch.empty(shape, dtype=torch.float32, device=self._device),
                torch.empty(shape, dtype=torch.float32, device=self._device),
            )
            for _ in self._layers
        ]

    def _rope(self, x: torch.Tensor, start: int) -> torch.Tensor:
        # x: (H, T, hd); rotate pairs (first half, second half) by position angles.
        t = x.shape[1]
        cos = self._cos[start : start + t]
        sin = self._sin[start : start + t]
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)

    @staticmethod
    def _rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + _NORM_EPS) * weight

    def _forward(
        self, ids: torch.Tensor, start: int, cache: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """Run ids (positions start..start+T) through the model, filling the cache.

        Returns the raw logits of the last position, shape (VOCAB_SIZE,).
        """
        t = ids.numel()
        end = start + t
        H, hd = self._n_heads, self._head_dim
        h = F.embedding(ids, self._embed)                          # (T, d)
        if t == 1 or start == 0:
            mask, is_causal = None, t > 1
        else:
            mask, is_causal = causal_lower_right(t, end), False
        for layer, (kc, vc) in zip(self._layers, cache):
            x = self._rms_norm(h, layer.attn_norm)
            q, k, v = (x @ layer.wqkv).view(t, 3, H, hd).permute(1, 2, 0, 3)  # each (H, T, hd)
            kc[:, start:end] = self._rope(k, start)
            vc[:, start:end] = v
            q = self._rope(q, start)
            # 4-D (batch of 1): CPU's fused (flash) kernel needs it; without it a
            # long prefill materialises the full T x T score matrix.
            a = F.scaled_dot_product_attention(
                q[None], kc[None, :, :end], vc[None, :, :end], attn_mask=mask, is_causal=is_causal
            )[0]                                                    # (H, T, hd)
            h = h + a.transpose(0, 1).reshape(t, H * hd) @ layer.wo
            x = self._rms_norm(h, layer.mlp_norm)
            h = h + F.gelu(x @ layer.w1) @ layer.w2
        last = self._rms_norm(h[-1], self._final_norm)
        return last @ self._head

    def _prefill(
        self, ids: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]], chunk: int
    ) -> torch.Tensor:
        n = ids.numel()
        if chunk <= 0 or chunk >= n:
            return self._forward(ids, 0, cache)
        logits = None
        for s in range(0, n, chunk):
            logits = self._forward(ids[s : s + chunk], s, cache)
        assert logits is not None
        return logits

    # As a decorator (not a `with` inside the body) so inference mode is entered
    # around each resume of the generator and never leaks into the consumer.
    @torch.inference_mode()
    def _generate(
        self, ids: torch.Tensor, params: SamplingParams, cancelled: Callable[[], bool]
    ) -> Iterator[int]:
        max_tokens = params.max_tokens
        if max_tokens == 0 or cancelled():
            return
        n = ids.numel()
        # The last generated token is never fed back, so n + max_tokens - 1 suffices.
        cache = self._new_cache(n + max_tokens - 1)
        sampler = _Sampler(params, self._device)
        logits = self._prefill(ids, cache, self.prefill_chunk)
        del ids
        pos = n
        produced = 0
        step = torch.empty(1, dtype=torch.long, device=self._device)
        while True:
            if cancelled():
                return
            tok = sampler(logits + self._logit_offset)
            if tok == EOS:
                return
            yield tok
            produced += 1
            if produced >= max_tokens:
                return
            if cancelled():
                return
            step.fill_(tok)
            logits = self._forward(step, pos, cache)
            pos += 1


def _check_sampling(params: SamplingParams) -> None:
    if params.temperature < 0 or not math.isfinite(params.temperature):
        raise ValueError(f"temperature must be a finite number >= 0, got {params.temperature}")
    if params.top_k is not None and params.top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {params.top_k}")
    if params.top_p is not None and not (0.0 < params.top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")


class _Sampler:
    """temperature -> top_k -> top_p -> multinomial; argmax when temperature == 0."""

    def __init__(self, params: SamplingParams, device: torch.device) -> None:
        self.greedy = params.temperature == 0
        self.temperature = params.temperature
        self.top_k = params.top_k
        self.top_p = params.top_p
        self.gen: torch.Generator | None = None
        if not self.greedy:
            self.gen = torch.Generator(device=device)
            if params.seed is not None:
                self.gen.manual_seed(params.seed)
            else:
                self.gen.seed()

    def __call__(self, logits: torch.Tensor) -> int:
        if self.greedy:
            return int(torch.argmax(logits))
        logits = logits / self.temperature
        if self.top_k is not None and self.top_k < logits.numel():
            kth = torch.topk(logits, self.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.top_p is not None and self.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            # Drop a token when the tokens before it already cover top_p (keeps >= 1).
            before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
            sorted_probs = sorted_probs.masked_fill(before >= self.top_p, 0.0)
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        return int(torch.multinomial(probs, 1, generator=self.gen))
