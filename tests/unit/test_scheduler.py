"""The batch scheduler with the tiny model: batched answers are the answers each request
gets alone, and its bounds (rows, KV memory, the queue) hold."""

from __future__ import annotations

import threading

import pytest
import torch

from zccp.observe.metrics import EngineMetrics
from zccp.model.null import NullBackend
from zccp.model.tiny import TinyConfig, TinyTransformer
from zccp.model.tokenizer import encode_chat
from zccp.serving.planner import Planner
from zccp.serving.prefix_cache import PrefixCache
from zccp.shared_types import ChatMessage, SamplingParams
from zccp.serving.scheduler import BatchLimits, BatchScheduler, Sequence


class Sink:
    """Records tokens; `full_every` > 0 makes it report a full ring every that many tokens."""

    def __init__(self, sched: list, full_every: int = 0) -> None:
        self.tokens: list[int] = []
        self.reused = -1
        self.sched = sched
        self.seen_active: list[int] = []
        self.full_every = full_every
        self.pending = False

    def start(self, cached_tokens, plan_chunks):
        self.reused = cached_tokens

    def kept(self, tokens):
        pass

    def token(self, token):
        self.tokens.append(token)
        self.seen_active.append(len(self.sched[0]._active()))
        self.pending = bool(self.full_every) and len(self.tokens) % self.full_every == 0
        return False

    def end(self, reason, output_tokens):
        return (reason, output_tokens)

    def flush(self):
        self.pending = False           # the next look finds room
        return True

    @property
    def blocked(self):
        return self.pending

    def fail(self):
        raise AssertionError("failed")

    def abandoned(self, exc):
        pass


def prompt(text: str) -> torch.Tensor:
    return encode_chat("", (ChatMessage("user", text),))


LIMITS = BatchLimits(16, 16, 512 << 20)


def run(backend, prompts, limits=LIMITS, prefix=None, full_every=0, max_tokens=30,
        temperature=0.0):
    holder: list = []
    sched = BatchScheduler(backend, limits, Planner(torch.device("cpu"), 512 << 20, 1, 0, 16), prefix,
                           EngineMetrics())
    holder.append(sched)
    done = threading.Semaphore(0)
    sinks, results = [], []
    try:
        for i, p in enumerate(prompts):
            sink = Sink(holder, full_every)
            sinks.append(sink)
            seq = Sequence(p, p.numpy(), SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=i),
                           sink, lambda: False, lambda v: (results.append(v), done.release()))
            assert sched.submit(seq)
        for _ in prompts:
            assert done.acquire(timeout=60)
    finally:
        sched.stop()
    return sinks


PROMPTS = [prompt(t) for t in ("Hello there", "def add(a, b): return a + b" * 3, "x", "Shared memory " * 9,
                               "The quick brown fox", "caf\u00e9 \U0001f600")]


@pytest.fixture(scope="module")
def tiny():
    return TinyTransformer()


def alone(backend, p, max_tokens=30, temperature=0.0, seed=0):
    return list(backend.generate(p, SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed),
                                 lambda: False))


def test_batched_greedy_equals_each_alone(tiny):
    sinks = run(tiny, PROMPTS)
    assert [s.tokens for s in sinks] == [alone(tiny, p) for p in PROMPTS]
    assert max(max(s.seen_active) for s in sinks) > 1          # they really ran together


def test_seeded_sampling_does_not_depend_on_the_batch(tiny):
    sinks = run(tiny, PROMPTS, temperature=1.0)
    assert [s.tokens for s in sinks] == [alone(tiny, p, temperature=1.0, seed=i) for i, p in enumerate(PROMPTS)]


def test_parked_rows_rejoin_and_continue_alike(tiny):
    sinks = run(tiny, PROMPTS, full_every=3)
    assert [s.tokens for s in sinks] == [alone(tiny, p) for p in PROMPTS]


def test_rows_and_kv_memory_bound_admission(tiny):
    sinks = run(tiny, PROMPTS, limits=BatchLimits(2, 16, 512 << 20))
    assert max(max(s.seen_active) for s in sinks) == 2
    longest = max(p.numel() for p in PROMPTS) + 30
    budget = 3 * longest * tiny.kv_bytes_per_token                # three rows at their longest
    sinks = run(tiny, PROMPTS, limits=BatchLimits(16, 16, budget))
    assert max(max(s.seen_active) for s in sinks) <= 3
    assert [s.tokens for s in sinks] == [alone(tiny, p) for p in PROMPTS]


