"""KV state shared by the torch backends: a left-padded batch, and prefix blocks.

A sequence's KV state is a list of layers, each with `keys` and `values` tensors of
shape [1, heads, length, head_dim] (transformers' DynamicLayer has exactly these two
attributes; the tiny model uses KvLayer). A decode batch keeps every running sequence
in ONE tensor per layer, [rows, heads, T, head_dim], right-aligned: row i's real
tokens are its last lengths[i] columns, the columns before them are padding that the
attention mask hides. Joining pads whichever side is shorter; leaving selects the
kept rows and trims the leading columns no row uses any more. The copies happen on
join and leave only, never per step (measured: bench/RESULTS.md, research note).

Prefix blocks (zccp.serving.prefix_cache) are the KV state of `block` consecutive prompt
tokens: one tensor [layers, 2, heads, block, head_dim], cloned out of a sequence.
Keys are stored after the rotary embedding, so a block is only valid at the absolute
positions it was computed at; the chained block hash guarantees that.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from zccp.model.base import DecodeBatch, ModelBackend
from zccp.serving.planner import room


class Layer(Protocol):
    keys: torch.Tensor
    values: torch.Tensor


class GrowingKv:
    """keys/values ([B, H, n, D]) as views into buffers with room to grow. Assigning keys or
    values (join, leave, park) replaces the buffer; append() writes into the spare room and
    grows it by an eighth when it runs out. Memory: at most n * 9/8 + 16 columns."""

    _kbuf: torch.Tensor | None = None
    _vbuf: torch.Tensor | None = None
    _n = 0

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._kbuf is None else self._kbuf[:, :, : self._n]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self._kbuf = value if value is not None and value.dim() == 4 else None
        self._n = 0 if self._kbuf is None else self._kbuf.shape[2]

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._vbuf is None else self._vbuf[:, :, : self._n]

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._vbuf = value if value is not None and value.dim() == 4 else None

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n, t = self._n, k.shape[2]
        if self._kbuf is None or self._vbuf is None or self._kbuf.shape[2] < n + t:
            cap = room(n + t)
            kbuf = k.new_empty((k.shape[0], k.shape[1], cap, k.shape[3]))
            vbuf = v.new_empty((v.shape[0], v.shape[1], cap, v.shape[3]))
            if n:
                assert self._kbuf is not None and self._vbuf is not None   # n > 0: they hold n positions
                kbuf[:, :, :n] = self._kbuf[:, :, :n]
                vbuf[:, :, :n] = self._vbuf[:, :, :n]
            self._kbuf, self._vbuf = kbuf, vbuf
        self._kbuf[:, :, n : n + t] = k
        self._vbuf[:, :, n : n + t] = v
        self._n = n + t
        return self._kbuf[:, :, : self._n], self._vbuf[:, :, : self._n]

    @property
    def capacity_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in (self._kbuf, self._vbuf) if b is not None)


class KvLayer(GrowingKv):
    """One layer's KV state for backends without a cache class of their own."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys = keys
        self.values = values


def _lpad(x: torch.Tensor, n: int) -> torch.Tensor:
    return F.pad(x, (0, 0, n, 0)) if n else x


def take_block(layers: Sequence[Layer], start: int, end: int) -> torch.Tensor:
    """Positions [start, end) of a single sequence's KV state, as one new tensor."""
    return torch.stack([torch.stack((lay.keys[0, :, start:end], lay.values[0, :, start:end])) for lay in layers])


