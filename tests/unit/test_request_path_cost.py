"""What a request does not pay for any more (issue 29): the answers to the rings of one loop
turn leave the doorbell in one write, in order; the null model's fixed reply is detokenized
once, not per request; the slot's token array is filled without the checked path; the inline
null path takes the fixed reply whole; counters key their labels without a sort per call."""

from __future__ import annotations

import asyncio
import os
import threading

import numpy as np
import pytest
import torch

from zccp.api.common import random_id
from zccp.transport.doorbell import Connection, encode_notice
from zccp.process.engine_main import event_loop
from zccp.observe.metrics import EngineMetrics
from zccp.model.null import NullBackend
from zccp.model.tokenizer import BOS, USER, ASSISTANT, PromptTooLong, encode_chat_into, encode_chat_into_host
from zccp.shared_types import ChatMessage, GenerationResult, SamplingParams
from zccp.serving.text_assembly import fixed_result, generate_text
from tests.support.recording_transport import RecordingTransport




def test_the_notices_of_one_loop_turn_leave_in_one_write_in_order() -> None:
    async def main() -> RecordingTransport:
        t = RecordingTransport()
        conn = Connection(t, asyncio.get_running_loop())  # type: ignore[arg-type]
        frames = [encode_notice(2, slot, 1, 10, 1, 200) for slot in range(5)]
        for f in frames[:4]:
            conn.send(f)                  # on the loop: queued for this turn
        # one from another thread (the model thread's final notice) comes after them
        th = threading.Thread(target=conn.send, args=(frames[4],))
        th.start()
        th.join()
        assert t.writes == []             # nothing written yet: this turn is still running
        for _ in range(3):
            await asyncio.sleep(0)
        assert b"".join(t.writes) == b"".join(frames)
        assert len(t.writes) <= 2         # main wrote one frame per notice (5 writes)
        return t

    t = asyncio.run(main())
    assert t.writes[0] == b"".join(encode_notice(2, s, 1, 10, 1, 200) for s in range(4))


def test_a_connection_closed_with_notices_pending_writes_them_first() -> None:
    async def main() -> RecordingTransport:
        t = RecordingTransport()
        conn = Connection(t, asyncio.get_running_loop())  # type: ignore[arg-type]
        conn.send(encode_notice(2, 1, 1, 0, 1, 200))
        conn.close()
        conn.send(encode_notice(2, 2, 1, 0, 1, 200))   # after close: dropped
        await asyncio.sleep(0)
        return t

    assert asyncio.run(main()).writes == [encode_notice(2, 1, 1, 0, 1, 200)]


def test_the_fixed_reply_is_detokenized_once_not_per_request() -> None:
    backend = NullBackend(reply="caché reply")
    made = []
    real = backend.prompt.detokenizer

    def counting(ids):  # type: ignore[no-untyped-def]
        made.append(1)
        return real(ids)

    backend.prompt.detokenizer = counting  # type: ignore[method-assign]
    ids = torch.tensor([BOS, USER, 104, ASSISTANT], dtype=torch.int32)
    results = []
    for _ in range(3):
        evs = list(generate_text(backend, ids, SamplingParams(max_tokens=7), lambda: False))
        assert isinstance(evs[-1], GenerationResult)
        results.append(evs[-1])
    assert {r.text for r in results} == {"caché r"[:6]}     # 7 byte tokens: "cach" + é (2 bytes) + " "
    assert len(made) <= 1                                    # main made one per request (3)


def test_the_slot_fast_path_writes_what_the_checked_path_writes() -> None:
    msgs = (ChatMessage("user", "héllo"), ChatMessage("assistant", ""), ChatMessage("user", "\udc80x"))
    slot = torch.full((64,), -1, dtype=torch.int32)
    other = torch.full((64,), -1, dtype=torch.int64)          # not the slot's dtype: the checked path
    n = encode_chat_into("sys", msgs, slot)
    assert encode_chat_into("sys", msgs, other) == n
    assert slot[:n].tolist() == other[:n].tolist()
    assert slot[n].item() == -1 and slot[n - 1].item() == ASSISTANT


