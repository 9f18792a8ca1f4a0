"""Prefix reuse: the KV state of recent prompt prefixes, in token blocks (as vLLM's
automatic prefix caching keeps it).

A prompt is cut into blocks of `block` tokens; block i is keyed by a hash chained
from block i-1's key and its own token ids (the first block's parent is the
backend's identity, so two models never share state). A key therefore names the
whole prefix up to the end of its block, and a block's KV state is only ever
reused at the positions it was computed at. Only full blocks are kept.

Tenants (docs/cache.md, "The prefix KV cache"): a request's chain is salted with its
tenant, so one tenant never reuses (and so never learns about, through the usage's
cached tokens) another's prompt blocks, as vLLM's cache_salt does. The blocks an operator
warms up (POST /v1/zccp/warmup, on the admin side) are unsalted and marked shared: a
tenant's chain follows the shared chain while its blocks are shared ones, then goes on
salted. A declared common system prompt therefore stays shared, nothing else does.

match() walks a prompt's chain until the first miss, stopping one token short of
the end (the model must compute at least the last prompt token to get logits:
vLLM's max_cache_hit_length = num_tokens - 1). insert() adds the blocks a prefill
computed. LRU, bounded by bytes: a chain is touched tail first, so the least
recently used block of a chain is its tail, and eviction never strands a child
behind an evicted parent longer than it takes to reach it.

Pins (Anthropic's cache_control, zccp.prep.prompt_pins): the blocks of a prefix a request marked
with a breakpoint are pinned for its TTL (5 minutes or 1 hour): LRU eviction passes them by
until the pin expires; reading a pinned block refreshes its pin (Anthropic refreshes an entry
each time it is used). Pinned bytes are capped at PIN_SHARE of the capacity, so ordinary
prefix reuse always keeps the rest: a pin that would go beyond the cap is not granted (its
blocks stay in the cache as ordinary LRU blocks, and `pins_refused` counts it).

Thread: only the model thread uses it.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from zccp.shared_types import CacheWrite, Pin

if TYPE_CHECKING:
    import torch

# The share of the prefix cache's bytes that pinned blocks may hold at most.
PIN_SHARE = 0.5


@dataclass(frozen=True)
class Match:
    blocks: list[torch.Tensor]        # the KV state of the first len(blocks) blocks
    keys: list[bytes]                 # their chain keys

    @property
    def count(self) -> int:
        return len(self.blocks)


class PrefixCache:
    def __init__(self, capacity_bytes: int, block: int, identity: bytes,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if block < 1:
            raise ValueError("block must be >= 1")
        self.capacity = capacity_bytes
        self.pin_capacity = int(capacity_bytes * PIN_SHARE)
        self._clock = clock
        self._pins: dict[bytes, tuple[float, int]] = {}   # key -> (expires at, its TTL in s)
        self.pinned_bytes = 0
        self.pins_refused = 0
        self.block = block
        self._root = hashlib.sha256(b"zccp-prefix-v1\0" + identity).digest()
        self._blocks: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self._shared: set[bytes] = set()   # blocks an operator's warm-up put in: every tenant's
        self.nbytes = 0
        self.hits = 0                  # blocks served
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def chain(self, ids: np.ndarray, n_blocks: int, salt: bytes | None = None) -> list[bytes]:
        """The chain keys of the first n_blocks blocks of ids (1-D integer array). salt: the
        tenant's (its blocks are its own past the shared ones), None: unsalted (a warm-up)."""
        b = self.block
        data = np.ascontiguousarray(ids[: n_blocks * b], dtype="<u4").tobytes()
        keys, parent, width = [], self._root, 4 * b
        shared = True
        for i in range(n_blocks):
            block = data[i * width:(i + 1) * width]
            if salt is not None and shared:
                k = hashlib.sha256(parent + block).digest()
                if k in self._shared:
                    keys.append(k)
                    parent = k
                    continue
                shared = False
                parent = hashlib.sha256(b"zccp-tenant\0" + salt + parent).digest()
            parent = hashlib.sha256(parent + block).digest()
            keys.append(parent)
        return keys

    def match(self, ids: np.ndarray, salt: bytes | None = None) -> Match:
        """The longest cached prefix of ids, at most len(ids) - 1 tokens, block-aligned."""
        if not self._blocks or len(ids) <= self.block:
            return Match([], [])
        keys = self.chain(ids, (len(ids) - 1) // self.block, salt)
        found: list[torch.Tensor] = []
        for k in keys:
            blk = self._blocks.get(k)
            if blk is None:
                break
            found.append(blk)
        keys = keys[: len(found)]
        self._touch(keys)
        self._refresh(keys)
        self.hits += len(found)
        return Match(found, keys)

    def insert(self, keys: list[bytes], first: int, take: Callable[[int], torch.Tensor | None],
               shared: bool = False) -> int:
        """Keep blocks first..len(keys)-1 (take(i) makes block i's KV state) that are not
        cached yet; returns how many were added. shared: an unsalted chain (a warm-up)."""
        added = 0
        for i in range(first, len(keys)):
            if keys[i] in self._blocks:
                if shared:
                    self._shared.add(keys[i])
                continue
            blk = take(i)
            if blk is None:
                return added
            size = blk.numel() * blk.element_size()
            if size > self.capacity:
                return added
            self._blocks[keys[i]] = blk
            if shared:
                self._shared.add(keys[i])
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

    # -- pins (cache_control breakpoints) -----------------------------------------------

    def pin(self, keys: list[bytes], ttl_s: int) -> int:
        """Pin the chain's first blocks (those cached, up to the first that is not) for ttl_s;
        an existing pin is extended, never shortened. Returns how many blocks are pinned now;
        fewer than held() when the pinned bytes would pass pin_capacity."""
        now = self._clock()
        self._expire(now)
        n = 0
        for k in keys:
            blk = self._blocks.get(k)
            if blk is None:
                break
            old = self._pins.get(k)
            if old is None:
                size = blk.numel() * blk.element_size()
                if self.pinned_bytes + size > self.pin_capacity:
                    self.pins_refused += 1
                    break
                self.pinned_bytes += size
                self._pins[k] = (now + ttl_s, ttl_s)
            else:
                ttl = max(old[1], ttl_s)
                self._pins[k] = (max(old[0], now + ttl), ttl)
            n += 1
        return n

    def pinned(self, key: bytes) -> bool:
        pin = self._pins.get(key)
        return pin is not None and pin[0] > self._clock()

    def _refresh(self, keys: list[bytes]) -> None:
        """A read refreshes the pins of the blocks it read, each by its own TTL."""
        if not self._pins:
            return
        now = self._clock()
        for k in keys:
            pin = self._pins.get(k)
            if pin is not None and pin[0] > now:
                self._pins[k] = (now + pin[1], pin[1])

    def _unpin(self, key: bytes) -> None:
        if self._pins.pop(key, None) is not None:
            blk = self._blocks.get(key)
            if blk is not None:
                self.pinned_bytes -= blk.numel() * blk.element_size()

    def _expire(self, now: float) -> None:
        for k in [k for k, (until, _) in self._pins.items() if until <= now]:
            self._unpin(k)

    def _touch(self, keys: list[bytes]) -> None:
        for k in reversed(keys):           # the head ends up most recent: tails go first
            if k in self._blocks:
                self._blocks.move_to_end(k)

    def _evict(self) -> None:
        if self.nbytes <= self.capacity:
            return
        if self._pins:
            self._expire(self._clock())
        skipped = 0                        # live pins passed by (moved to the recent end)
        while self.nbytes > self.capacity and len(self._blocks) > skipped:
            k = next(iter(self._blocks))
            if k in self._pins:
                self._blocks.move_to_end(k)
                skipped += 1
                continue
            blk = self._blocks.pop(k)
            self._shared.discard(k)
            self.nbytes -= blk.numel() * blk.element_size()
            self.evictions += 1

    def clear(self) -> None:
        self._blocks.clear()
        self._shared.clear()
        self._pins.clear()
        self.nbytes = 0
        self.pinned_bytes = 0


def cache_write(pins: tuple[Pin, ...], reused: int, block: int) -> CacheWrite:
    """Anthropic's cache_creation for one call: the prompt tokens past what it read from the
    cache (`reused`) up to its furthest breakpoint (block-aligned: only full blocks are
    kept), split by TTL: up to the furthest 1-hour breakpoint they count as 1 hour, the rest
    up to the furthest one as 5 minutes (1-hour breakpoints come first: the API checks)."""
    if not pins:
        return CacheWrite()
    far = max(p.tokens for p in pins) // block * block
    far_long = max((p.tokens for p in pins if p.ttl_s > 300), default=0) // block * block
    total = max(0, far - reused)
    long = min(total, max(0, far_long - reused))
    return CacheWrite(short=total - long, long=long)
