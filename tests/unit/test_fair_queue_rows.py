"""Fair share of the batch rows among any number of tenants (zccp.serving.fair_queue): the tenant
holding the fewest rows is next, and once several tenants are seen the last spare_rows rows
go only to a tenant holding none, so tenants that filled the batch between them cannot make
the next one wait for their answers to end. FairQueue.next() on its own, then the real
scheduler thread with the null backend (fixed replies, a per-step delay)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest
import torch

from zccp.serving.fair_queue import FairQueue, spare_rows
from zccp.observe.metrics import EngineMetrics
from zccp.model.null import NullBackend
from zccp.serving.planner import Planner
from zccp.serving.scheduler import BatchLimits, BatchScheduler, Sequence
from zccp.shared_types import SamplingParams


@dataclass(eq=False)
class Row:
    """What FairQueue reads of a sequence: its tenant."""

    tenant: bytes


def admit_all(q: FairQueue, held: list, max_batch: int) -> list[bytes]:
    """Admit while next() allows and a row is free (the scheduler's loop, without the KV
    bound); the tenants in the order admitted."""
    order = []
    while len(held) < max_batch and (s := q.next(held, max_batch)) is not None:
        q.pop(s)
        held.append(s)
        order.append(s.tenant)
    return order


def queued(q: FairQueue, tenant: bytes, count: int) -> None:
    assert q.reserve(tenant, count).value == "ok"
    for _ in range(count):
        q.append(Row(tenant))


def test_tenants_take_turns_fewest_rows_first():
    q = FairQueue(64)
    queued(q, b"A", 6)
    queued(q, b"B", 6)
    held: list = []
    order = admit_all(q, held, 8)
    # one each in turn, until only the spare row (8 // 8 = 1) is left: it is nobody's second
    assert order == [b"A", b"B"] * 3 + [b"A"]
    assert len(held) == 8 - spare_rows(8)


@pytest.mark.parametrize("hogs, rows", [(2, 16), (3, 32)])
def test_hogs_that_filled_the_batch_leave_rows_for_a_new_tenant(hogs, rows):
    q = FairQueue(128)
    held: list = []
    queued(q, b"victim", 1)    # the victim was served before (an engine that saw one tenant keeps every row)
    q.pop(q.next(held, rows))  # admitted, answered, gone
    for i in range(hogs):      # each hog arrives after the others have taken what they could
        queued(q, b"hog%d" % i, 32)
        admit_all(q, held, rows)
    # the first hog took all but the spare rows; each later one a single spare row
    assert len(held) == rows - spare_rows(rows) + hogs - 1 < rows
    queued(q, b"victim", 1)
    assert admit_all(q, held, rows)[0] == b"victim"    # admitted at once, the hogs' backlog still waiting
    assert len(q) > 0 and {s.tenant for s in q} == {b"hog%d" % i for i in range(hogs)}


def test_more_newcomers_than_spare_rows_wait_for_a_row_to_end():
    """The bound without pre-emption: the spare rows serve spare_rows(max_batch) tenants
    arriving while the rows are held; the next waits for one answer to end, then is next."""
    q = FairQueue(64)
    queued(q, b"A", 20)
    queued(q, b"B", 20)
    held: list = []
    admit_all(q, held, 16)
    for t in (b"C", b"D", b"E"):
        queued(q, t, 1)
    assert admit_all(q, held, 16) == [b"C", b"D"]
    held.remove(next(s for s in held if s.tenant == b"A"))
    assert admit_all(q, held, 16) == [b"E"]            # the first row freed is E's


def test_a_freed_row_refills_the_spare_ones_before_a_second_row():
    q = FairQueue(64)
    queued(q, b"A", 20)
    queued(q, b"B", 20)
    held: list = []
    admit_all(q, held, 16)                       # 14 held, 2 spare
    queued(q, b"C", 1)
    queued(q, b"D", 1)
    assert admit_all(q, held, 16) == [b"C", b"D"]         # newcomers take the spare rows
    held.remove(next(s for s in held if s.tenant == b"A"))
    assert admit_all(q, held, 16) == []          # A's freed row is spare now, not A's or B's next
    held.remove(next(s for s in held if s.tenant == b"B"))
    held.remove(next(s for s in held if s.tenant == b"B"))
    # three free: one above the spare ones, to the tenant holding fewest (A 6, B 5: B)
    assert admit_all(q, held, 16) == [b"B"]


def test_one_tenant_alone_keeps_every_row():
    q = FairQueue(64)
    queued(q, b"A", 10)
    held: list = []
    assert len(admit_all(q, held, 8)) == 8       # an engine that never saw another tenant


# -- the scheduler's thread ---------------------------------------------------------------------


class Events:
    """A sink that records ("start" | "end", tenant) on the model thread."""

    def __init__(self, name: str, events: list, started: threading.Semaphore) -> None:
        self.name, self.events, self.started = name, events, started

    def start(self, cached_tokens, plan_chunks):
        self.events.append(("start", self.name))
        self.started.release()

    def kept(self, tokens):
        pass

    def token(self, token):
        return False

    def end(self, reason, output_tokens):
        self.events.append(("end", self.name))
        return reason

    def flush(self):
        return True

    @property
    def blocked(self):
        return False

    def fail(self, err=None):
        self.events.append(("fail", self.name))

    def abandoned(self, exc):
        pass


@pytest.mark.parametrize("hogs, rows", [(2, 16), (3, 32)])
def test_a_victim_joins_a_batch_that_hostile_tenants_filled(hogs, rows):
    """Each hog queues `rows` answers of 4,000 tokens (5 ms a step: 20 s each) into the batch,
    one hog after the other; the victim's 2-token answer is started and ended before
    any hog's answer ends, while the hogs still have answers waiting."""
    backend = NullBackend(reply="x" * 5000, token_delay_ms=5)
    sched = BatchScheduler(backend, BatchLimits(rows, 128, 512 << 20),
                           Planner(torch.device("cpu"), 512 << 20, 1, 0, 16), None, EngineMetrics())
    events: list = []
    started = threading.Semaphore(0)
    done = threading.Semaphore(0)
    cancel = threading.Event()
    p = torch.tensor([72, 105], dtype=torch.int32)

    def submit(tenant: bytes, count: int, max_tokens: int) -> None:
        seqs = [Sequence(p, p.numpy(), SamplingParams(max_tokens=max_tokens, temperature=0),
                         Events(tenant.decode(), events, started), cancel.is_set, lambda _: done.release(),
                         salt=tenant) for _ in range(count)]
        assert sched.submit_all(seqs).value == "ok"

    try:
        submit(b"victim", 1, 2)    # served once before: an engine that saw one tenant only keeps every row
        assert done.acquire(timeout=30)
        for i in range(hogs):
            before = len([e for e in events if e[0] == "start"])
            submit(b"hog%d" % i, rows, 4000)
            assert started.acquire(timeout=30)               # this hog got a row (its first, at least)
            for _ in range(10):                              # a few steps for it to take what it may
                threading.Event().wait(0.02)
            assert len([e for e in events if e[0] == "start"]) > before
        hog_rows = len([e for e in events if e[0] == "start"]) - 1
        events.clear()
        submit(b"victim", 1, 2)
        while ("end", "victim") not in events:
            assert done.acquire(timeout=30), events[-5:]
        snapshot = list(events)
        waiting = len(sched._waiting)
    finally:
        cancel.set()
        sched.stop()
    assert [e for e in snapshot if e[0] != "start"] == [("end", "victim")]    # no hog answer ended first
    assert waiting > 0                                       # the hogs' backlog was still queued
    assert hog_rows == rows - spare_rows(rows) + hogs - 1      # the first hog all but the spare rows, the others one