def test_prefix_reuse_gives_the_same_tokens():
    model = TinyTransformer(TinyConfig(prefill_chunk=16))
    system = "You are a helpful assistant that answers about shared memory. " * 3
    prompts = [encode_chat(system, (ChatMessage("user", q),)) for q in ("first", "second question", "third one")]
    cache = PrefixCache(64 << 20, 16, model.identity)
    first = run(model, prompts[:1], prefix=cache)
    rest = run(model, prompts[1:], prefix=cache)
    assert first[0].reused == 0 and all(s.reused >= 160 for s in rest)
    assert [s.tokens for s in first + rest] == [alone(model, p) for p in prompts]


def test_queue_bound_refuses_beyond_max_queue():
    backend = NullBackend(reply="z" * 50, token_delay_ms=20)
    sched = BatchScheduler(backend, BatchLimits(1, 2, 1 << 20), Planner(torch.device("cpu"), 1 << 20, 1, 0, 16),
                           None, EngineMetrics())
    stop = threading.Event()
    try:
        ids = prompt("hi")
        accepted = [sched.submit(Sequence(ids, ids.numpy(), SamplingParams(max_tokens=50), Sink([sched]),
                                          stop.is_set, lambda v: None)) for _ in range(6)]
        # one may already be admitted, at most max_queue wait: the rest are refused
        assert accepted[:2] == [True, True] and accepted.count(True) <= 3 and not accepted[-1]
    finally:
        stop.set()
        sched.stop()


def test_cancelled_sequence_leaves_at_once():
    backend = NullBackend(reply="z" * 4000, token_delay_ms=1)
    holder: list = []
    sched = BatchScheduler(backend, BatchLimits(4, 4, 1 << 20), Planner(torch.device("cpu"), 1 << 20, 1, 0, 16),
                           None, EngineMetrics())
    holder.append(sched)
    cancel, started, done = threading.Event(), threading.Event(), threading.Event()
    values = []
    sink = Sink(holder)
    sink.kept = lambda tokens: started.set()
    p = PROMPTS[1]
    try:
        sched.submit(Sequence(p, p.numpy(), SamplingParams(max_tokens=4000), sink,
                              cancel.is_set, lambda v: (values.append(v), done.set())))
        assert started.wait(10)
        cancel.set()
        assert done.wait(10) and values == [None]
        assert len(sink.tokens) < 4000
    finally:
        sched.stop()
    assert not (sched._rows or sched._parked or sched._prefilling or sched._waiting)


def test_prefill_groups_are_bounded_on_the_cpu_only():
    from zccp.serving.planner import CPU_GROUP_TOKENS

    cpu = Planner(torch.device("cpu"), 512 << 20, 1, 0, 16)
    assert cpu.group(4096) == CPU_GROUP_TOKENS and cpu.group(128) == 128
    assert Planner(torch.device("cuda"), 512 << 20, 1, 0, 16).group(4096) == 4096


def test_prefill_group_rows_bound_padding_and_skip_what_does_not_fit():
    group = Planner.group_rows
    assert group([(0, 70)] * 5, 256) == [0, 1, 2]                  # 3 x 70 padded tokens fit 256, 4 do not
    # 3 x 200 for 240 real tokens is more than half padding: the third waits, the fourth fits
    assert group([(0, 200), (0, 20), (0, 20), (0, 180)], 1024) == [0, 1, 3]
    # a long reused prefix is not padded into every short prompt's KV; the short ones go together
    assert group([(2048, 40), (0, 40), (0, 40), (16, 40)], 4096) == [0]
    assert group([(0, 40), (2048, 40), (0, 40), (16, 40)], 4096) == [0, 2, 3]
    assert group([(128, 64), (0, 38), (0, 37), (128, 16)], 256) == [0, 1, 3]
    assert group([(0, 300)], 256) == [0]                           # the first always (a whole chunk)
