"""One request cannot fail, stall or crowd out another (issue 28): a row's sampling
failure is its own, no number makes the shared step NaN, an unsatisfiable grammar ends
its own request, schemas compile off the loop (once each), and the queue is shared by
tenant. The scheduler runs the tiny model on its real thread."""

from __future__ import annotations

import asyncio
import json
import random
import threading

import pytest
import torch

from zccp.serving.fair_queue import Admission, FairQueue, spare_rows
from zccp.observe.metrics import EngineMetrics
from zccp.model.grammar_cache import GrammarCompiler
from zccp.model.sampling import Sampler, sample_rows
from zccp.model.tiny import TinyTransformer
from zccp.model.tokenizer import encode_chat
from zccp.serving.planner import Planner
from zccp.serving.scheduler import BatchLimits, BatchScheduler, Sequence
from zccp.shared_types import ApiError, ChatMessage, OutputConstraint, SamplingParams
from zccp.serving.text_assembly import StopMatcher


class Sink:
    """Records tokens, how it ended, and (in `order`) when it was admitted."""

    def __init__(self, name: str = "", order: list | None = None, gate: threading.Event | None = None) -> None:
        self.name, self.order, self.gate = name, order, gate
        self.tokens: list[int] = []
        self.failed: list[ApiError | None] = []
        self.ended = None

    def start(self, cached_tokens, plan_chunks):
        if self.order is not None:
            self.order.append(self.name)
        if self.gate is not None:
            assert self.gate.wait(30)

    def kept(self, tokens):
        pass

    def token(self, token):
        self.tokens.append(token)
        return False

    def end(self, reason, output_tokens):
        self.ended = reason
        return reason

    def flush(self):
        return True

    @property
    def blocked(self):
        return False

    def fail(self, err=None):
        self.failed.append(err)

    def abandoned(self, exc):
        pass


@pytest.fixture(scope="module")
def tiny():
    return TinyTransformer()


def prompt(text: str) -> torch.Tensor:
    return encode_chat("", (ChatMessage("user", text),))


def scheduler(backend, max_batch: int = 8, max_queue: int = 64) -> BatchScheduler:
    return BatchScheduler(backend, BatchLimits(max_batch, max_queue, 512 << 20),
                          Planner(torch.device("cpu"), 512 << 20, 1, 0, 16), None, EngineMetrics())


def seq(p: torch.Tensor, params: SamplingParams, sink: Sink, done: threading.Semaphore, tenant: bytes = b"",
        **kw) -> Sequence:
    return Sequence(p, p.numpy(), params, sink, lambda: False, lambda _: done.release(), salt=tenant or None, **kw)


def alone(backend, p, max_tokens: int) -> list[int]:
    return list(backend.generate(p, SamplingParams(max_tokens=max_tokens, temperature=0), lambda: False))


# -- sampling: no number makes a row NaN ----------------------------------------------------------

def test_a_vanishing_temperature_is_greedy_not_nan():
    logits = torch.tensor([0.5, 3.0, -1.0, 2.9])
    for t in (1e-300, 5e-324, 1e-8):
        assert Sampler(SamplingParams(max_tokens=1, temperature=t), torch.device("cpu"))(logits) == 1
    # just above the greedy bound: the max-shifted division stays finite, and draws the top token
    s = Sampler(SamplingParams(max_tokens=1, temperature=2e-5, seed=1), torch.device("cpu"))
    assert s(logits) == 1


def test_a_row_that_cannot_be_sampled_fails_alone_in_sample_rows():
    cpu = torch.device("cpu")
    logits = torch.tensor([[0.0, 1.0, 2.0], [float("-inf")] * 3, [2.0, 1.0, 0.0]])
    rows = [Sampler(SamplingParams(max_tokens=1, temperature=0.7, seed=3), cpu) for _ in range(3)]
    got = sample_rows(logits, rows)
    assert isinstance(got[1], ApiError) and got[1].status == 400 and "allows no token" in got[1].message
    assert isinstance(got[0], int) and isinstance(got[2], int)


def test_temperature_1e_300_in_a_batch_fails_nobody(tiny):
    sched = scheduler(tiny)
    done = threading.Semaphore(0)
    p = prompt("Hello there")
    hostile, good = Sink(), Sink()
    try:
        assert sched.submit(seq(p, SamplingParams(max_tokens=12, temperature=1e-300), hostile, done))
        assert sched.submit(seq(p, SamplingParams(max_tokens=12, temperature=0), good, done))
        for _ in range(2):
            assert done.acquire(timeout=60)
    finally:
        sched.stop()
    assert not hostile.failed and not good.failed
    assert good.tokens == alone(tiny, p, 12) == hostile.tokens        # 1e-300 is greedy