def test_the_inline_shortcut_gives_generate_texts_result() -> None:
    # fixed_result (the inline null path's shortcut) must be the token loop's final result, and
    # must decline whatever the shortcut cannot honour: stop sequences, tools, a per-token delay
    backend = NullBackend(reply="Hello, shortcut.")
    ids = torch.tensor([BOS, USER, 104, ASSISTANT], dtype=torch.int32)
    for max_tokens in (1, 5, 16, 64):
        params = SamplingParams(max_tokens=max_tokens)
        looped = list(generate_text(backend, ids, params, lambda: False))[-1]
        assert fixed_result(backend, 4, params, False) == looped
    assert fixed_result(backend, 4, SamplingParams(max_tokens=8, stop=("o",)), False) is None
    assert fixed_result(backend, 4, SamplingParams(max_tokens=8), True) is None
    assert fixed_result(NullBackend(token_delay_ms=1), 4, SamplingParams(max_tokens=8), False) is None


def test_metric_keys_do_not_depend_on_the_labels_order_or_the_path() -> None:
    m = EngineMetrics()
    m.cache.inc(result="BYPASS", reason="no_cache")
    m.cache.inc(reason="no_cache", result="BYPASS")
    m.cache.series(reason="no_cache", result="BYPASS").inc(2)
    m.rings.inc()
    m.rings.series().inc()
    m.tokens_in.inc(3, api="openai")
    assert m.cache.get(result="BYPASS", reason="no_cache") == 4
    assert m.rings.get() == 2 and m.tokens_in.get(api="openai") == 3
    text = m.render()
    assert 'zccp_engine_cache_total{reason="no_cache",result="BYPASS"} 4' in text
    assert "zccp_engine_rings_total 2" in text


def test_the_event_loop_choice() -> None:
    import uvloop
    assert event_loop({}) == ("uvloop", uvloop.new_event_loop)
    assert event_loop({"ZCCP_EVENT_LOOP": "uvloop"}) == ("uvloop", uvloop.new_event_loop)
    assert event_loop({"ZCCP_EVENT_LOOP": "asyncio"}) == ("asyncio", None)
    with pytest.raises(SystemExit, match="expected uvloop or asyncio"):
        event_loop({"ZCCP_EVENT_LOOP": "trio"})


def test_response_ids_are_unique_base62_and_a_forked_child_makes_its_own() -> None:
    ids = [random_id("msg_") for _ in range(5000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 28 and i[4:].isalnum() and i[4:].isascii() for i in ids)
    assert len(random_id("x", 9000)) == 9001           # longer than the pool: made on its own
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                       # the child's next ids, to the parent
        os.write(w, "".join(random_id("", 24) for _ in range(10)).encode())
        os._exit(0)
    os.close(w)
    child = os.read(r, 1000).decode()
    os.waitpid(pid, 0)
    os.close(r)
    mine = "".join(random_id("", 24) for _ in range(10))
    assert len(child) == 240 and child != mine


def test_the_slot_host_path_writes_what_the_torch_path_writes() -> None:
    msgs = (ChatMessage("user", "héllo"), ChatMessage("assistant", "ok"))
    slot = torch.full((64,), -1, dtype=torch.int32)
    host = np.full(64, -1, dtype=np.int32)
    n = encode_chat_into("", msgs, slot)
    assert encode_chat_into_host("", msgs, host) == n
    assert slot.tolist() == host.tolist()
    with pytest.raises(PromptTooLong):
        encode_chat_into_host("", msgs, np.zeros(4, dtype=np.int32))


def test_a_metric_key_is_the_same_whichever_order_the_labels_come_in_after_the_first() -> None:
    m = EngineMetrics()
    for _ in range(3):
        m.cache.inc(reason="a", result="HIT")
        m.cache.inc(result="HIT", reason="a")
    assert m.cache.get(result="HIT", reason="a") == 6 and len(m.cache.values) == 1
