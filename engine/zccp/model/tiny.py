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
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from zccp.config import ModelConfig
from zccp.model.kv import KvLayer, TorchBackend
from zccp.model.grammar import GrammarVocab
from zccp.model.tokenizer import EOS, SPECIAL_IDS, VOCAB_SIZE

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
    prefill_chunk: int = _M.prefill_chunk   # 0: the planner decides (zccp.serving.planner)
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
    attn_norm: torch.Tensor
    wqkv: torch.Tensor
    wo: torch.Tensor
    mlp_norm: torch.Tensor
    w1: torch.Tensor
    w2: torch.Tensor

    def __init__(self, **kw: torch.Tensor) -> None:
        for k, v in kw.items():
            setattr(self, k, v)


class TinyTransformer(TorchBackend):
    def __init__(self, config: TinyConfig | None = None) -> None:
        self.config = cfg = config or TinyConfig()
        self.name = cfg.name
        self.max_context = cfg.max_context
        self.prefill_chunk = cfg.prefill_chunk
        self.vocab_size = VOCAB_SIZE
        self.eos_ids = frozenset({EOS})
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

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.config.n_layers * self.config.d_model * 4       # float32 keys + values

    @property
    def activation_bytes_per_token(self) -> int:
        c = self.config
        return 4 * (6 * c.d_model + 2 * c.d_ff)

    @property
    def identity(self) -> bytes:
        return repr(("tiny", self.config)).encode()

    def _make_grammar_vocab(self) -> GrammarVocab:
        tokens = [bytes([i]) for i in range(256)] + [b""] * (VOCAB_SIZE - 256)
        return GrammarVocab.from_bytes(tokens, VOCAB_SIZE, [EOS], SPECIAL_IDS)

    def process_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits + self._logit_offset

    # ------------------------------------------------------------------ KV state

    def state_from_layers(self, layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> _State:
        if not layers:
            empty = (1, self._n_heads, 0, self._head_dim)
            layers = [(torch.empty(empty, device=self._device), torch.empty(empty, device=self._device))
                      for _ in self._layers]
        return _State([KvLayer(k, v) for k, v in layers])

    def state_length(self, state: _State) -> int:
        keys = state.layers[0].keys
        assert keys is not None       # a state is made from tensors
        return int(keys.shape[2])

    # ------------------------------------------------------------------ forward

    @torch.inference_mode()
    def prefill(self, state: _State, ids: torch.Tensor) -> torch.Tensor:
        start = self.state_length(state)
        t = ids.numel()
        end = start + t
        if end > self.max_context:
            raise ValueError(f"{end} positions exceed the model's context of {self.max_context}")
        if t == 1 or start == 0:
            mask, is_causal = None, t > 1
        else:
            mask, is_causal = _causal_lower_right(t, end), False
        cos, sin = self._cos[start:end], self._sin[start:end]
        h = self._blocks(ids.view(1, t), cos, sin, state.layers, mask, is_causal)
        return self._rms_norm(h[0, -1], self._final_norm) @ self._head

    @torch.inference_mode()
    def decode_step(self, holder: _State, ids: torch.Tensor, mask: torch.Tensor | None,
                    positions: torch.Tensor) -> torch.Tensor:
        if int(positions.max()) >= self.max_context:
            raise ValueError(f"a row reached the model's context of {self.max_context}")
        cos = self._cos[positions].unsqueeze(1)                      # (B, 1, 1, hd/2)
        sin = self._sin[positions].unsqueeze(1)
        attn = None if mask is None else mask.bool()[:, None, None, :]
        h = self._blocks(ids, cos, sin, holder.layers, attn, False)
        return self._rms_norm(h[:, -1], self._final_norm) @ self._head

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: (B, H, T, hd); rotate pairs (first half, second half) by position angles.
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)

    @staticmethod
    def _rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + _NORM_EPS) * weight

    def _blocks(self, ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layers: list[KvLayer],
                mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
        """ids (B, T) through every block, appending their keys/values to `layers`;
        the final hidden states (B, T, d)."""
        b, t = ids.shape
        H, hd = self._n_heads, self._head_dim
        h = F.embedding(ids, self._embed)                                # (B, T, d)
        for layer, kv in zip(self._layers, layers, strict=False):
            x = self._rms_norm(h, layer.attn_norm)
            q, k, v = (x @ layer.wqkv).view(b, t, 3, H, hd).permute(2, 0, 3, 1, 4)   # each (B, H, T, hd)
            keys, values = kv.append(self._rope(k, cos, sin), v)
            a = F.scaled_dot_product_attention(self._rope(q, cos, sin), keys, values,
                                               attn_mask=mask, is_causal=is_causal)    # (B, H, T, hd)
            h = h + a.transpose(1, 2).reshape(b, t, H * hd) @ layer.wo
            x = self._rms_norm(h, layer.mlp_norm)
            h = h + F.gelu(x @ layer.w1) @ layer.w2
        return h


def _causal_lower_right(t: int, end: int) -> torch.Tensor:
    """The mask of t new queries after end - t cached positions: query i sees keys up to
    end - t + i. Written out: torch.nn.attention.bias imports torch._dynamo (~3 s of start)."""
    return torch.ones(t, end, dtype=torch.bool).tril(end - t)


class _State:
    """One sequence's KV state: a KvLayer per block, (1, H, length, hd)."""

    __slots__ = ("layers",)

    def __init__(self, layers: list[KvLayer]) -> None:
        self.layers = layers