def test_a_neighbours_sampler_raising_fails_only_that_neighbour(tiny, monkeypatch):
    real = tiny.sampler

    class Broken(Sampler):
        def __call__(self, logits):
            raise RuntimeError("a sampler bug, for this row only")

    def sampler(params, compiled=None, prompt=()):
        if params.seed == 666:
            return Broken(params, tiny.device)
        return real(params, compiled, prompt)

    monkeypatch.setattr(tiny, "sampler", sampler)
    sched = scheduler(tiny)
    done = threading.Semaphore(0)
    prompts = [prompt("Hello there"), prompt("The quick brown fox"), prompt("x")]
    sinks = [Sink() for _ in prompts]
    bad = Sink()
    try:
        for p, s in zip(prompts, sinks, strict=True):
            assert sched.submit(seq(p, SamplingParams(max_tokens=20, temperature=0), s, done))
        assert sched.submit(seq(prompts[0], SamplingParams(max_tokens=20, temperature=1.0, seed=666), bad, done))
        for _ in range(4):
            assert done.acquire(timeout=60)
    finally:
        sched.stop()
    assert bad.failed == [None] and bad.ended is None                  # the engine's 500, for it alone
    assert [s.failed for s in sinks] == [[], [], []]
    assert [s.tokens for s in sinks] == [alone(tiny, p, 20) for p in prompts]


# -- an unsatisfiable grammar ends its own request ---------------------------------------------------

@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_grammar_no_token_can_satisfy_ends_its_request_with_a_400(tiny, temperature):
    compiler = GrammarCompiler(tiny.grammar_vocab)
    c = OutputConstraint("json", json.dumps({"const": "\u00e9"}), param="response_format")
    grammar = asyncio.run(compiler.compile(c))
    compiler.close()
    assert grammar is not None
    sched = scheduler(tiny)
    done = threading.Semaphore(0)
    p = prompt("Hello there")
    hostile, good = Sink(), Sink()
    try:
        assert sched.submit(seq(p, SamplingParams(max_tokens=30, temperature=temperature, seed=1, constraint=c),
                                hostile, done, grammar=grammar))
        assert sched.submit(seq(p, SamplingParams(max_tokens=12, temperature=0), good, done))
        for _ in range(2):
            assert done.acquire(timeout=60)
    finally:
        sched.stop()
    assert len(hostile.failed) == 1 and hostile.failed[0] is not None
    assert hostile.failed[0].status == 400 and "cannot be completed" in hostile.failed[0].message
    assert not good.failed and good.tokens == alone(tiny, p, 12)


def test_the_model_thread_never_compiles(tiny):
    """A constrained sequence without its compiled grammar is refused, not compiled there."""
    sched = scheduler(tiny)
    done = threading.Semaphore(0)
    sink = Sink()
    c = OutputConstraint("json", None)
    try:
        assert sched.submit(seq(prompt("x"), SamplingParams(max_tokens=4, constraint=c), sink, done))
        assert done.acquire(timeout=60)
    finally:
        sched.stop()
    assert sink.failed == [None] and not sink.tokens


# -- schemas compile off the loop, once ------------------------------------------------------------

def big_schema(n: int) -> str:
    return json.dumps({"oneOf": [{"type": "object", "properties": {f"k{i}": {"type": "integer"},
                                                                    "v": {"const": f"x{i}"}},
                                  "required": [f"k{i}"]} for i in range(n)]})


def test_compiler_refuses_a_bad_schema_naming_its_field(tiny):
    compiler = GrammarCompiler(tiny.grammar_vocab)
    bad = {"type": "object", "properties": {"a": {"type": "no-such-type"}}}
    c = OutputConstraint("json", json.dumps(bad), param="response_format.json_schema.schema")
    with pytest.raises(ApiError) as info:
        asyncio.run(compiler.compile(c))
    compiler.close()
    assert info.value.status == 400 and info.value.param == "response_format.json_schema.schema"
    assert "invalid JSON schema" in info.value.message


def test_the_same_schema_compiles_once_and_twins_share_the_compile(tiny):
    compiler = GrammarCompiler(tiny.grammar_vocab)
    c = OutputConstraint("json", big_schema(20), param="p")

    async def main():
        a, b = await asyncio.gather(compiler.compile(c), compiler.compile(c))
        return a, b, await compiler.compile(OutputConstraint("json", big_schema(20), param="q"))

    a, b, again = asyncio.run(main())
    compiler.close()
    assert compiler.compiles == 1 and a is b is again


