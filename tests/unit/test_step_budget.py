"""The per-step token budget (model.step_tokens): the model thread's forwards in order, with
the tiny model. A long prompt arriving while a stream decodes is prefilled in chunks of at
most the budget, and the stream decodes between any two of them; the answer is the one-pass
answer."""

from __future__ import annotations

import threading
from collections.abc import Sequence as Seq
from typing import Any

import torch

from zccp.observe.metrics import EngineMetrics
from zccp.model.base import DecodeBatch
from zccp.model.tiny import TinyTransformer
from zccp.serving.planner import CPU_STEP_TOKENS, GPU_STEP_TOKENS, Planner
from zccp.serving.scheduler import BatchLimits, BatchScheduler, Sequence
from zccp.shared_types import SamplingParams

from tests.unit.test_scheduler import Sink, alone, prompt

STEP = 64


class Logged(TinyTransformer):
    """The tiny model, each forward noted in `log`: ("prefill", tokens) or ("decode", rows)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, int]] = []

    def prefill_many(self, states: Seq[Any], chunks: Seq[torch.Tensor]) -> list[torch.Tensor | int]:
        self.log.append(("prefill", sum(int(c.numel()) for c in chunks)))
        return super().prefill_many(states, chunks)

    def new_batch(self) -> DecodeBatch:
        batch, log = super().new_batch(), self.log
        decode = batch.decode

        def logged(tokens: Seq[int]) -> torch.Tensor | list[int]:
            log.append(("decode", len(tokens)))
            return decode(tokens)
        batch.decode = logged          # type: ignore[method-assign]
        return batch


def test_the_budget_caps_the_chunk_and_leaves_the_decode_rows_theirs():
    p = Planner(torch.device("cpu"), 512 << 20, 1, 0, 16, STEP)
    assert p.chunk() == STEP and p.prefill_budget(STEP, 0) == STEP and p.prefill_budget(STEP, 8) == STEP - 8
    assert p.prefill_budget(STEP, STEP + 5) == 1                              # the first chunk always runs
    assert Planner(torch.device("cpu"), 512 << 20, 1, 0, 16).step_budget == CPU_STEP_TOKENS
    assert Planner(torch.device("cuda"), 512 << 20, 1, 0, 16).step_budget == GPU_STEP_TOKENS
    assert Planner(torch.device("cpu"), 512 << 20, 1, 48, 16, STEP).chunk() == 48   # prefill_chunk caps too


def test_a_long_prefill_is_interleaved_with_the_running_stream():
    model = Logged()
    sched = BatchScheduler(model, BatchLimits(16, 16, 512 << 20),
                           Planner(torch.device("cpu"), 512 << 20, 1, 0, 16, STEP), None, EngineMetrics())
    holder = [sched]
    short, long = prompt("Hello there"), prompt("a long prompt, word after word " * 12)
    running = threading.Event()
    done = threading.Semaphore(0)
    sinks = [Sink(holder), Sink(holder)]
    try:
        params = SamplingParams(max_tokens=200, temperature=0.0)
        first = Sequence(short, short.numpy(), params, sinks[0], lambda: False, lambda v: done.release())
        sinks[0].token = lambda tok, _s=sinks[0]: (running.set(), _s.tokens.append(tok), False)[2]  # type: ignore[method-assign]
        assert sched.submit(first)
        assert running.wait(60)
        second = Sequence(long, long.numpy(), SamplingParams(max_tokens=8, temperature=0.0), sinks[1],
                          lambda: False, lambda v: done.release())
        assert sched.submit(second)
        assert done.acquire(timeout=60) and done.acquire(timeout=60)
    finally:
        sched.stop()
    # the long prompt's forwards: chunks of at most STEP, each followed by the stream's decode
    start = next(i for i, (kind, n) in enumerate(model.log) if kind == "prefill" and n > 8 and i > 0)
    chunks = [i for i, (kind, _) in enumerate(model.log) if kind == "prefill" and i >= start]
    assert len(chunks) == -(-long.numel() // STEP) > 4
    assert all(model.log[i][1] <= STEP for i in chunks)
    for a, b in zip(chunks, chunks[1:], strict=False):
        assert ("decode", 1) in model.log[a + 1:b], model.log[a:b + 1]
    fresh = TinyTransformer()                                               # one pass, alone
    assert sinks[1].tokens == alone(fresh, long, max_tokens=8)
    assert sinks[0].tokens == alone(fresh, short, max_tokens=200)


class Planned(Sink):
    """The test Sink, also keeping the prefill plan admission announced (X-ZCCP-Plan)."""

    def start(self, cached_tokens, plan_chunks):
        super().start(cached_tokens, plan_chunks)
        self.plan = plan_chunks


def _serve(sched: BatchScheduler, seqs: list[tuple[torch.Tensor, int]], gate: threading.Event | None = None
           ) -> list[Planned]:
    """Submit (prompt, max_tokens) sequences together; wait for all of them."""
    done = threading.Semaphore(0)
    sinks = [Planned([sched]) for _ in seqs]
    for (p, n), sink in zip(seqs, sinks, strict=True):
        assert sched.submit(Sequence(p, p.numpy(), SamplingParams(max_tokens=n, temperature=0.0), sink,
                                     lambda: False, lambda v: done.release()))
    if gate is not None:
        gate.set()
    for _ in seqs:
        assert done.acquire(timeout=60)
    return sinks


def test_a_lone_prompt_is_one_forward_whatever_the_budget():
    model = Logged()
    sched = BatchScheduler(model, BatchLimits(16, 16, 512 << 20),
                           Planner(torch.device("cpu"), 512 << 20, 1, 0, 16, STEP), None, EngineMetrics())
    long = prompt("a long prompt, word after word " * 12)
    try:
        [sink] = _serve(sched, [(long, 8)])
    finally:
        sched.stop()
    assert long.numel() > 4 * STEP
    # nothing decodes beside it and nothing waits: the budget does not cut it (nor the plan)
    assert [n for kind, n in model.log if kind == "prefill"] == [long.numel()]
    assert sink.plan == 0
    assert sink.tokens == alone(TinyTransformer(), long, max_tokens=8)


class Gated(Logged):
    """Logged, its first prefill held until `gate` is set (so that what is submitted meanwhile
    reaches the model thread together)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def prefill_many(self, states: Seq[Any], chunks: Seq[torch.Tensor]) -> list[torch.Tensor | int]:
        assert self.gate.wait(60)
        return super().prefill_many(states, chunks)


