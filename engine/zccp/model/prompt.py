"""A backend's tokenizer and chat template: request -> token ids -> text.

Each backend brings one PromptFormat: it writes a request's prompt ids into the
slot's token array (where the model reads them), counts them without writing
(count_tokens), and makes the incremental detokenizer that turns generated ids back
into text. The built-in models share ByteFormat (zccp.model.tokenizer's byte ids);
the hf backend has its checkpoint's own (zccp.model.hf_prompt).
"""

from __future__ import annotations

import codecs
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

import numpy as np

from zccp.model.tokenizer import (count_chat_tokens, count_text_tokens, encode_chat_into, encode_chat_into_host,
                                   encode_text_into)
from zccp.shared_types import ChatInput, GenerationRequest

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Prompt:
    """What a format encodes: the parsed request, and its conversation in chat-template
    shape, built only when a format asks for it (the byte format never does)."""

    req: GenerationRequest
    chat: Callable[[], ChatInput]


class Detokenizer(Protocol):
    def step(self, token: int) -> str:
        """Text that token completes ("" while a character is still incomplete)."""

    def flush(self) -> str:
        """What is still held back, at the end of the generation."""


class PromptFormat(ABC):
    @abstractmethod
    def encode_into(self, prompt: Prompt, out: torch.Tensor, generation_prompt: bool = True) -> int:
        """Write the prompt's ids into out[0:n] (a 1-D int32 view of the slot) and return n.

        Raises PromptTooLong when it does not fit, ApiError for content the model
        cannot take. Without the generation prompt the ids are a prefix of every
        longer conversation that starts the same way (a warm-up's prefix)."""

    def encode_into_slot(self, prompt: Prompt, out: torch.Tensor, host: np.ndarray) -> int:
        """encode_into for the slot's token array, given both as the torch view and as the
        numpy view of the same memory (a format that writes with numpy skips the torch one)."""
        return self.encode_into(prompt, out)

    @abstractmethod
    def count(self, prompt: Prompt) -> int:
        """How many ids encode_into() would write (generation prompt included)."""

    def token_bytes(self, token: int) -> bytes:
        """One id's bytes, as logprobs name the token (b"" for an id that carries no text)."""
        return b""

    @abstractmethod
    def detokenizer(self, prompt_ids: Sequence[int]) -> Detokenizer:
        """A fresh incremental detokenizer; prompt_ids: the prompt's last few ids
        (tokenizers that merge a leading space need the context)."""


_ASCII = tuple(chr(i) for i in range(128))


class _Utf8Bytes:
    """Byte ids 0..255 -> UTF-8 text, never half a character; other ids carry no text."""

    __slots__ = ("_dec", "_one")

    def __init__(self) -> None:
        self._dec = cast(codecs.BufferedIncrementalDecoder, codecs.getincrementaldecoder("utf-8")(errors="replace"))
        self._one = bytearray(1)

    def step(self, token: int) -> str:
        if not 0 <= token < 256:
            return ""
        if token < 0x80 and not self._dec.buffer:   # ASCII between whole characters: itself, no decoder call
            return _ASCII[token]
        self._one[0] = token
        return self._dec.decode(self._one)

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


class ByteFormat(PromptFormat):
    """The built-in models' byte tokenizer and role markers (zccp.model.tokenizer).

    Non-text content blocks reach these models as "[type]" markers (the API layers
    write them); tools are not part of their prompt."""

    def encode_into(self, prompt: Prompt, out: torch.Tensor, generation_prompt: bool = True) -> int:
        if prompt.req.prompt_text is not None:        # /v1/completions: the text as is
            return encode_text_into(prompt.req.prompt_text, out)
        return encode_chat_into(prompt.req.system, prompt.req.messages, out, generation_prompt)

    def encode_into_slot(self, prompt: Prompt, out: torch.Tensor, host: np.ndarray) -> int:
        if prompt.req.prompt_text is not None:        # a text: encode_into's own path
            return self.encode_into(prompt, out)
        return encode_chat_into_host(prompt.req.system, prompt.req.messages, host)

    def count(self, prompt: Prompt) -> int:
        if prompt.req.prompt_text is not None:
            return count_text_tokens(prompt.req.prompt_text)
        return count_chat_tokens(prompt.req.system, prompt.req.messages)

    def token_bytes(self, token: int) -> bytes:
        return bytes((token,)) if 0 <= token < 256 else b""

    def detokenizer(self, prompt_ids: Sequence[int]) -> Detokenizer:
        return _Utf8Bytes()


BYTE_FORMAT = ByteFormat()
