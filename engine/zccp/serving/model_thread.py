"""The model thread as an engine builds it: the batch scheduler (zccp.serving.scheduler) with
the bounds the model section sets."""

from __future__ import annotations

import logging

from zccp.config import ConfigError, ModelConfig
from zccp.model.base import ModelBackend
from zccp.observe.metrics import EngineMetrics
from zccp.serving.planner import Planner
from zccp.serving.prefix_cache import PrefixCache
from zccp.serving.scheduler import BatchLimits, BatchScheduler

log = logging.getLogger("zccp.engine")


def model_thread(m: ModelConfig, backend: ModelBackend, metrics: EngineMetrics) -> BatchScheduler:
    """The batch scheduler with its bounds: model.kv_cache_mb (a prompt + answer longer
    than fits alone is refused as too long: max_context shrinks to it), the prefill
    planner, and the prefix cache (model.prefix_cache_mb; backends that can reuse blocks)."""
    kv_budget = m.kv_cache_mb << 20
    per_token = backend.kv_bytes_per_token
    if per_token:
        fit = (kv_budget // per_token - 16) * 8 // 9          # the longest row, with its spare room
        if fit < 64:
            raise ConfigError(f"model.kv_cache_mb: {m.kv_cache_mb} MiB holds {fit} tokens of this model's KV "
                              f"state ({per_token} bytes each); raise it")
        if fit < backend.max_context:
            log.info("model.kv_cache_mb holds %d tokens: max_context %d -> %d", fit, backend.max_context, fit)
            backend.max_context = fit
    prefix = None
    if m.prefix_cache_mb and backend.prefix_blocks:
        prefix = PrefixCache(m.prefix_cache_mb << 20, m.prefix_block, backend.identity)
    planner = Planner(backend.device if backend.uses_torch else None, kv_budget,
                      backend.activation_bytes_per_token + per_token,
                      m.prefill_chunk, m.prefix_block, m.step_tokens)
    return BatchScheduler(backend, BatchLimits(m.max_batch, m.max_queue, kv_budget), planner, prefix, metrics)
