"""Cache keys for one request: from what nginx wrote into the slot, or computed here.

nginx fingerprints bodies it can decode cheaply and sets ZCCP_FLAG_FP_VALID; for
the rest (large bodies) the engine runs the same algorithm (zccp.fingerprint,
byte-identical to lua/zccp/fingerprint.lua) over the payload in place, with the
same mask patterns file, re-read when it changes.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from zccp.abi import CSF_BANDS, MINHASH_COUNT, Flag, ffi
from zccp.arena import SlotView
from zccp.cache import CacheKeys, scope_key
from zccp.fingerprint import compute
from zccp.masks import MaskSet, default_patterns_path, load_masks
from zccp.request import GenerationRequest

log = logging.getLogger("zccp.cache_keys")


class MaskSource:
    """The operator's mask patterns, re-read (at most once a second) when the file changes."""

    CHECK_EVERY_S = 1.0

    def __init__(self, path: Path | None = None, last_good: Path | None = None) -> None:
        self.path = path or default_patterns_path()
        self.last_good = last_good
        self._mtime = 0.0
        self._checked = 0.0
        self._masks: MaskSet = self._load()

    def _load(self) -> MaskSet:
        try:
            self._mtime = os.stat(self.path).st_mtime
        except OSError:
            self._mtime = 0.0
        masks = load_masks(self.path, self.last_good)
        for name, err in masks.errors:
            log.error("mask pattern %s not applied: %s", name, err)
        return masks

    def get(self) -> MaskSet:
        now = time.monotonic()
        if now - self._checked >= self.CHECK_EVERY_S:
            self._checked = now
            try:
                changed = os.stat(self.path).st_mtime != self._mtime
            except OSError:
                changed = False
            if changed:
                self._masks = self._load()
                log.info("mask patterns reloaded from %s", self.path)
        return self._masks


def keys_for(view: SlotView, payload: memoryview, req: GenerationRequest, masks: MaskSource,
             doc: dict[str, Any] | None = None) -> CacheKeys | None:
    """None when the body cannot be fingerprinted (then the request is served uncached).

    doc: the body as orjson parsed it (the engine's one parse), reused and masked in place."""
    h, meta = view.header, view.meta
    mask_set = masks.get()
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