def test_a_large_schema_compiles_while_the_loop_serves_others(tiny):
    compiler = GrammarCompiler(tiny.grammar_vocab, budget_s=600)
    c = OutputConstraint("json", big_schema(1500), param="p")
    finished: list[str] = []

    async def compile_it():
        await compiler.compile(c)
        finished.append("schema")

    async def another_request():
        for _ in range(3):
            await asyncio.sleep(0)
        finished.append("other")

    async def main():
        await asyncio.gather(compile_it(), another_request())

    asyncio.run(main())
    compiler.close()
    assert finished == ["other", "schema"]


def test_a_schema_over_the_compile_budget_is_a_400_and_stays_refused(tiny):
    compiler = GrammarCompiler(tiny.grammar_vocab, budget_s=0.001)
    c = OutputConstraint("json", big_schema(1500), param="output_config.format.schema")

    async def main():
        for _ in range(2):
            with pytest.raises(ApiError) as info:
                await compiler.compile(c)
            assert info.value.status == 400 and "too complex" in info.value.message
            assert info.value.param == "output_config.format.schema"
            await asyncio.sleep(0)
        while compiler._running:          # the worker finishes; its verdict is kept
            await asyncio.sleep(0.01)
        with pytest.raises(ApiError):
            await compiler.compile(c)

    asyncio.run(main())
    compiler.close()
    assert compiler.compiles == 1


def slow_schema(salt: int = 0) -> str:
    """~10 KB that llguidance takes about a CPU-second to compile (3,600 merged objects)."""
    return json.dumps({"type": "object", "allOf": [{"anyOf": [
        {"properties": {f"a{j}_{q}": {"const": salt + i * 100 + q} for q in range(3)}} for i in range(60)]}
        for j in range(2)]})


def test_one_tenants_slow_schemas_hold_one_worker_and_another_tenant_compiles_meanwhile(tiny):
    metrics = EngineMetrics()
    compiler = GrammarCompiler(tiny.grammar_vocab, budget_s=600, metrics=metrics)
    small = OutputConstraint("json", big_schema(2), param="p")

    async def main():
        a1 = asyncio.ensure_future(compiler.compile(OutputConstraint("json", slow_schema(), param="p"), b"A"))
        a2 = asyncio.ensure_future(compiler.compile(OutputConstraint("json", big_schema(3), param="p"), b"A"))
        await asyncio.sleep(0)
        assert metrics.grammar_compiling.get() == 2
        assert await compiler.compile(small, b"B") is not None
        # B's compile did not wait for A's: A's second, small as it is, waits in A's lane
        # behind A's first (without lanes it had the other worker, and B queued behind it)
        order = (a1.done(), a2.done())
        await asyncio.gather(a1, a2)
        return order

    assert asyncio.run(main()) == (False, False)
    compiler.close()
    assert metrics.grammar_compiles.get() == 3 and metrics.grammar_compiling.get() == 0


def test_a_compile_whose_budget_ran_out_in_its_lane_is_not_started_nor_kept(tiny):
    compiler = GrammarCompiler(tiny.grammar_vocab, budget_s=0.1)
    slow = OutputConstraint("json", slow_schema(), param="p")
    queued = OutputConstraint("json", big_schema(3), param="response_format")

    async def main():
        first = asyncio.ensure_future(compiler.compile(slow, b"A"))
        await asyncio.sleep(0)
        with pytest.raises(ApiError) as info:      # waited behind A's slow one past its budget
            await compiler.compile(queued, b"A")
        assert info.value.status == 400 and info.value.param == "response_format"
        with pytest.raises(ApiError):
            await first
        while compiler.compiling:
            await asyncio.sleep(0.01)
        return await compiler.compile(queued, b"A")        # never tried, so not refused: compiled now

    assert asyncio.run(main()) is not None
    compiler.close()
    assert compiler.compiles == 3


# -- fair share ------------------------------------------------------------------------------------

def test_queue_places_are_shared_by_tenant():
    q = FairQueue(8)
    assert q.reserve(b"A", 8) is Admission.OK
    assert q.reserve(b"A", 1) is Admission.FULL              # the queue is A's alone: full
    assert q.reserve(b"B", 4) is Admission.OK                # but B's share (8 // 2) is still B's
    assert q.reserve(b"B", 1) is Admission.FULL
    assert q.reserve(b"C", 9) is Admission.NEVER             # more than the queue: can never be queued
    assert q.reserved <= 2 * q.max_queue


