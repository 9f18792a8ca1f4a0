"""A backend with no model: it answers every prompt with the same fixed reply.

Used to benchmark the pipeline (nginx, shared memory, parsing, rendering,
streaming) without any model cost. It looks at the prompt's length only (through
the generation loop's usage count), never at its contents.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import torch

from zccp.model.base import ModelBackend
from zccp.request import SamplingParams

DEFAULT_REPLY = "Hello from the ZCCP null backend."


class NullBackend(ModelBackend):
    def __init__(
        self,
        reply: str = DEFAULT_REPLY,
        name: str = "zccp-null",
        max_context: int = 8192,
        token_delay_ms: float = 0.0,
        fail_after: int = -1,
    ) -> None:
        self.name = name
        self.max_context = max_context
        # Simulates a model's per-token time (benchmarks, tests of long requests).
        self.token_delay_s = token_delay_ms / 1000.0
        self.reply = reply
        self._ids: tuple[int, ...] = tuple(reply.encode("utf-8"))
        # Fault injection: raise after this many tokens (-1: never), as a model that
        # fails mid-answer would; the tests drive the engine's failure paths with it.
        self.fail_after = fail_after

    def generate(
        self,
        input_ids: torch.Tensor,
        params: SamplingParams,
        cancelled: Callable[[], bool],
    ) -> Iterator[int]:
        # Slice eagerly: the returned iterator holds no reference to input_ids.
        # Truncation is per byte token, so a short max_tokens may cut a multi-byte
        # character (the generation loop then emits U+FFFD), like any byte model.
        return self._replay(self._ids[: max(params.max_tokens, 0)], cancelled)

    def _replay(self, ids: tuple[int, ...], cancelled: Callable[[], bool]) -> Iterator[int]:
        for n, tok in enumerate(ids):
            if n == self.fail_after:
                raise RuntimeError(f"null backend: injected failure after {n} tokens (model.null_fail_after)")
            if cancelled():
                return
            if self.token_delay_s:
                time.sleep(self.token_delay_s)
            yield tok