def join_blocks(blocks: Sequence[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive blocks back into per-layer (keys, values), each [1, heads, n, head_dim]."""
    whole = blocks[0] if len(blocks) == 1 else torch.cat(list(blocks), dim=3)   # [L, 2, H, n, D]
    return [(whole[i, 0].unsqueeze(0).contiguous(), whole[i, 1].unsqueeze(0).contiguous())
            for i in range(whole.shape[0])]


@dataclass
class RaggedPrefill:
    """One forward over the next prompt chunks of several sequences (zccp.model.hf).

    Row i's past (pasts[i] tokens of KV) is right-aligned in the first P = max(pasts)
    columns of the KV, its chunk right-aligned in the L = max(chunk) new ones, so every
    row's last real token is the last column (one logits row each) and the padding in
    front of a past or a chunk is hidden by the 2-D mask; positions count each row's own
    tokens. new_columns(i) is where row i's chunk lands in the forward's KV."""

    ids: torch.Tensor                 # [B, L]
    mask: torch.Tensor                # [B, P + L]
    positions: torch.Tensor           # [B, L]
    pasts: list[int]
    lengths: list[int]                # each chunk's tokens

    @classmethod
    def build(cls, pasts: Sequence[int], chunks: Sequence[torch.Tensor], device: torch.device) -> RaggedPrefill:
        lengths = [int(c.numel()) for c in chunks]
        rows, width, past = len(chunks), max(lengths), max(pasts)
        ids = torch.zeros((rows, width), dtype=torch.long, device=device)
        positions = torch.zeros((rows, width), dtype=torch.long, device=device)
        mask = torch.zeros((rows, past + width), dtype=torch.long, device=device)
        for i, (p, n, chunk) in enumerate(zip(pasts, lengths, chunks, strict=True)):
            ids[i, width - n:] = chunk
            positions[i, width - n:] = torch.arange(p, p + n, device=device)
            mask[i, past - p: past] = 1
            mask[i, past + width - n:] = 1
        return cls(ids, mask, positions, list(pasts), lengths)

    def new_columns(self, row: int) -> slice:
        return slice(self.mask.shape[1] - self.lengths[row], None)

    @staticmethod
    def padded_past(states: Sequence[Sequence[Layer]], pasts: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every row's past KV, left-padded to the longest, per layer ([] when none has one)."""
        past = max(pasts)
        if not past:
            return []
        out = []
        for layer in range(len(states[0])):
            ks = [_lpad(s[layer].keys, past - p) if p else None for s, p in zip(states, pasts, strict=True)]
            vs = [_lpad(s[layer].values, past - p) if p else None for s, p in zip(states, pasts, strict=True)]
            like = next(k for k in ks if k is not None)
            zero = like.new_zeros((1, like.shape[1], past, like.shape[3]))
            out.append((torch.cat([zero if k is None else k for k in ks]),
                        torch.cat([zero if v is None else v for v in vs])))
        return out


class PaddedBatch:
    """The running sequences' KV state, one left-padded tensor per layer.

    `holder` is whatever object owns the layers for the backend's forward (a
    transformers DynamicCache, or the tiny model's own state); the batch adopts the
    first joining sequence's holder and merges later ones into its layers."""

    def __init__(self, bytes_per_token: int) -> None:
        self.bytes_per_token = bytes_per_token
        self.holder: Any = None
        self.layers: list[Any] = []
        self.lengths: list[int] = []          # real tokens per row = the row's next position
        self.width = 0                        # T: columns per row, padding included

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def nbytes(self) -> int:
        """Bytes its KV tensors hold, spare room included."""
        if self.layers and hasattr(self.layers[0], "capacity_bytes"):
            return sum(lay.capacity_bytes for lay in self.layers)
        return self.rows * self.width * self.bytes_per_token

    @property
    def padded(self) -> bool:
        return bool(self.lengths) and min(self.lengths) < self.width

    def join(self, holder: Any, layers: Sequence[Layer], n: int) -> None:
        """Append a sequence whose KV state (length n, batch of 1) is `layers`."""
        if not self.lengths:
            self.holder, self.layers = holder, list(layers)
            self.lengths, self.width = [n], n
            return
        width = max(self.width, n)
        for bl, nl in zip(self.layers, layers, strict=False):
            k, v = bl.keys, bl.values          # read both before assigning either (GrowingKv)
            bl.keys, bl.values = (torch.cat((_lpad(k, width - self.width), _lpad(nl.keys, width - n)), 0),
                                  torch.cat((_lpad(v, width - self.width), _lpad(nl.values, width - n)), 0))
        self.lengths.append(n)
        self.width = width

    def leave(self, keep: Sequence[int]) -> None:
        """Keep only rows `keep` (in that order), and drop the columns nobody needs."""
        if not keep:
            self.holder, self.layers, self.lengths, self.width = None, [], [], 0
            return
        if list(keep) != list(range(self.rows)):
            idx = torch.tensor(list(keep), device=self.layers[0].keys.device)
            for lay in self.layers:
                lay.keys, lay.values = lay.keys.index_select(0, idx), lay.values.index_select(0, idx)
            self.lengths = [self.lengths[i] for i in keep]
        lead = self.width - max(self.lengths)
        if lead:
            for lay in self.layers:
                lay.keys, lay.values = lay.keys[:, :, lead:], lay.values[:, :, lead:]
            self.width -= lead

    def row_state(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row `row`'s KV state without its padding, as new tensors (to park it)."""
        start = self.width - self.lengths[row]
        return [(lay.keys[row : row + 1, :, start:].clone(), lay.values[row : row + 1, :, start:].clone())
                for lay in self.layers]

    def step_inputs(self, device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(attention mask [B, T+1] or None when no row is padded, position ids [B, 1])
        for one decode step; call advance() after the forward."""
        pos = torch.tensor(self.lengths, device=device).unsqueeze(1)
        if not self.padded:
            return None, pos
        cols = torch.arange(self.width + 1, device=device).unsqueeze(0)
        starts = torch.tensor([self.width - n for n in self.lengths], device=device).unsqueeze(1)
        return (cols >= starts).long(), pos

    def advance(self) -> None:
        """The forward appended one column to every row."""
        self.lengths = [n + 1 for n in self.lengths]
        self.width += 1


class TorchBatch(DecodeBatch):
    """A PaddedBatch decoded by a TorchBackend's forward."""

    def __init__(self, backend: TorchBackend) -> None:
        self._backend = backend
        self._kv = PaddedBatch(backend.kv_bytes_per_token)

    @property
    def rows(self) -> int:
        return self._kv.rows

    @property
    def nbytes(self) -> int:
        return self._kv.nbytes

    def join(self, state: Any) -> None:
        self._kv.join(state, state.layers, self._backend.state_length(state))

    def leave(self, keep: Sequence[int]) -> None:
        self._kv.leave(keep)

    def park(self, row: int) -> Any:
        return self._backend.state_from_layers(self._kv.row_state(row))

    def decode(self, tokens: Sequence[int]) -> torch.Tensor:
        device = self._backend.device
        mask, pos = self._kv.step_inputs(device)
        ids = torch.tensor(list(tokens), dtype=torch.long, device=device).unsqueeze(1)
        logits = self._backend.decode_step(self._kv.holder, ids, mask, pos)
        self._kv.advance()
        return logits


class TorchBackend(ModelBackend):
    """A backend whose KV state is a list of layers with keys/values (see the top)."""

    prefix_blocks = True

    def new_state(self, blocks: Sequence[torch.Tensor] = ()) -> Any:
        return self.state_from_layers(join_blocks(blocks) if blocks else [])

    def new_batch(self) -> DecodeBatch:
        return TorchBatch(self)

    def take_block(self, state: Any, start: int, end: int) -> torch.Tensor | None:
        return take_block(state.layers, start, end)

    @abstractmethod
    def state_from_layers(self, layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        """A sequence state holding these per-layer (keys, values), [1, H, n, D] each
        (empty: a new sequence)."""

    @abstractmethod
    def decode_step(self, holder: Any, ids: torch.Tensor, mask: torch.Tensor | None,
                    positions: torch.Tensor) -> torch.Tensor:
        """One forward of ids [B, 1] at `positions` [B, 1] over the batch's KV state
        (`holder`, whose layers gain one column); mask [B, T+1] (None: no padding).
        Returns the raw logits [B, vocab]."""
