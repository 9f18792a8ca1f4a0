"""The prefill plan (the design's "context sharding"): how many prompt tokens one
forward may take, from the memory there is.

On a GPU the chunk is sized from the device's free memory now
(torch.cuda.mem_get_info: half of what is free), on the CPU from model.kv_cache_mb
(an eighth of it: prefill activations live beside the KV cache the bound is for).
A configured model.prefill_chunk caps it, and so does the per-step token budget
(model.step_tokens, vLLM's max_num_batched_tokens). The chunk is also one step's tokens:
each step decodes every running row first, one token each, and its prefill takes what
they leave of the chunk (at least one chunk's forward, so a waiting prompt always
advances); a long prompt is spread over several steps, each of which still decodes the
running streams. A prompt alone in the model (nothing decodes, nothing else waits) is not
cut by the step budget: there is no stream to keep smooth, and a cut would only add a
forward to its first token. Chunks are a multiple of the prefix block,
so a prompt prefilled on top of reused blocks computes the same chunks as one that
is not (zccp.model.base.ModelBackend.prefill_chunked). The plan a request got is
X-ZCCP-Plan (meta.plan_chunks: 0 = one pass).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


# Activation bytes per token are an estimate; never plan chunks below this.
MIN_CHUNK = 64
MAX_CHUNK = 1 << 15
# Prompt tokens (padding included) that one CPU forward of several sequences' chunks aims
# at: a CPU forward of a few hundred tokens already runs its matmuls at full speed (groups
# of 2-8 short prompts gain most, one of 16 loses: bench/peer.md, "Batched prefill (branch hf-batch)"), and a
# bigger group holds back every row's first token until the whole group is done.
CPU_GROUP_TOKENS = 256
# The per-step token budget when model.step_tokens is 0. On a GPU a forward costs about the
# same up to a few thousand tokens (vLLM's online-serving default is 2,048); on a CPU its
# time grows with its tokens from a few dozen on, so a step stays within a decode step or
# two of the running rows only when its prefill share is small (bench/chunked_prefill.md).
GPU_STEP_TOKENS = 2048
CPU_STEP_TOKENS = 256


def room(need: int) -> int:
    """Columns to allocate for `need`: some spare, so that appending a token copies one
    column instead of the whole cache (torch.cat would copy it all, every step)."""
    return need + max(16, need // 8)


@dataclass(frozen=True)
class Planner:
    device: torch.device | None   # None: a backend without torch (the CPU)
    kv_budget_bytes: int
    bytes_per_token: int      # activations + KV of one prefill token (the backend's estimate)
    configured: int           # model.prefill_chunk: 0 = no cap
    block: int                # chunks are a multiple of this
    step_tokens: int = 0      # model.step_tokens: decode rows + prefill tokens per step; 0: sized for the device

    @property
    def step_budget(self) -> int:
        """model.step_tokens, or the device's default: the cap chunk() puts on a step's tokens."""
        if self.step_tokens:
            return self.step_tokens
        return GPU_STEP_TOKENS if self.device is not None and self.device.type == "cuda" else CPU_STEP_TOKENS

    def chunk(self, alone: bool = False) -> int:
        """Prompt tokens per prefill forward now. alone: the prompt is all the model has to do
        (no row decodes, none waits): the step budget does not cut it, there is no stream its
        forward could stall (memory still does)."""
        if self.device is not None and self.device.type == "cuda":
            import torch

            free, _ = torch.cuda.mem_get_info(self.device)
            budget = free // 2
        else:
            budget = self.kv_budget_bytes // 8
        tokens = budget // max(self.bytes_per_token, 1)
        tokens = max(MIN_CHUNK, min(MAX_CHUNK, tokens))
        if self.configured:
            tokens = min(tokens, self.configured)
        # the step budget caps the chunk itself, not what the decode rows leave of it: the
        # chunks' boundaries do not move with the number of running rows
        if not alone:
            tokens = min(tokens, self.step_budget)
        return max(self.block, tokens // self.block * self.block)

    @staticmethod
    def prefill_budget(chunk: int, decoding: int) -> int:
        """Prompt tokens this step's prefill may take beside `decoding` running rows: what they
        leave of the step's tokens, the chunk (chunk() is within both the memory plan and the
        step budget), and at least one (the first chunk always runs: no prompt starves)."""
        return max(1, chunk - decoding)

    def group(self, chunk: int) -> int:
        """Padded prompt tokens to put into one forward of several sequences' chunks: the
        whole chunk on a GPU (more rows keep it busy), at most CPU_GROUP_TOKENS on the CPU."""
        return chunk if self.device is not None and self.device.type == "cuda" else min(chunk, CPU_GROUP_TOKENS)

    @staticmethod
    def group_rows(rows: list[tuple[int, int]], cap: int) -> list[int]:
        """Which of the waiting sequences' next chunks, rows[i] = (tokens already in its KV,
        chunk tokens), share one forward: the first always, then each later one (in order,
        skipping those that do not fit) while the rows padded to the longest chunk stay within
        `cap` tokens and are at most half padding, and the padding of the pasts to the longest
        (the forward's KV) stays within the padded chunks (one long reused prefix is not copied
        for every short prompt)."""
        picked: list[int] = []
        width = real = past = past_sum = 0
        for i, (p, n) in enumerate(rows):
            k, w, top = len(picked) + 1, max(width, n), max(past, p)
            if picked and (k * w > cap or k * w > 2 * (real + n) or k * top - past_sum - p > k * w):
                continue
            picked.append(i)
            width, real, past, past_sum = w, real + n, top, past_sum + p
        return picked

    @staticmethod
    def chunk_end(pos: int, end: int, chunk: int) -> int:
        """Where the chunk that starts at absolute position `pos` ends: the next multiple
        of `chunk` (0: one pass), at most `end`."""
        return end if chunk <= 0 else min(end, (pos // chunk + 1) * chunk)

    @staticmethod
    def chunks(start: int, end: int, chunk: int) -> int:
        """Forwards to prefill positions [start, end) in chunks at multiples of `chunk`
        (0: it is one pass)."""
        if end - start <= 0:
            return 0
        n = (end - 1) // chunk - start // chunk + 1
        return n if n > 1 else 0
