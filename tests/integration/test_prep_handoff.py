"""Prep processes beside a model (zccp.process.handoff), through the real nginx, engine and
Redis: a tiny or hf engine of two processes. The prep process parses, tokenizes into the slot
and looks the cache up; its misses run in rank 0's model and answer exactly as rank 0's own,
streamed or not; the answer is stored, and hit; what it cannot prepare alone (n > 1, a
warm-up) goes whole; a client that leaves stops the generation; a prep process killed
mid-stream cuts its own streams and rank 0 stops generating them."""

from __future__ import annotations

import concurrent.futures as cf
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.engine_group import engine_pid, kill_prep_mid_streams, page_value, prep_pids, rings, wait_for
from tests.support.harness import Stack
from tests.support.hf_checkpoint import HF_MODEL

TINY = {"backend": "tiny"}
NO_CACHE = {"cache-control": "no-store, no-cache"}


def _config(model: dict[str, Any]) -> dict[str, Any]:
    return {"model": model, "server": {"engine_processes": 2}, "shared_memory": {"segment_count": 16}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("handoff"), _config(TINY), with_redis=True).start()
    try:
        yield s
    finally:
        s.stop()


def _chat(stack: Stack, text: str, stream: bool, headers: dict[str, str] | None = None,
          model: str = "zccp-tiny", **extra: Any) -> tuple[int, str, str]:
    """(status, the answer's text, X-ZCCP-Cache) of one OpenAI chat completion."""
    body = {"model": model, "max_tokens": 24, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": text}], **extra}
    with stack.client() as c:
        if not stream:
            r = c.post("/v1/chat/completions", json=body, headers=headers or {})
            answer = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else r.text
            return r.status_code, answer, r.headers.get("x-zccp-cache", "")
        with c.stream("POST", "/v1/chat/completions", json=body, headers=headers or {}) as r:
            parts = []
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    parts.extend(ch["delta"].get("content") or "" for ch in json.loads(line[6:])["choices"])
            return r.status_code, "".join(parts), r.headers.get("x-zccp-cache", "")


def _handoffs(stack: Stack, kind: str) -> float:
    return page_value(stack, "zccp_engine_handoffs_total", kind=kind)


def test_handed_misses_answer_exactly_as_the_model_process_does(stack: Stack) -> None:
    socket_path = stack.cfg.server.socket_path
    assert socket_path is not None
    before, prep_rings = _handoffs(stack, "miss"), rings(socket_path, 1)
    prompts = [f"the same answer whoever asks {i}" for i in range(6)]
    jobs = [(p, stream) for p in prompts for stream in (False, True, False, True)]
    with cf.ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda j: (j[0], _chat(stack, j[0], j[1], NO_CACHE)), jobs))
    assert all(status == 200 for _, (status, _, _) in got), got
    for p in prompts:   # greedy: one text per prompt, whichever process prepared it, streamed or not
        texts = {text for q, (_, text, _) in got if q == p}
        assert len(texts) == 1 and texts != {""}, (p, texts)
    # nginx rings each process's doorbell in turn: the prep process took its share, and
    # handed every one of its misses to the model's process
    handed = _handoffs(stack, "miss") - before
    assert handed > 0 and handed == rings(socket_path, 1) - prep_rings
    stack.assert_no_leaks()


def test_a_handed_miss_is_stored_by_the_prep_process_and_hit(stack: Stack) -> None:
    handed = 0
    for i in range(16):     # until two misses went through the prep process (nginx rings each in turn)
        prompt = f"store me {i}"
        before = _handoffs(stack, "miss")
        status, first, cache = _chat(stack, prompt, stream=bool(i % 2))
        assert (status, cache) == (200, "MISS")
        handed += _handoffs(stack, "miss") > before
        wait_for(lambda p=prompt: _chat(stack, p, False)[2] == "HIT", f"{prompt!r} was not stored", 10)
        for stream in (False, True):
            assert _chat(stack, prompt, stream) == (200, first, "HIT")
        if handed >= 2:
            break
    assert handed >= 2
    stack.assert_no_leaks()


def test_what_a_prep_process_cannot_prepare_alone_goes_whole(stack: Stack) -> None:
    before = _handoffs(stack, "whole")
    for i in range(10):     # until one went through the prep process
        body = {"model": "zccp-tiny", "max_tokens": 8, "n": 2, "temperature": 1.0, "seed": i,
                "messages": [{"role": "user", "content": f"two of them {i}"}]}
        with stack.client() as c:
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200 and len(r.json()["choices"]) == 2, r.text
        with stack.admin_client() as a:     # the warm-up runs the model: the admin listener's
            w = a.post("/v1/zccp/warmup", json={"model": "zccp-tiny", "system": f"warm {i} " * 20, "messages": []})
            assert w.status_code == 200 and w.json()["type"] == "warmup", w.text
        if i >= 3 and _handoffs(stack, "whole") > before:
            break
    assert _handoffs(stack, "whole") > before
    stack.assert_no_leaks()


