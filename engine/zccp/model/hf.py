"""The hf backend: a causal language model from a local checkpoint directory.

model.path names a directory holding config.json, *.safetensors and a fast tokenizer
(tokenizer.json, tokenizer_config.json, a chat template). It is loaded with
transformers (AutoModelForCausalLM, sdpa attention) and tokenizers, offline only:
HF_HUB_OFFLINE is set and every load passes local_files_only, so nothing is ever
fetched; a missing file is a start-up error that names it (checkpoint_problems, which
`zccp-engine --check` runs too). Install with `pip install -e .[hf]`.

KV state: a transformers DynamicCache per sequence; the decode batch is one
DynamicCache whose layers hold every row, left-padded (zccp.model.kv), decoded with
a 2-D attention mask and each row's own position ids; each layer grows into spare
room (zccp.model.kv.GrowingKv) instead of torch.cat-ing itself every step. Tested with
transformers 5.24 (the pinned extra); the forward's cache argument was renamed
past_key_values -> cache within 5.x, so it is looked up once from the signature.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from zccp.model.checkpoint import checkpoint_problems
from zccp.model.grammar import GrammarVocab
from zccp.model.hf_prompt import HfChatFormat
from zccp.model.kv import GrowingKv, RaggedPrefill, TorchBackend

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class HfBackend(TorchBackend):
    def __init__(self, path: str, name: str, dtype: str = "auto", max_context: int = 8192,
                 prefill_chunk: int = 0, device: str = "cpu") -> None:
        problems = checkpoint_problems(path)
        if problems:
            raise ValueError("model.path: " + "; ".join(problems))
        os.environ.setdefault("HF_HUB_OFFLINE", "1")          # before transformers is imported
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer

        transformers.utils.logging.disable_progress_bar()
        self.name = name
        self.prefill_chunk = prefill_chunk
        self._device = torch.device(device)
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        if not getattr(tok, "is_fast", False):
            raise ValueError(f"model.path: {path}: the tokenizer is not a fast (tokenizers) tokenizer")
        torch_dtype: Any = self._dtype(dtype)
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, dtype=torch_dtype, attn_implementation="sdpa")
        self.model = loaded.to(self._device).eval()
        self.config = self.model.config
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_last = "logits_to_keep" in params
        self.vocab_size = int(self.model.get_input_embeddings().num_embeddings)
        self.eos_ids = self._eos_ids(tok)
        text_cfg = self.config.get_text_config() if hasattr(self.config, "get_text_config") else self.config
        limit = getattr(text_cfg, "max_position_embeddings", None) or max_context
        self.max_context = min(max_context, int(limit))
        self._hidden_size = int(getattr(text_cfg, "hidden_size", 0))
        self._ffn_size = int(getattr(text_cfg, "intermediate_size", 0))
        self.prompt = HfChatFormat(tok, name)
        self._tokenizer = tok
        self.dtype = self.model.dtype
        self._identity = repr(("hf", str(Path(path).resolve()), str(self.dtype))).encode()
        self._check_cache_layers()
        self._layer_cls = _growing_layer_class()
        self._kv_bytes = self._measure_kv_bytes()

    def _make_grammar_vocab(self) -> GrammarVocab:
        return GrammarVocab.from_hf(self._tokenizer, self.vocab_size, sorted(self.eos_ids))

    def _dtype(self, name: str) -> Any:
        if name in DTYPES:
            return DTYPES[name]
        # auto: the checkpoint's own dtype on a GPU; float32 on the CPU, where bf16/fp16
        # matmuls are slow or unsupported on most cores.
        return "auto" if self._device.type == "cuda" else torch.float32

    def _eos_ids(self, tok: Any) -> frozenset[int]:
        ids: set[int] = set()
        gen = getattr(self.model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None) if gen is not None else None
        for e in [*(eos if isinstance(eos, (list, tuple)) else [eos]), tok.eos_token_id]:   # eos may be a tuple
            if isinstance(e, int):
                ids.add(e)
        return frozenset(ids)

    def _check_cache_layers(self) -> None:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        kinds = {type(layer).__name__ for layer in DynamicCache(config=self.config).layers}
        if kinds - {DynamicLayer.__name__}:
            raise ValueError(f"model.path: layers of kind {sorted(kinds)} (sliding-window attention) are "
                             "not supported by the batched decoder; only full-attention models are")

    @torch.inference_mode()
    def _measure_kv_bytes(self) -> int:
        state = self.new_state()
        self.prefill(state, torch.zeros(1, dtype=torch.long, device=self._device))
        return sum(lay.keys.numel() * lay.keys.element_size() + lay.values.numel() * lay.values.element_size()
                   for lay in state.layers)

    # -- the backend interface ---------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def kv_bytes_per_token(self) -> int:
        return self._kv_bytes

    @property
    def activation_bytes_per_token(self) -> int:
        size = torch.finfo(self.dtype).bits // 8 if self.dtype.is_floating_point else 4
        return size * (8 * self._hidden_size + 3 * self._ffn_size)

    @property
    def identity(self) -> bytes:
        return self._identity

    def to(self, device: torch.device | str) -> HfBackend:
        self._device = torch.device(device)
        self.model.to(self._device)
        return self

    def state_from_layers(self, layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        from transformers import DynamicCache

        cache = DynamicCache(config=self.config)
        ours: list[Any] = [self._layer_cls() for _ in cache.layers]     # full attention only (checked at load)
        for layer, (k, v) in zip(ours, layers, strict=False):
            layer.update(k, v)
        cache.layers = ours
        return cache

    def state_length(self, state: Any) -> int:
        return int(state.get_seq_length())

    @torch.inference_mode()
    def prefill(self, state: Any, ids: torch.Tensor) -> torch.Tensor:
        extra = {"logits_to_keep": 1} if self._keep_last else {}
        out = self.model(input_ids=ids.view(1, -1), use_cache=True, **{self._cache_kw: state}, **extra)
        return out.logits[0, -1].float()

    @torch.inference_mode()
    def prefill_many(self, states: Sequence[Any], chunks: Sequence[torch.Tensor]) -> list[torch.Tensor | int]:
        """The chunks of several sequences in ONE forward (zccp.model.kv.RaggedPrefill);
        each row's new KV columns are then appended to its own state."""
        if len(states) == 1:
            return [self.prefill(states[0], chunks[0])]
        pasts = [self.state_length(s) for s in states]
        batch = RaggedPrefill.build(pasts, chunks, self._device)
        holder = self.state_from_layers(RaggedPrefill.padded_past([s.layers for s in states], pasts))
        extra = {"logits_to_keep": 1} if self._keep_last else {}
        out = self.model(input_ids=batch.ids, attention_mask=batch.mask, position_ids=batch.positions,
                         use_cache=True, **{self._cache_kw: holder}, **extra)
        for i, state in enumerate(states):
            cols = batch.new_columns(i)
            for mine, whole in zip(state.layers, holder.layers, strict=True):
                mine.update(whole.keys[i : i + 1, :, cols], whole.values[i : i + 1, :, cols])
        logits = out.logits[:, -1].float()
        return list(logits.unbind(0))

    @torch.inference_mode()
    def decode_step(self, holder: Any, ids: torch.Tensor, mask: torch.Tensor | None,
                    positions: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         **{self._cache_kw: holder})
        return out.logits[:, -1].float()


def _growing_layer_class() -> type:
    """transformers' DynamicLayer whose update() appends into spare room (GrowingKv)
    instead of torch.cat-ing the whole layer every step; nothing else changes."""
    from transformers.cache_utils import DynamicLayer

    class GrowingDynamicLayer(GrowingKv, DynamicLayer):
        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            return self.append(key_states, value_states)

    return GrowingDynamicLayer
