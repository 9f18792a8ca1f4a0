"""Chunked prefill interleaved with decode, live (nginx + engine, tiny model): the per-step
token budget (model.step_tokens) splits a long prompt over several model steps, each of which
still decodes the running streams, and the answer is the one a single pass gives; a prompt
alone in the model is not split."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.harness import Stack

STEP = 64                                        # a multiple of the prefix block (16)
LONG = "a long prompt, word after word " * 30    # ~900 tokens: many chunks of STEP
MODEL = "zccp-tiny"


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Stack]]:
    """(chunked: a step of STEP tokens, whole: a budget larger than any prompt here)."""
    made = []
    try:
        for name, step in (("chunked", STEP), ("whole", 1 << 20)):
            # a response ring that holds the whole stream below: it never parks (a parked row
            # is out of the batch) however late the test's reader runs on a loaded machine
            s = Stack(Path(tmp_path_factory.mktemp(name)), {"model": {"step_tokens": step},
                                                            "shared_memory": {"response_kb": 640, "tokens_kb": 64}})
            made.append(s)
            s.start()
        yield made[0], made[1]
    finally:
        for s in made:
            s.stop()


def _counter(stack: Stack, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", stack.admin_client().get("/metrics").text, re.M)
    assert m, f"{name} is not in /metrics"
    return float(m.group(1))


def _body(content: str, max_tokens: int, stream: bool = False) -> dict:
    return {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": content}]}


def _plan(r: httpx.Response) -> int:
    """The chunks X-ZCCP-Plan announced (0: one pass)."""
    plan = r.headers.get("x-zccp-plan")
    return int(plan.removeprefix("chunked:")) if plan else 0


def test_a_prompt_longer_than_the_step_gives_the_one_pass_answer(stacks):
    chunked, whole = stacks
    for api in ("/v1/messages", "/v1/chat/completions"):
        text = f"{api} {LONG}"                      # one prompt per API: no prefix reused between them
        # beside a running stream: a prompt alone in the model is not cut (the next test)
        send = lambda api=api, text=text: chunked.client().post(api, json=_body(text, 24))   # noqa: E731
        a, _, _ = _beside_a_stream(chunked, send)
        b = whole.client().post(api, json=_body(text, 24))
        assert a.status_code == b.status_code == 200, (a.text, b.text)
        n = a.json()["usage"]["input_tokens" if api == "/v1/messages" else "prompt_tokens"]
        assert n > 4 * STEP
        assert _plan(a) == -(-n // STEP) and _plan(b) == 0
        if api == "/v1/messages":
            assert a.json()["content"] == b.json()["content"] and a.json()["content"][0]["text"]
        else:
            assert a.json()["choices"][0]["message"] == b.json()["choices"][0]["message"]


def test_a_prompt_alone_in_the_model_is_not_cut_by_the_step(stacks):
    chunked, whole = stacks
    text = LONG.replace("word", "phrase")           # no prefix blocks of the other tests' prompts
    _idle(chunked)                                  # an earlier test's stream has left
    steps = _counter(chunked, "zccp_engine_prefill_steps_total")
    a = chunked.client().post("/v1/messages", json=_body(text, 24))
    steps = _counter(chunked, "zccp_engine_prefill_steps_total") - steps
    b = whole.client().post("/v1/messages", json=_body(text, 24))
    assert a.status_code == b.status_code == 200, (a.text, b.text)
    assert a.json()["usage"]["input_tokens"] > 4 * STEP
    # nothing decoded beside it and nothing waited: one forward, no chunks announced
    assert _plan(a) == 0 and steps == 1
    assert a.json()["content"] == b.json()["content"]


def _idle(stack: Stack) -> None:
    """Until the model holds no sequence (a stream whose client left is reaped in a step or two)."""
    for _ in range(600):
        if all(_counter(stack, g) == 0 for g in ("zccp_engine_batch_rows", "zccp_engine_parked",
                                                 "zccp_engine_queue_waiting")):
            return
        threading.Event().wait(0.1)
    raise AssertionError("the model never went idle")


def _stream(stack: Stack, events: list[str], started: threading.Event, stop: threading.Event) -> threading.Thread:
    """A stream that runs until `stop` (ignore_eos, 3,000 tokens: ~510 KiB of chunks), read in the background:
    each chunk with text is one "token" event."""
    body = {"model": MODEL, "max_tokens": 3000, "temperature": 0, "stream": True, "ignore_eos": True,
            "messages": [{"role": "user", "content": "go on"}]}

    def run() -> None:
        with httpx.Client(base_url=stack.base_url, timeout=60) as c, \
                c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                    events.append("token")
                    started.set()
                if stop.is_set():
                    return
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _beside_a_stream(stack: Stack, call: Callable[[], httpx.Response]) -> tuple[httpx.Response, float, int]:
    """A stream runs; `call` sends a request: (its answer, the steps that prefilled while the
    stream decoded, the stream's tokens until then)."""
    events: list[str] = []
    started, stop = threading.Event(), threading.Event()
    reader = _stream(stack, events, started, stop)
    try:
        assert started.wait(60), "the stream never started"
        mixed = _counter(stack, "zccp_engine_mixed_steps_total")
        answer = call()
        assert answer.status_code == 200, answer.text
        mixed = _counter(stack, "zccp_engine_mixed_steps_total") - mixed
        assert reader.is_alive(), "the stream ended before the long prompt's answer"
        return answer, mixed, len(events)
    finally:
        stop.set()
        reader.join(60)


def _prefill_steps_beside_a_stream(stack: Stack) -> tuple[int, float, int]:
    """A stream runs; a long prompt arrives: (its planned chunks, the steps that prefilled it
    while the stream decoded, the stream's tokens until then)."""
    # (not LONG: the prefix cache holds that one's blocks; reused blocks are not prefilled)
    body = _body(LONG.replace("word", "term"), 4)
    long, mixed, tokens = _beside_a_stream(stack, lambda: stack.client().post("/v1/messages", json=body))
    return _plan(long), mixed, tokens


def test_a_long_prefill_lets_the_running_stream_decode_between_its_chunks(stacks):
    chunked, whole = stacks
    chunks, mixed, tokens = _prefill_steps_beside_a_stream(chunked)
    assert chunks > 4
    # every step that prefilled one of the long prompt's chunks also decoded the stream (the
    # only other sequence), so it received a token between any two chunks
    assert mixed == chunks and tokens > chunks
    # a budget larger than the prompt: one step prefills all of it (the stream waits it out)
    chunks, mixed, _ = _prefill_steps_beside_a_stream(whole)
    assert chunks == 0 and mixed == 1