def _long_stream(stack: Stack, i: int, keep: int | None) -> str:
    """A greedy stream of 2,000 tokens (ignore_eos): read `keep` chunks and leave, or to the end."""
    body = {"model": "zccp-tiny", "max_tokens": 2000, "temperature": 0, "stream": True, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"long {i}"}]}
    try:
        with httpx.Client(base_url=stack.base_url, timeout=60) as c, \
                c.stream("POST", "/v1/chat/completions", json=body, headers=NO_CACHE) as r:
            n = 0
            for line in r.iter_lines():
                n += line.startswith("data: ")
                if keep is not None and n >= keep:
                    return "left"
                if line == "data: [DONE]":
                    return "whole"
    except httpx.HTTPError:
        return "cut"
    return "cut"


def test_a_client_that_leaves_a_handed_stream_stops_its_generation(stack: Stack) -> None:
    before_abandoned, before = page_value(stack, "zccp_engine_abandoned_total"), _handoffs(stack, "miss")
    with cf.ThreadPoolExecutor(4) as ex:
        ends = list(ex.map(lambda i: _long_stream(stack, i, keep=3), range(4)))
    assert ends == ["left"] * 4
    assert _handoffs(stack, "miss") > before       # some of them were the prep process's
    # each was stopped in the model (abandoned, not answered) and its row freed
    wait_for(lambda: page_value(stack, "zccp_engine_abandoned_total") - before_abandoned >= 4,
             "a stream whose client left was not stopped")
    wait_for(lambda: page_value(stack, "zccp_engine_batch_rows") == 0, "rows left in the batch")
    stack.assert_no_leaks()


def test_a_killed_prep_process_cuts_its_handed_streams_and_the_model_stops_them(tmp_path: Path) -> None:
    s = Stack(tmp_path, _config(TINY)).start()
    try:
        (victim,) = prep_pids(engine_pid(s))
        abandoned = page_value(s, "zccp_engine_abandoned_total")
        on_victim, ends = kill_prep_mid_streams(s, victim, lambda i: _long_stream(s, i, None), 6, 1.0)
        assert on_victim, "no stream reached the prep process"
        assert ends.count("cut") == on_victim and ends.count("whole") == 6 - on_victim, ends
        # the model's process stopped generating the victim's streams (abandoned, not run to their end)
        wait_for(lambda: page_value(s, "zccp_engine_abandoned_total") - abandoned >= on_victim,
                 "the killed process's streams still decode")
        wait_for(lambda: page_value(s, "zccp_engine_batch_rows") == 0, "rows left in the batch")
        wait_for(lambda: len(prep_pids(engine_pid(s))) == 1, "the prep process was not started again")
        before = page_value(s, "zccp_engine_handoffs_total", kind="miss")
        for i in range(8):     # the new prep process hands off over its new channel
            assert _chat(s, f"after {i}", stream=bool(i % 2))[0] == 200
        assert page_value(s, "zccp_engine_handoffs_total", kind="miss") > before
        s.assert_no_leaks()
    finally:
        s.stop()


def test_an_hf_prep_process_tokenizes_as_the_model_process(tmp_path: Path, hf_checkpoint: Path) -> None:
    s = Stack(tmp_path, _config({"backend": "hf", "path": str(hf_checkpoint), "name": HF_MODEL,
                                 "max_context": 4096, "prefill_chunk": 64})).start()
    try:
        got = []
        for _ in range(8):
            body = {"model": HF_MODEL, "max_tokens": 12, "temperature": 0,
                    "messages": [{"role": "user", "content": "caf\u00e9, na\u00efve \U0001f600 prompts"}]}
            with s.client() as c:
                r = c.post("/v1/chat/completions", json=body, headers=NO_CACHE)
            assert r.status_code == 200, r.text
            got.append((r.json()["choices"][0]["message"]["content"], r.json()["usage"]["prompt_tokens"]))
        assert len(set(got)) == 1, got      # the same ids, whichever process tokenized them
        texts = set()
        for _ in range(4):                  # /v1/completions: a text without the template
            with s.client() as c:
                r = c.post("/v1/completions", headers=NO_CACHE, json={
                    "model": HF_MODEL, "max_tokens": 6, "temperature": 0, "prompt": "Once upon a time"})
            assert r.status_code == 200, r.text
            texts.add((r.json()["choices"][0]["text"], r.json()["usage"]["prompt_tokens"]))
        assert len(texts) == 1, texts
        assert page_value(s, "zccp_engine_handoffs_total", kind="miss") > 0
        s.assert_no_leaks()
    finally:
        s.stop()
