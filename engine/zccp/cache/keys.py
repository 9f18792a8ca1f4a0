"""Cache keys for one request: from what nginx wrote into the slot, or computed here.

nginx fingerprints bodies it can decode cheaply and sets ZCCP_FLAG_FP_VALID; for
the rest (large bodies) the engine runs the same algorithm (zccp.cache.fingerprint,
byte-identical to lua/zccp/fingerprint.lua) over the payload in place, with the
same mask patterns.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from zccp.abi import CSF_BANDS, MINHASH_COUNT, Flag, ffi
from zccp.arena import SlotView
from zccp.cache.fingerprint import compute
from zccp.cache.masks import MaskSource
from zccp.request import GenerationRequest


@dataclass(frozen=True)
class CacheKeys:
    exact: bytes                      # 32-byte exact key (masked request, every parameter)
    scope: bytes                      # 32-byte digest of the parameters, prompt excluded
    bands: tuple[int, ...]            # 16 LSH band keys ((): near-duplicates not allowed)
    signature: tuple[int, ...]        # 128 MinHash values ((): none)

    @property
    def near_ok(self) -> bool:
        return bool(self.bands) and len(self.signature) == MINHASH_COUNT


def scope_key(req: GenerationRequest, masked_system: bytes | None = None) -> bytes:
    """Every output-relevant parameter except the conversation, canonically.

    The system prompt is part of the scope: a near-duplicate is a similar conversation
    under the same instructions, never similar text under other ones. Pass it masked
    (as the exact key sees it), so a timestamp in it does not defeat near hits."""
    s = req.sampling
    system = masked_system if masked_system is not None else req.system.encode()
    doc = {"api": req.api, "model": req.model, "system": system.decode("utf-8", "replace"), "max_tokens": s.max_tokens, "temperature": s.temperature,
           "top_p": s.top_p, "top_k": s.top_k, "seed": s.seed, "stop": list(s.stop),
           "extra": req.scope_extra.decode()}
    return hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).digest()


def keys_for(view: SlotView, payload: memoryview, req: GenerationRequest, masks: MaskSource,
             doc: dict[str, Any] | None = None) -> CacheKeys | None:
    """None when the body cannot be fingerprinted (then the request is served uncached).

    doc: the body as orjson parsed it (the engine's one parse), reused and masked in place."""
    h, meta = view.header, view.meta
    mask_set = masks.get(bytes(ffi.buffer(view.request.mask_digest, 32)).hex() if h.flags & Flag.MASK_DIGEST else None)
    if mask_set is None:
        return None       # nginx applied a mask set this engine cannot load
    system = req.system.encode("utf-8", "surrogatepass")
    scope = scope_key(req, mask_set.apply(system) if system else system)
    if h.flags & Flag.FP_VALID:
        exact = bytes(ffi.buffer(meta.exact_key, 32))
        complete = bool(h.flags & Flag.FP_COMPLETE)
        bands = tuple(ffi.unpack(meta.csf_bands, CSF_BANDS)) if complete else ()
        sig = tuple(ffi.unpack(view.signature.minhash, MINHASH_COUNT)) if complete else ()
        return CacheKeys(exact, scope, bands, sig)
    fp = compute(req.api, payload, mask_set, doc=doc)
    if fp is None:
        return None
    if len(fp.signature) != MINHASH_COUNT:
        raise ValueError("fingerprint signature length does not match the ABI")  # programmer error
    if fp.complete:
        return CacheKeys(fp.exact_key, scope, fp.bands, fp.signature)
    return CacheKeys(fp.exact_key, scope, (), ())
