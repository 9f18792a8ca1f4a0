"""Cache keys for one request: from what nginx wrote into the slot, or computed here.

nginx fingerprints bodies it can decode cheaply and sets ZCCP_FLAG_FP_VALID; for
the rest (large bodies) the engine runs the same algorithm (zccp.cache.fingerprint,
byte-identical to lua/zccp/fp/fingerprint.lua) over its own parse, with the same mask
patterns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zccp.transport.abi import CSF_BANDS, MINHASH_COUNT, Flag, ffi
from zccp.transport.arena import SlotView
from zccp.cache.fingerprint import compute, decode_request
from zccp.cache.mask_apply import MaskSet, collect_literals
from zccp.cache.mask_store import MaskSource
from zccp.cache.near import TurnUnits
from zccp.cache.scope import Placement, place, tenant_of
from zccp.config import CacheConfig
from zccp.shared_types import GenerationRequest


@dataclass(frozen=True)
class CacheKeys:
    exact: bytes                      # 32-byte exact key (masked request, every parameter)
    prefix: bytes                     # 32-byte prefix key: the request but its final message
    bands: tuple[int, ...]            # 16 LSH band keys ((): near-duplicates not allowed)
    signature: tuple[int, ...]        # 128 MinHash values of the final user turn ((): none)
    masked: bool                      # a mask changed some text
    tenant: bytes | None              # the tenant's digest; None: anonymous
    placement: Placement
    # the values the masks replaced, when the engine masked the body itself (None: not collected)
    literals: tuple[bytes, ...] | None = None
    # the final user turn's units, computed when first needed (zccp.cache.near);
    # None: near candidates cannot be checked, so they are never served
    turn: TurnUnits | None = field(default=None, compare=False)

    @property
    def near_ok(self) -> bool:
        return bool(self.bands) and len(self.signature) == MINHASH_COUNT

    def request_literals(self, doc: dict[str, Any], masks: MaskSet) -> tuple[bytes, ...]:
        """The values this request's masks replaced (doc: the body as parsed, unmasked)."""
        if not self.masked:
            return ()
        if self.literals is not None:
            return self.literals
        return tuple(collect_literals(doc, masks))


def slot_masks(view: SlotView, masks: MaskSource) -> MaskSet | None:
    """The mask set nginx applied to this request (it names it in the slot; the latest one
    when it names none), or None when this engine cannot load it."""
    named = view.header.flags & Flag.MASK_DIGEST
    return masks.get(bytes(ffi.buffer(view.request.mask_digest, 32)).hex() if named else None)


def keys_for(view: SlotView, payload: memoryview, req: GenerationRequest, masks: MaskSource, cfg: CacheConfig,
             doc: dict[str, Any] | None = None) -> CacheKeys | None:
    """None when the body cannot be fingerprinted (then the request is served uncached).

    doc: the body as orjson parsed it (the engine's one parse), reused and masked in place
    when the engine fingerprints the body itself. The keys keep it (`turn`): a near
    candidate is checked against its final user turn."""
    h, meta = view.header, view.meta
    mask_set = slot_masks(view, masks)
    if mask_set is None:
        return None       # nginx applied a mask set this engine cannot load
    tenant = tenant_of(view, req, cfg)
    no_store = bool(h.flags & Flag.NO_STORE)
    if h.flags & Flag.FP_VALID:
        exact = bytes(ffi.buffer(meta.exact_key, 32))
        prefix = bytes(ffi.buffer(view.request.prefix_key, 32))
        masked = bool(h.flags & Flag.MASKED)
        near = bool(h.flags & Flag.FP_COMPLETE)
        bands = tuple(ffi.unpack(meta.csf_bands, CSF_BANDS)) if near else ()
        sig = tuple(ffi.unpack(view.signature.minhash, MINHASH_COUNT)) if near else ()
        if near and doc is None:
            doc = decode_request(req.api, payload)    # nginx decoded it: so can we
        turn = TurnUnits(doc, mask_set) if near else None     # doc unmasked: the turn is masked on demand
        return CacheKeys(exact, prefix, bands, sig, masked, tenant, place(prefix, tenant, masked, cfg.scope, no_store),
                         turn=turn)
    literals: list[bytes] = []
    if doc is None:
        doc = decode_request(req.api, payload)
        if doc is None:
            return None
    fp = compute(req.api, None, mask_set, doc=doc, literals=literals)
    if fp is None:
        return None
    if fp.near and len(fp.signature) != MINHASH_COUNT:
        raise ValueError("fingerprint signature length does not match the ABI")  # programmer error
    return CacheKeys(fp.exact_key, fp.prefix_key, fp.bands, fp.signature, fp.masked, tenant,
                     place(fp.prefix_key, tenant, fp.masked, cfg.scope, no_store), tuple(literals),
                     TurnUnits(doc, None) if fp.near else None)     # compute() masked doc in place
