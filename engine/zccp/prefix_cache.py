"""Prefix reuse: the KV state of recent prompt prefixes, in token blocks (as vLLM's
automatic prefix caching keeps it).

A prompt is cut into blocks of `block` tokens; block i is keyed by a hash chained
from block i-1's key and its own token ids (the first block's parent is the
backend's identity, so two models never share state). A key therefore names the
whole prefix up to the end of its block, and a block's KV state is only ever
reused at the positions it was computed at. Only full blocks are kept.

match() walks a prompt's chain until the first miss, stopping one token short of
the end (the model must compute at least the last prompt token to get logits:
vLLM's max_cache_hit_length = num_tokens - 1). insert() adds the blocks a prefill
computed. LRU, bounded by bytes: a chain is touched tail first, so the least
recently used block of a chain is its tail, and eviction never strands a child
behind an evicted parent longer than it takes to reach it.

Thread: only the model thread uses it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Match:
    blocks: list[torch.Tensor]        # the KV state of the first len(blocks) blocks
    keys: list[bytes]                 # their chain keys

    @property
    def count(self) -> int:
        return len(self.blocks)


class PrefixCache:
    def __init__(self, capacity_bytes: int, block: int, identity: bytes) -> None:
        if block < 1:
            raise ValueError("block must be >= 1")
        self.capacity = capacity_bytes
        self.block = block
        self._root = hashlib.sha256(b"zccp-prefix-v1\0" + identity).digest()
        self._blocks: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self.nbytes = 0
        self.hits = 0                  # blocks served
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def chain(self, ids: np.ndarray, n_blocks: int) -> list[bytes]:
        """The chain keys of the first n_blocks blocks of ids (1-D integer array)."""
        b = self.block
        data = np.ascontiguousarray(ids[: n_blocks * b], dtype="<u4").tobytes()
        keys, parent, width = [], self._root, 4 * b
        for i in range(n_blocks):
            parent = hashlib.sha256(parent + data[i * width:(i + 1) * width]).digest()
            keys.append(parent)
        return keys

    def match(self, ids: np.ndarray) -> Match:
        """The longest cached prefix of ids, at most len(ids) - 1 tokens, block-aligned."""
        if not self._blocks or len(ids) <= self.block:
            return Match([], [])
        keys = self.chain(ids, (len(ids) - 1) // self.block)
        found: list[torch.Tensor] = []
        for k in keys:
            blk = self._blocks.get(k)
            if blk is None:
                break
            found.append(blk)
        keys = keys[: len(found)]
        self._touch(keys)
        self.hits += len(found)
        return Match(found, keys)

    def insert(self, keys: list[bytes], first: int, take: Callable[[int], torch.Tensor | None]) -> int:
        """Keep blocks first..len(keys)-1 (take(i) makes block i's KV state) that are not
        cached yet; returns how many were added."""
        added = 0
        for i in range(first, len(keys)):
            if keys[i] in self._blocks:
                continue
            blk = take(i)
            if blk is None:
                return added
            size = blk.numel() * blk.element_size()
            if size > self.capacity:
                return added
            self._blocks[keys[i]] = blk
            self.nbytes += size
            added += 1
            self._evict()
        self._touch(keys)
        return added

    def held(self, keys: list[bytes]) -> int:
        """How many of the chain's first blocks are cached."""
        n = 0
        for k in keys:
            if k not in self._blocks:
                break
            n += 1
        return n

    def _touch(self, keys: list[bytes]) -> None:
        for k in reversed(keys):           # the head ends up most recent: tails go first
            if k in self._blocks:
                self._blocks.move_to_end(k)

    def _evict(self) -> None:
        while self.nbytes > self.capacity and self._blocks:
            _, blk = self._blocks.popitem(last=False)
            self.nbytes -= blk.numel() * blk.element_size()
            self.evictions += 1

    def clear(self) -> None:
        self._blocks.clear()
        self.nbytes = 0