def test_another_tenant_is_admitted_before_a_backlog_of_n_choices_drains(tiny):
    sched = scheduler(tiny, max_batch=2)
    done = threading.Semaphore(0)
    order: list[str] = []
    gate = threading.Event()
    p = prompt("Hello there")
    params = SamplingParams(max_tokens=6, temperature=0)
    try:
        # A's first sequence holds the model thread in its start() until everything is queued
        assert sched.submit(seq(p, params, Sink("A", order, gate), done, b"A"))
        backlog = [seq(p, params, Sink("A", order), done, b"A") for _ in range(63)]
        assert sched.submit_all(backlog) is Admission.OK          # n=64: 64 places
        assert sched.submit(seq(p, params, Sink("B", order), done, b"B"))
        gate.set()
        for _ in range(65):
            assert done.acquire(timeout=120)
    finally:
        gate.set()
        sched.stop()
    assert order.index("B") <= 2, order[:5]            # not behind A's 63 waiting choices (FIFO: 64th)


class Timeline(Sink):
    """Records ("start" | "end", name) on the model thread, in the order they happen."""

    def __init__(self, name: str, events: list) -> None:
        super().__init__(name)
        self.events = events

    def start(self, cached_tokens, plan_chunks):
        self.events.append(("start", self.name))

    def end(self, reason, output_tokens):
        self.events.append(("end", self.name))
        return reason


def most_at_once(events: list, name: str) -> int:
    running = peak = 0
    for what, who in events:
        if who == name:
            running += 1 if what == "start" else -1
            peak = max(peak, running)
    return peak


@pytest.mark.parametrize("other_tenant_seen", [True, False])
def test_one_tenant_leaves_a_row_free_once_another_tenant_is_seen(tiny, other_tenant_seen):
    assert [spare_rows(n) for n in (1, 2, 8, 9, 16, 64)] == [0, 1, 1, 2, 2, 8]
    sched = scheduler(tiny, max_batch=2)
    done = threading.Semaphore(0)
    events: list = []
    p = prompt("Hello there")
    try:
        if other_tenant_seen:
            assert sched.submit(seq(p, SamplingParams(max_tokens=2, temperature=0), Timeline("B", events), done, b"B"))
            assert done.acquire(timeout=60)
        backlog = [seq(p, SamplingParams(max_tokens=6, temperature=0), Timeline("A", events), done, b"A")
                   for _ in range(4)]
        assert sched.submit_all(backlog) is Admission.OK
        for _ in range(4):
            assert done.acquire(timeout=60)
    finally:
        sched.stop()
    # with B seen, A holds at most max_batch - 1 rows (one is kept for B); alone, A has both
    assert most_at_once(events, "A") == (1 if other_tenant_seen else 2)


def test_vectorised_logit_bias_and_penalties_equal_their_definition():
    logits = torch.linspace(-3, 3, 12)
    params = SamplingParams(max_tokens=4, logit_bias=((5, 2.0), (5, 1.0), (7, -100.0), (11, 0.5), (12, 9.0),
                                                      (10**6, 5.0)), presence_penalty=0.5, frequency_penalty=0.25)
    s = Sampler(params, torch.device("cpu"))
    s.counts = {3: 2, 5: 1}
    want = logits.clone()
    for tok, b in params.logit_bias:
        if tok < 12:                               # ids outside the vocabulary are ignored
            want[tok] += b
    for tok, c in s.counts.items():
        want[tok] -= 0.25 * c + 0.5
    for _ in range(2):                             # the bias tensors are made once, then reused
        assert torch.allclose(s._adjusted(logits), want)
    assert torch.equal(logits, torch.linspace(-3, 3, 12))      # the step's shared logits are untouched


def test_the_stop_scanners_held_suffix_equals_the_one_length_at_a_time_definition():
    def held(buf: str, stops: tuple[str, ...]) -> int:
        return max([k for s in stops for k in range(1, min(len(s) - 1, len(buf)) + 1) if buf.endswith(s[:k])],
                   default=0)

    rng = random.Random(28)
    for _ in range(5000):
        stops = ["".join(rng.choice("ab-") for _ in range(rng.randint(1, 8))) for _ in range(rng.randint(1, 4))]
        buf = "".join(rng.choice("ab-") for _ in range(rng.randint(0, 10)))
        m = StopMatcher(stops)
        assert m._held_suffix(buf) == held(buf, m.stops), (stops, buf)


def test_validate_only_compiler_refuses_a_bad_schema_and_passes_a_good_one():
    """model.backend: upstream validates the schema (off the loop) and forwards it: no grammar."""
    compiler = GrammarCompiler(None)
    good = OutputConstraint("json", json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}}),
                            param="response_format")
    bad = OutputConstraint("json", json.dumps({"type": "no-such-type"}), param="response_format")

    async def main():
        assert await compiler.compile(good) is None
        with pytest.raises(ApiError) as info:
            await compiler.compile(bad)
        assert info.value.status == 400 and info.value.param == "response_format"

    asyncio.run(main())
    compiler.close()
