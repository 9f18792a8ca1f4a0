"""Byte-level tokenizer shared by every built-in backend.

Ids 0..255 are the raw UTF-8 bytes; five special ids follow. A chat prompt is laid
out as::

    BOS [SYSTEM <system bytes>] (<ROLE marker> <message bytes>)* ASSISTANT

where the SYSTEM segment is present only for a non-empty system prompt and the
trailing ASSISTANT marker is the generation prompt. encode_chat_into() writes the
ids straight into a caller-provided 1-D integer tensor (a view of a shared-memory
slot) with one slice copy per segment, so a 500 KB prompt costs a few vectorised
copies, not a Python loop over bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from zccp.shared_types import ChatMessage

if TYPE_CHECKING:
    import torch

BOS = 256
EOS = 257
SYSTEM = 258
USER = 259
ASSISTANT = 260
VOCAB_SIZE = 261

SPECIAL_IDS = frozenset({BOS, EOS, SYSTEM, USER, ASSISTANT})

ROLE_MARKERS: dict[str, int] = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT}

# Lone surrogates (legal in JSON "\ud800" escapes, illegal in UTF-8) become "?"
# rather than failing the request; count and encode use the same rule.
_ENCODE_ERRORS = "replace"


class PromptTooLong(ValueError):
    """The encoded prompt needs more ids than the destination holds."""

    def __init__(self, needed: int, capacity: int) -> None:
        super().__init__(f"prompt needs {needed} tokens but only {capacity} fit")
        self.needed = needed
        self.capacity = capacity


def _utf8(text: str) -> bytearray:
    # bytearray (writable) so torch.frombuffer does not warn; one copy, done in C.
    return bytearray(text, "utf-8", _ENCODE_ERRORS)


def _marker(role: str) -> int:
    try:
        return ROLE_MARKERS[role]
    except KeyError:
        raise ValueError(f"unknown chat role {role!r}") from None


def _segments(system: str, messages: Sequence[ChatMessage]) -> list[tuple[int, bytearray]]:
    segs: list[tuple[int, bytearray]] = []
    if system:
        segs.append((SYSTEM, _utf8(system)))
    for m in messages:
        segs.append((_marker(m.role), _utf8(m.text)))
    return segs


def _needed(segs: Sequence[tuple[int, bytearray]], generation_prompt: bool = True) -> int:
    # BOS + per segment (marker + bytes) + final ASSISTANT marker
    return 1 + generation_prompt + sum(1 + len(b) for _, b in segs)


def count_chat_tokens(system: str, messages: Sequence[ChatMessage], generation_prompt: bool = True) -> int:
    """Number of ids encode_chat_into() would write for this prompt."""
    n = 1 + generation_prompt
    if system:
        n += 1 + len(system.encode("utf-8", _ENCODE_ERRORS))
    for m in messages:
        _marker(m.role)
        n += 1 + len(m.text.encode("utf-8", _ENCODE_ERRORS))
    return n


def encode_chat_into(system: str, messages: Sequence[ChatMessage], out: torch.Tensor | np.ndarray,
                     generation_prompt: bool = True) -> int:
    """Write the prompt's ids into out[0:n] and return n.

    `out` is a 1-D integer tensor (normally int32, a view of shared memory). If the
    prompt does not fit, PromptTooLong is raised and `out` is left untouched. Without
    the generation prompt (the final ASSISTANT marker) it is a prefix of every longer
    conversation that starts the same way (what a warm-up pre-loads).
    """
    if isinstance(out, np.ndarray):   # a backend without torch: the slot's numpy view itself
        if out.dtype != np.int32 or out.ndim != 1:
            raise ValueError("out must be a 1-D int32 array")
        return encode_chat_into_host(system, messages, out, generation_prompt)
    # The slot's array (1-D int32 on the CPU) is every request's: one check, not four.
    import torch

    if out.dtype is not torch.int32 or out.dim() != 1 or not out.is_cpu:   # is_cpu: no torch.device made
        return _encode_chat_checked(system, messages, out, generation_prompt)
    return encode_chat_into_host(system, messages, out.numpy(), generation_prompt)


def encode_chat_into_host(system: str, messages: Sequence[ChatMessage], buf: np.ndarray,
                          generation_prompt: bool = True) -> int:
    """encode_chat_into for a 1-D int32 numpy array (the slot's host view, made once per
    slot: a torch view and its .numpy() cost ~5 µs a request)."""
    # The prompt's bytes in one piece (str.encode is a memcpy for ASCII text), a placeholder
    # byte where each later marker goes: one uint8 -> int32 cast for the whole prompt (one
    # cast per message was ~2x slower at 512 KiB: numpy's cast of many short runs), then the
    # markers written over their placeholders. One message's join is the message itself.
    markers = [SYSTEM] if system else []
    parts = [system.encode("utf-8", _ENCODE_ERRORS)] if system else []
    for m in messages:
        markers.append(_marker(m.role))
        parts.append(m.text.encode("utf-8", _ENCODE_ERRORS))
    data = b"\0".join(parts)
    needed = 1 + generation_prompt + (1 + len(data) if parts else 0)
    if needed > len(buf):
        raise PromptTooLong(needed, len(buf))
    buf[0] = BOS
    pos = 1
    if parts:
        buf[2 : 2 + len(data)] = np.frombuffer(data, dtype=np.uint8)
        for marker, part in zip(markers, parts, strict=True):
            buf[pos] = marker
            pos += 1 + len(part)
    if generation_prompt:
        buf[pos] = ASSISTANT
        pos += 1
    return pos


def _encode_chat_checked(system: str, messages: Sequence[ChatMessage], out: torch.Tensor,
                         generation_prompt: bool) -> int:
    """encode_chat_into for any other destination: checked, and on a device through torch."""
    if out.dim() != 1:
        raise ValueError(f"out must be 1-D, got shape {tuple(out.shape)}")
    import torch

    if out.dtype.is_floating_point or out.dtype.is_complex or out.dtype == torch.bool:
        raise ValueError(f"out must be an integer tensor, got {out.dtype}")
    segs = _segments(system, messages)
    needed = _needed(segs, generation_prompt)
    capacity = out.numel()
    if needed > capacity:
        raise PromptTooLong(needed, capacity)

    # numpy view of the same memory: element stores cost ~0.1 us instead of torch's ~5 us.
    buf = out.numpy() if out.device.type == "cpu" else None
    dst = buf if buf is not None else out
    dst[0] = BOS
    pos = 1
    for marker, data in segs:
        dst[pos] = marker
        pos += 1
        n = len(data)
        if n:
            if buf is not None:
                buf[pos : pos + n] = np.frombuffer(data, dtype=np.uint8)
            else:
                out[pos : pos + n].copy_(torch.frombuffer(data, dtype=torch.uint8))
            pos += n
    if generation_prompt:
        dst[pos] = ASSISTANT
        pos += 1
    assert pos == needed
    return pos


def encode_chat(system: str, messages: Sequence[ChatMessage]) -> torch.Tensor:
    """Convenience: the prompt's ids in a fresh 1-D int32 tensor."""
    import torch

    segs = _segments(system, messages)
    out = torch.empty(_needed(segs), dtype=torch.int32)
    encode_chat_into(system, messages, out)
    return out