def test_prompts_that_wait_together_are_cut_by_the_budget():
    model = Gated()
    sched = BatchScheduler(model, BatchLimits(16, 16, 512 << 20),
                           Planner(torch.device("cpu"), 512 << 20, 1, 0, 16, STEP), None, EngineMetrics())
    first = prompt("hold the model thread")
    longs = [prompt(f"{w} long prompt, word after word " * 12) for w in ("one", "another")]
    try:
        # the first (no output: it leaves after its prefill) holds the thread while the two
        # long prompts queue; they then start together, with no row decoding
        done = threading.Semaphore(0)
        held = Planned([sched])
        assert sched.submit(Sequence(first, first.numpy(), SamplingParams(max_tokens=0, temperature=0.0), held,
                                     lambda: False, lambda v: done.release()))
        while not model.log and not sched._prefilling:
            threading.Event().wait(0.01)
        sinks = _serve(sched, [(p, 8) for p in longs], model.gate)
        assert done.acquire(timeout=60)
    finally:
        sched.stop()
    assert held.plan == 0                                       # it was alone
    prefills = [n for kind, n in model.log if kind == "prefill"][1:]
    assert all(n <= STEP for n in prefills)
    assert sum(prefills) == sum(p.numel() for p in longs)
    assert [s.plan for s in sinks] == [-(-p.numel() // STEP) for p in longs]
    fresh = TinyTransformer()
    assert [s.tokens for s in sinks] == [alone(fresh, p, max_tokens=8) for p in longs]
