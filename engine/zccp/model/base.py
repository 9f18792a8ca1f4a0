"""The one interface every model backend implements.

A backend turns prompt token ids into generated token ids, one at a time, so the
generation loop (zccp.generation) can stream, stop on stop sequences and cancel.
Input ids arrive as a 1-D int32 torch tensor that is a zero-copy view of the
slot's token array in shared memory (or a device view of it on the GPU): a
backend must not keep a reference to it after generate() returns.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator

import torch

from zccp.request import SamplingParams


class ModelBackend(ABC):
    name: str            # served model name, e.g. "zccp-tiny"
    max_context: int     # prompt + completion tokens the backend accepts

    @abstractmethod
    def generate(
        self,
        input_ids: torch.Tensor,
        params: SamplingParams,
        cancelled: Callable[[], bool],
    ) -> Iterator[int]:
        """Yield generated token ids until EOS (not yielded), params.max_tokens, or cancelled()."""

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")