def count_text_tokens(text: str) -> int:
    """What encode_text_into writes for `text`: BOS and its bytes."""
    return 1 + len(_utf8(text))


def encode_text_into(text: str, out: torch.Tensor | np.ndarray) -> int:
    """A plain prompt (/v1/completions, no chat roles): BOS and its bytes into out[0:n]; n."""
    data = _utf8(text)
    needed = 1 + len(data)
    if needed > len(out):
        raise PromptTooLong(needed, len(out))
    ids = np.empty(needed, dtype=np.int32)
    ids[0] = BOS
    ids[1:] = np.frombuffer(data, dtype=np.uint8)
    if isinstance(out, np.ndarray):
        out[:needed] = ids
    elif out.device.type == "cpu":
        out.numpy()[:needed] = ids
    else:
        import torch

        out[:needed].copy_(torch.from_numpy(ids))
    return needed


def encode_text(text: str) -> list[int]:
    """Plain text to byte ids (no specials)."""
    return list(text.encode("utf-8", _ENCODE_ERRORS))


def decode_bytes(ids: torch.Tensor | np.ndarray | Iterable[int]) -> bytes:
    """The bytes spelled by `ids`, with special (and out-of-range) ids dropped."""
    if isinstance(ids, np.ndarray):
        arr = ids
    elif hasattr(ids, "detach"):                        # a torch tensor (torch is not imported for it)
        arr = ids.detach().cpu().numpy()
    else:
        arr = np.fromiter(ids, dtype=np.int64)
    arr = np.asarray(arr).reshape(-1)
    keep = (arr >= 0) & (arr < 256)
    return arr[keep].astype(np.uint8).tobytes()
