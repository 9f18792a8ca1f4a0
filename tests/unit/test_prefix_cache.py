"""The prefix cache: chained block keys, the last-token rule, the byte bound, LRU order."""

from __future__ import annotations

import numpy as np
import torch

from zccp.serving.prefix_cache import PrefixCache

B = 4


def block(value: float) -> torch.Tensor:
    return torch.full((2, 2, 1, B, 2), value)              # [layers, k/v, heads, block, dim]: 128 bytes


def fill(cache: PrefixCache, ids: np.ndarray, first: int = 0) -> list[bytes]:
    keys = cache.chain(ids, len(ids) // B)
    cache.insert(keys, first, lambda i: block(float(i)))
    return keys


def test_a_key_names_the_whole_prefix():
    c = PrefixCache(1 << 20, B, b"model-a")
    a = np.arange(12, dtype=np.int32)
    b = a.copy()
    b[1] = 99                                               # differs in block 0 only
    ka, kb = c.chain(a, 3), c.chain(b, 3)
    assert all(x != y for x, y in zip(ka, kb, strict=True))              # every later block differs too
    assert PrefixCache(1 << 20, B, b"model-b").chain(a, 3) != ka


def test_match_stops_one_token_short_and_at_the_first_miss():
    c = PrefixCache(1 << 20, B, b"m")
    ids = np.arange(12, dtype=np.int32)
    fill(c, ids)
    assert len(c) == 3
    assert c.match(ids).count == 2                          # 12 tokens: at most 11 reusable -> 2 blocks
    assert c.match(np.arange(13, dtype=np.int32)).count == 3
    other = np.arange(13, dtype=np.int32)
    other[5] = 77                                           # block 1 differs
    m = c.match(other)
    assert m.count == 1 and torch.equal(m.blocks[0], block(0.0))


def test_bounded_by_bytes_and_tails_go_first():
    size = block(0).numel() * 4
    c = PrefixCache(3 * size, B, b"m")
    old = np.arange(100, 112, dtype=np.int32)
    fill(c, old)
    new = np.arange(200, 208, dtype=np.int32)
    fill(c, new)                                            # 5 blocks wanted, room for 3
    assert c.nbytes <= 3 * size and len(c) == 3
    assert c.held(c.chain(new, 2)) == 2                     # the newest chain is whole
    assert c.held(c.chain(old, 3)) == 1                     # the old chain lost its tail, kept its head
    c.match(np.arange(100, 113, dtype=np.int32))            # touching it protects it
    fill(c, np.arange(300, 304, dtype=np.int32))
    assert c.held(c.chain(old, 1)) == 1 and c.evictions >= 3


def test_insert_keeps_only_new_blocks():
    c = PrefixCache(1 << 20, B, b"m")
    ids = np.arange(16, dtype=np.int32)
    keys = fill(c, ids)
    made = []
    c.insert(keys, 0, lambda i: made.append(i) or block(9.0))
    assert made == [] and len(c) == 4


def test_a_tenants_chain_is_salted_and_follows_only_shared_blocks():
    """Tenants never reuse each other's blocks (the usage's cached tokens would tell them what
    another sent); the blocks a warm-up put in (salt None) are everyone's, as far as they go."""
    c = PrefixCache(1 << 20, B, b"m")
    ids = np.arange(13, dtype=np.int32)
    alice = c.chain(ids, 3, b"alice")
    c.insert(alice, 0, lambda i: block(float(i)))
    assert c.match(ids, b"alice").count == 3
    assert c.match(ids, b"mallory").count == 0
    assert c.match(ids, None).count == 0                   # nor the unsalted (shared) chain
    # a warm-up of the first 2 blocks: shared by every tenant, and the chain goes on salted
    warm = c.chain(ids[:8], 2, None)
    c.insert(warm, 0, lambda i: block(10.0 + i), shared=True)
    assert c.match(ids, b"mallory").count == 2
    m = c.chain(ids, 3, b"mallory")
    assert m[:2] == warm and m[2] not in alice            # past the shared part: mallory's own
    assert c.match(ids, b"alice").count == 2               # alice too now follows the shared blocks first


# -- pins (cache_control) ------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_pinned_prefix_outlives_lru_until_its_ttl():
    size = block(0).numel() * 4
    clock = Clock()
    c = PrefixCache(4 * size, B, b"m", clock=clock)        # pins may hold 2 blocks
    pinned = np.arange(100, 108, dtype=np.int32)
    keys = fill(c, pinned)
    assert c.pin(keys, 300) == 2 and c.pinned_bytes == 2 * size
    for start in range(200, 260, 8):                       # 14 blocks of traffic through 4 blocks' room
        fill(c, np.arange(start, start + 8, dtype=np.int32))
    assert c.held(keys) == 2                               # LRU passed the pinned blocks by
    assert c.nbytes <= 4 * size
    clock.t += 301                                         # the pin expired: ordinary LRU again
    for start in range(300, 340, 8):
        fill(c, np.arange(start, start + 8, dtype=np.int32))
    assert c.held(keys) == 0 and c.pinned_bytes == 0


def test_a_read_refreshes_a_pin_and_a_longer_ttl_wins():
    size = block(0).numel() * 4
    clock = Clock()
    c = PrefixCache(4 * size, B, b"m", clock=clock)
    ids = np.arange(100, 109, dtype=np.int32)
    keys = fill(c, ids[:8])
    c.pin(keys, 300)
    clock.t += 200
    assert c.match(ids).count == 2                          # read at t+200: pinned until t+500
    clock.t += 200
    assert c.pinned(keys[0]) and c.pinned(keys[1])
    c.pin(keys[:1], 3600)                                   # a 1-hour breakpoint on the first block
    clock.t += 400
    assert c.pinned(keys[0]) and not c.pinned(keys[1])


def test_pinned_bytes_are_capped_and_beyond_the_cap_a_pin_is_refused():
    size = block(0).numel() * 4
    c = PrefixCache(4 * size, B, b"m", clock=Clock())      # cap: 2 blocks
    keys = fill(c, np.arange(100, 112, dtype=np.int32))     # 3 blocks
    assert c.pin(keys, 300) == 2 and c.pins_refused == 1
    assert c.pinned_bytes == 2 * size <= c.pin_capacity
    assert c.held(keys) == 3                                # the refused block stays an ordinary one


def test_clear_drops_pins():
    c = PrefixCache(1 << 20, B, b"m", clock=Clock())
    keys = fill(c, np.arange(8, dtype=np.int32))
    c.pin(keys, 300)
    c.clear()
    assert c.pinned_bytes == 0 and not c.pinned(keys[0])


def test_cache_write_counts_the_tokens_past_the_read_up_to_the_furthest_breakpoint():
    from zccp.serving.prefix_cache import cache_write
    from zccp.shared_types import Pin

    assert cache_write((), 0, B).total == 0
    w = cache_write((Pin(10, 300),), 0, B)                  # block-aligned: 8 tokens
    assert (w.short, w.long) == (8, 0)
    w = cache_write((Pin(9, 3600), Pin(21, 300)), 0, B)    # 1h up to 8, 5m from 8 to 20
    assert (w.short, w.long) == (12, 8)
    w = cache_write((Pin(9, 3600), Pin(21, 300)), 12, B)   # read 12: the 1h part was read
    assert (w.short, w.long) == (8, 0)
    assert cache_write((Pin(9, 300),), 16, B).total == 0   # read past the breakpoint: nothing written
