import pytest
import torch

from zccp.model.tokenizer import (
    ASSISTANT,
    BOS,
    EOS,
    SYSTEM,
    USER,
    VOCAB_SIZE,
    PromptTooLong,
    count_chat_tokens,
    decode_bytes,
    encode_chat,
    encode_chat_into,
)
from zccp.shared_types import ChatMessage

MSGS = (
    ChatMessage("user", "Hi"),
    ChatMessage("assistant", "é!"),
    ChatMessage("user", ""),
)


def test_constants():
    assert (BOS, EOS, SYSTEM, USER, ASSISTANT, VOCAB_SIZE) == (256, 257, 258, 259, 260, 261)


def test_layout_with_system():
    out = torch.full((64,), -7, dtype=torch.int32)
    n = encode_chat_into("Be nice", MSGS, out)
    expected = (
        [BOS, SYSTEM, *b"Be nice", USER, *b"Hi", ASSISTANT, *"é!".encode(), USER, ASSISTANT]
    )
    assert n == len(expected) == count_chat_tokens("Be nice", MSGS)
    assert out[:n].tolist() == expected
    assert out[n:].tolist() == [-7] * (64 - n)


def test_layout_without_system_and_system_role_message():
    out = torch.zeros(16, dtype=torch.int32)
    n = encode_chat_into("", [ChatMessage("system", "s"), ChatMessage("user", "u")], out)
    assert out[:n].tolist() == [BOS, SYSTEM, ord("s"), USER, ord("u"), ASSISTANT]


def test_exact_fit():
    need = count_chat_tokens("", MSGS)
    out = torch.zeros(need, dtype=torch.int32)
    assert encode_chat_into("", MSGS, out) == need
    assert out[-1].item() == ASSISTANT


def test_prompt_too_long_never_writes_past_capacity():
    backing = torch.full((100,), 12345, dtype=torch.int32)
    msgs = [ChatMessage("user", "x" * 50)]
    need = count_chat_tokens("sys", msgs)
    cap = need - 1
    view = backing[:cap]
    with pytest.raises(PromptTooLong) as ei:
        encode_chat_into("sys", msgs, view)
    assert ei.value.needed == need and ei.value.capacity == cap
    assert isinstance(ei.value, ValueError)
    # bytes after the allowed length (and, here, the whole view) are untouched
    assert backing.tolist() == [12345] * 100


def test_long_prompt_matches_bytes():
    text = ("abcdé€𝄞\n" * 40000)[:500_000]
    out = torch.empty(700_000, dtype=torch.int32)
    n = encode_chat_into("", [ChatMessage("user", text)], out)
    raw = text.encode()
    assert n == len(raw) + 3
    assert torch.equal(out[2 : n - 1], torch.tensor(list(raw), dtype=torch.int32))
    assert decode_bytes(out[:n]) == raw


def test_encode_chat_and_decode_drop_specials():
    ids = encode_chat("S", [ChatMessage("user", "hé")])
    assert ids.dtype == torch.int32
    assert decode_bytes(ids) == "Shé".encode()
    assert decode_bytes([104, EOS, 105, BOS]) == b"hi"


def test_unknown_role_rejected():
    with pytest.raises(ValueError):
        encode_chat_into("", [ChatMessage("tool", "x")], torch.zeros(8, dtype=torch.int32))  # type: ignore[arg-type]


@pytest.mark.parametrize("system", ["", "sys é"])
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_many_messages_match_the_checked_path(system: str, generation_prompt: bool):
    # the slot's path casts the whole prompt at once and writes the markers over placeholder
    # bytes: every marker where the checked path (any other destination) puts it, empty and
    # non-ASCII messages and a lone surrogate included
    msgs = [ChatMessage("user" if k % 2 == 0 else "assistant", ("wörd \ud800 " * k)[: 3 * k]) for k in range(40)]
    fast = torch.full((4096,), -7, dtype=torch.int32)
    checked = torch.full((4096,), -7, dtype=torch.int64)
    n = encode_chat_into(system, msgs, fast, generation_prompt)
    assert n == encode_chat_into(system, msgs, checked, generation_prompt)
    assert n == count_chat_tokens(system, msgs, generation_prompt)
    assert fast.tolist() == checked.tolist()
    assert fast[:n].tolist().count(USER) == 20 and fast[:n].tolist().count(ASSISTANT) == 20 + generation_prompt
