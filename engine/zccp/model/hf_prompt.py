"""The hf backend's prompt format: the checkpoint's own chat template and fast tokenizer.

The conversation (zccp.shared_types.ChatInput, from either API) is rendered with
tokenizer.apply_chat_template (system prompt, tools, tool calls and tool results as
the template lays them out, the generation prompt), then encoded by the Rust
tokenizer without adding special tokens (the template writes them): exactly what
apply_chat_template(tokenize=True) gives, one string render and one encode.
A final assistant message is continued, not closed (Anthropic's prefill).

Detokenization is incremental, so a character spread over several tokens is emitted whole,
and a partial character is held for at most the bytes that could still complete it
(invalid bytes become U+FFFD at once): a byte-level BPE through each id's bytes and an
incremental UTF-8 decoder; any other tokenizer through tokenizers' DecodeStream (primed
with the prompt's last ids, as vLLM does), never holding more tokens than a character
can span. flush() releases what is still held at the end. Special tokens are kept out of the
text, except the tool-call tags when they are special tokens: the tool parser needs
them (with skip_special_tokens they would vanish).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from zccp.model.prompt import Detokenizer, Prompt, PromptFormat
from zccp.model.tokenizer import PromptTooLong
from zccp.shared_types import ApiError
from zccp.serving.hermes_tools import END, START

# Prompt ids a detokenizer is primed with (context for tokenizers that merge spaces).
_PRIME = 8


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable stand-in character -> its byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def byte_level_table(tok: Any) -> list[bytes] | None:
    """Each id's bytes when the tokenizer's decoder is exactly ByteLevel (a byte-level BPE),
    as its decoder maps them (a token outside the alphabet is its UTF-8); None otherwise."""
    if type(tok.decoder).__name__ != "ByteLevel":
        return None
    alphabet = _byte_level_alphabet()
    vocab = tok.get_vocab(with_added_tokens=True)
    table = [b""] * (max(vocab.values(), default=-1) + 1)
    for piece, i in vocab.items():
        try:
            table[i] = bytes(alphabet[c] for c in piece)
        except KeyError:
            table[i] = piece.encode("utf-8")
    return table


class ByteLevelDetokenizer:
    """A byte-level BPE's ids -> text through an incremental UTF-8 decoder: a partial
    character is held for at most the bytes that could still complete it, invalid bytes
    become U+FFFD at once (as Hugging Face's own server streams them)."""

    __slots__ = ("_table", "_dec", "_hidden")

    def __init__(self, table: list[bytes], hidden: frozenset[int]) -> None:
        self._table = table
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._hidden = hidden

    def step(self, token: int) -> str:
        if token in self._hidden or not 0 <= token < len(self._table):
            return ""
        return self._dec.decode(self._table[token])

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


# A UTF-8 character is at most 4 bytes and every token adds at least one: after this many
# tokens held back in a row, what is held can no longer become one character.
_MAX_HELD = 4


class HfDetokenizer:
    """Any other tokenizer: tokenizers' DecodeStream, with what it holds bounded (it holds
    while the text ends in U+FFFD, which for invalid bytes would be until the end)."""

    __slots__ = ("_tok", "_stream", "_prime", "_ids", "_sent", "_hidden", "_held")

    def __init__(self, tok: Any, prime: Sequence[int], hidden: frozenset[int]) -> None:
        self._tok = tok                        # the Rust tokenizers.Tokenizer
        self._hidden = hidden
        self._restart(list(prime))

    def _restart(self, prime: list[int]) -> None:
        from tokenizers.decoders import DecodeStream

        self._prime = prime
        self._stream = DecodeStream(ids=prime, skip_special_tokens=False)
        self._ids: list[int] = []
        self._sent: list[str] = []
        self._held = 0

    def step(self, token: int) -> str:
        if token in self._hidden:
            return ""
        self._ids.append(token)
        try:
            text = self._stream.step(self._tok, token) or ""
        except Exception:                      # an id the decoder cannot place: settled below
            text = ""
        if text:
            self._held = 0
            self._sent.append(text)
            return text
        self._held += 1
        if self._held < _MAX_HELD:
            return ""
        # no character can still complete: release it (as U+FFFD) and start afresh from here
        text = self.flush()
        self._restart(self._clean_tail((self._prime + self._ids)[-_PRIME:]))
        return text

    def _clean_tail(self, ids: list[int]) -> list[int]:
        """The longest suffix of ids that decodes to whole characters: a prime ending in
        invalid bytes would be read again together with the next ones."""
        while ids and "\ufffd" in self._tok.decode(ids, skip_special_tokens=False):
            ids = ids[1:]
        return ids

    def flush(self) -> str:
        """The text the generated ids spell that was not streamed yet (a dangling
        partial character becomes U+FFFD, as in a full decode)."""
        head = self._tok.decode(self._prime, skip_special_tokens=False)
        whole = self._tok.decode(self._prime + self._ids, skip_special_tokens=False)
        sent = "".join(self._sent)
        if not whole.startswith(head) or not whole[len(head):].startswith(sent):
            return ""
        return whole[len(head) + len(sent):]


class HfChatFormat(PromptFormat):
    def __init__(self, tokenizer: Any, model_name: str) -> None:
        self._tok = tokenizer
        self._rust = tokenizer.backend_tokenizer
        self._model = model_name
        tags = {START, END}
        special = set(tokenizer.all_special_ids) | {
            i for i, t in tokenizer.added_tokens_decoder.items() if getattr(t, "special", False)}
        self._hidden = frozenset(i for i in special if tokenizer.convert_ids_to_tokens(i) not in tags)
        self._bytes = byte_level_table(self._rust)

    def render(self, prompt: Prompt, generation_prompt: bool = True) -> str:
        """The prompt text the chat template makes (ApiError: content the model cannot take,
        or a conversation its template refuses)."""
        chat = prompt.chat()
        if chat.media:
            field, kind = chat.media[0]
            raise ApiError(400, "invalid_request_error",
                           f"{field}: {kind} content is not supported: {self._model} is a text-only model",
                           param=field)
        extra: dict[str, Any] = {}
        if chat.tools:
            extra["tools"] = chat.tools
            extra["tool_choice"] = chat.tool_choice
        last = chat.messages[-1]["role"] if chat.messages else None
        cont = generation_prompt and last == "assistant"      # continue the prefilled answer
        try:
            return self._tok.apply_chat_template(
                chat.messages, tokenize=False, add_generation_prompt=generation_prompt and not cont,
                continue_final_message=cont, **extra)
        except Exception as exc:   # jinja2's TemplateError, or the template's raise_exception()
            raise ApiError(400, "invalid_request_error",
                           f"messages: the chat template of {self._model} refused this conversation: {exc}",
                           param="messages") from None

    def ids(self, prompt: Prompt, generation_prompt: bool = True) -> list[int]:
        if prompt.req.prompt_text is not None:
            # /v1/completions: the text as is, with the tokenizer's own specials (BOS), no template
            return self._rust.encode(prompt.req.prompt_text, add_special_tokens=True).ids
        return self._rust.encode(self.render(prompt, generation_prompt), add_special_tokens=False).ids

    def encode_into(self, prompt: Prompt, out: torch.Tensor | np.ndarray, generation_prompt: bool = True) -> int:
        ids = self.ids(prompt, generation_prompt)
        n = len(ids)
        if n > len(out):
            raise PromptTooLong(n, len(out))
        arr = np.asarray(ids, dtype=np.int32)
        if isinstance(out, np.ndarray):        # a prep process's slot view (no torch there)
            out[:n] = arr
        elif out.device.type == "cpu":
            out.numpy()[:n] = arr
        else:
            out[:n].copy_(torch.from_numpy(arr))
        return n

    def encode_into_slot(self, prompt: Prompt, out: torch.Tensor, host: np.ndarray) -> int:
        """Through the slot's numpy view: the same memory as out's (zccp.transport.device)."""
        return self.encode_into(prompt, host)

    def count(self, prompt: Prompt) -> int:
        return len(self.ids(prompt))

    def token_bytes(self, token: int) -> bytes:
        if token in self._hidden:
            return b""
        if self._bytes is not None:
            return self._bytes[token] if 0 <= token < len(self._bytes) else b""
        return str(self._rust.decode([token], skip_special_tokens=False)).encode()

    def detokenizer(self, prompt_ids: Sequence[int]) -> Detokenizer:
        if self._bytes is not None:
            return ByteLevelDetokenizer(self._bytes, self._hidden)
        return HfDetokenizer(self._rust, list(prompt_ids)[-_PRIME:], self._hidden)
