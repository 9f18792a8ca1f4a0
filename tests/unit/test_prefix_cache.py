"""The prefix cache: chained block keys, the last-token rule, the byte bound, LRU order."""

from __future__ import annotations

import numpy as np
import torch

from zccp.prefix_cache import PrefixCache

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
