"""The model an upstream engine names: no weights, no model thread work. The flow sends
its misses to zccp.upstream.client instead (FlowDeps.upstream); this backend only gives
the engine its name, its byte prompt format (a slot's prompt_len, count_tokens) and a
context the gateway does not bound (the upstream does)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zccp.model.null import NullBackend

if TYPE_CHECKING:
    import numpy as np
    import torch


class UpstreamBackend(NullBackend):
    def __init__(self, name: str = "upstream") -> None:
        super().__init__(name=name, max_context=1 << 30)

    def prefill(self, state: object, ids: torch.Tensor | np.ndarray) -> int:
        raise RuntimeError("an upstream backend runs no model: the flow forwards its requests")
