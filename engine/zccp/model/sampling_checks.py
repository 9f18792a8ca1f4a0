"""What sampling needs without torch: the parameters' check and a draw's shape (the null
backend's engine imports these, never zccp.model.sampling and its torch)."""

from __future__ import annotations

import math

from zccp.shared_types import SamplingParams

# (token id, its logprob, ((alternative id, logprob), ...)) for one draw
Drawn = tuple[int, float, tuple[tuple[int, float], ...]]


def check_sampling(params: SamplingParams) -> None:
    """ValueError for parameters no sampler can apply (the API layers refuse them first)."""
    if params.max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {params.max_tokens}")
    if params.temperature < 0 or not math.isfinite(params.temperature):
        raise ValueError(f"temperature must be a finite number >= 0, got {params.temperature}")
    if params.top_k is not None and params.top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {params.top_k}")
    if params.top_p is not None and not (0.0 < params.top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
