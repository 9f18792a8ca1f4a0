"""The fingerprint's constants, from their one source: lua/zccp/fp/tables.lua (read by
nginx as Lua, here with the literal reader) and, for the signature's shape, the ABI
header (the slot holds the signature and the band keys)."""

from __future__ import annotations

from zccp.transport.abi import CSF_BANDS, MINHASH_COUNT
from zccp.config.lua_data import load_lua_data
from zccp.config.paths import lua_file

_T = load_lua_data(lua_file("fp/tables.lua"))

VERSION: int = _T["version"]
MAX_TOKENS: int = _T["max_tokens"]               # the CSF reads at most this many prompt tokens
DECODE_LIMIT: int = _T["decode_limit"]           # nginx fingerprints bodies up to this size
SEED: int = (_T["seed_hi"] << 32) | _T["seed_lo"]     # the shingle mixer's key, the probe table's seed
MAX_DEPTH: int = _T["max_depth"]                 # deeper JSON: no fingerprint (cjson's limit)
EXACT_PREFIX: bytes = _T["exact_prefix"]         # first bytes hashed for the exact key
PREFIX_PREFIX: bytes = _T["prefix_prefix"]       # first bytes hashed for the prefix key
TURN_KEYS: frozenset[str] = frozenset(k.decode() for k in _T["turn_keys"])   # a near-able final turn's members
TEXT_BLOCK_KEYS: frozenset[str] = frozenset(k.decode() for k in _T["text_block_keys"])
EXCLUDED_KEYS: frozenset[str] = frozenset(k.decode() for k in _T["excluded_keys"])
MASKED_KEYS: frozenset[str] = frozenset(k.decode() for k in _T["masked_keys"])
RANGES: list[tuple[int, int, bytes]] = [tuple(r) for r in _T["ranges"]]   # (lo, hi, b"S" | b"C")

NUM_PERM: int = MINHASH_COUNT                    # MinHash bins
BANDS: int = CSF_BANDS
ROWS: int = NUM_PERM // BANDS
BIN_BITS: int = NUM_PERM.bit_length() - 1
if BANDS * ROWS != NUM_PERM:  # pragma: no cover - an ABI edit that breaks the banding
    raise ImportError("ZCCP_MINHASH_COUNT must be a multiple of ZCCP_CSF_BANDS")
if 1 << BIN_BITS != NUM_PERM or NUM_PERM > 256:  # pragma: no cover - the bins are the mix's top bits
    raise ImportError("ZCCP_MINHASH_COUNT must be a power of two <= 256")
