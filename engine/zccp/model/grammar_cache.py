"""Grammars compiled off the event loop, once per schema, under a time budget.

A JSON schema (or a forced tool call's schemas) becomes an llguidance matcher in a
worker thread (llguidance drops the GIL while it builds one), never on the asyncio loop
and never on the model thread: the flow awaits compile() and hands the CompiledGrammar
to the scheduler, whose sequences start from a copy of it. Clients send the same schema
again and again, so the outcome, compiled or refused, is kept in an LRU keyed by the
constraint's canonical bytes (the schema as the API layer re-serialised it); identical
schemas compiling at the same time share one compile.

The budget: a compile that has not ended COMPILE_BUDGET_S after it was asked for is a
400 for the request that waits (its thread runs on). The verdict "too slow", kept so the
same schema is refused at once next time, is the schema's own: its compile took more than
the budget in CPU time on its thread, not in wall time shared with other compiles.

Shared by tenant: a tenant compiles one schema at a time (its next ones wait in its own
lane), and every tenant with a schema to compile gets a thread of its own, up to WORKERS
of them, at a lower CPU priority than the event loop and the model thread: tenants
compiling slow schemas share the CPU with a third tenant's small one instead of holding
every worker until its 400. A compile whose budget ran out while it waited in its lane
is not started (nothing is cached: it was never tried). The compiled grammars are shared:
any tenant's request for a schema compiled before is a lookup. docs/isolation.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zccp.model.grammar import CompiledGrammar, GrammarVocab, compile_error, invalid_schema
from zccp.shared_types import ApiError, OutputConstraint

if TYPE_CHECKING:
    from zccp.observe.metrics import EngineMetrics

COMPILE_BUDGET_S = 2.0      # longer than this is a 400 (a large oneOf takes seconds)
CACHE_ENTRIES = 256         # compiled grammars kept (each holds llguidance's lexer and grammar)
WORKERS = 8                 # compiles at a time (one per tenant); more wait in the pool's queue
NICE = 5                    # how much lower the compile threads' CPU priority is


@dataclass(frozen=True)
class Verdict:
    """One schema's compile: the grammar (None: validated only, or refused) or why not."""

    grammar: CompiledGrammar | None
    error: str | None
    seconds: float


def constraint_key(c: OutputConstraint) -> bytes:
    h = hashlib.sha256(c.kind.encode())
    for part in (c.schema, *(x for name, params in c.tools for x in (name, params))):
        h.update(b"\0" if part is None else b"\1%d\1" % len(part) + part.encode())
    return h.digest()


def _lower_priority() -> None:
    """A compile thread yields the CPU to the event loop and the model thread (Linux: a
    thread's nice value is its own)."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + NICE))
    except (AttributeError, OSError):
        pass                                 # not Linux, or not allowed: the default priority


class _Expired(Exception):
    """A compile whose waiters' budget ran out before its tenant's lane let it start."""


class GrammarCompiler:
    """compile() on the event loop; the compiling on WORKERS threads. vocab: the backend's
    grammar vocabulary (built on first use, in a worker), or None for a backend that only
    needs the schema validated (upstream: the constraint is forwarded)."""

    def __init__(self, vocab: Callable[[], GrammarVocab] | None, budget_s: float = COMPILE_BUDGET_S,
                 entries: int = CACHE_ENTRIES, workers: int = WORKERS, metrics: EngineMetrics | None = None) -> None:
        self._vocab = vocab
        self.budget_s = budget_s
        self._entries = entries
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="zccp-grammar", initializer=_lower_priority)
        self._metrics = metrics
        # only touched on the loop
        self._cache: OrderedDict[bytes, Verdict] = OrderedDict()
        self._running: dict[bytes, asyncio.Future[Verdict]] = {}
        self._lanes: dict[bytes, asyncio.Lock] = {}          # per tenant: one compile at a time
        self._in_lanes: Counter[bytes] = Counter()            # compiles holding or awaiting each lane
        self.compiles = 0                       # compiles asked for (the cache's misses)

    async def compile(self, c: OutputConstraint, tenant: bytes = b"") -> CompiledGrammar | None:
        """The compiled grammar of `c` (None when only validated); ApiError 400 naming
        c.param when the compiler refuses it or it takes longer than the budget. tenant:
        whose lane a compile waits in (the prefix cache's salt; b"" the anonymous)."""
        key = constraint_key(c)
        verdict = self._cache.get(key)
        if verdict is not None:
            self._cache.move_to_end(key)
        else:
            fut = self._running.get(key)
            if fut is None:
                fut = asyncio.ensure_future(self._in_lane(c, tenant, time.monotonic() + self.budget_s))
                self._running[key] = fut
                fut.add_done_callback(lambda f: self._settle(key, f))
                self.compiles += 1
                self._count(compiles=1)
            try:
                # shielded: a request that stops waiting does not cancel its twins' compile
                verdict = await asyncio.wait_for(asyncio.shield(fut), self.budget_s)
            except (TimeoutError, _Expired):
                raise self._too_slow(c) from None
        if verdict.seconds > self.budget_s:
            raise self._too_slow(c)
        if verdict.error is not None:
            raise invalid_schema(c.param, verdict.error)
        return verdict.grammar

    @property
    def compiling(self) -> int:
        """Compiles asked for and not ended (running, or waiting in a lane or for a worker)."""
        return len(self._running)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _in_lane(self, c: OutputConstraint, tenant: bytes, deadline: float) -> Verdict:
        lane = self._lanes.setdefault(tenant, asyncio.Lock())
        self._in_lanes[tenant] += 1
        try:
            async with lane:
                if time.monotonic() >= deadline:
                    raise _Expired               # its first asker's budget ran out in the lane (twins with it)
                return await asyncio.wrap_future(self._pool.submit(self._build, c))
        finally:
            self._in_lanes[tenant] -= 1
            if not self._in_lanes[tenant]:
                del self._in_lanes[tenant], self._lanes[tenant]      # a quiet tenant's lane is not kept

    # -- a worker thread ------------------------------------------------------------------

    def _build(self, c: OutputConstraint) -> Verdict:
        vocab = self._vocab() if self._vocab is not None else None
        t0 = time.thread_time()        # this thread's CPU: the schema's cost, whoever else compiles
        grammar, error = compile_error(c, vocab)
        return Verdict(grammar, error, time.thread_time() - t0)

    # -- the loop -------------------------------------------------------------------------

    def _count(self, compiles: int = 0) -> None:
        if self._metrics is not None:
            self._metrics.grammar_compiles.inc(compiles)
            self._metrics.grammar_compiling.set(len(self._running))

    def _settle(self, key: bytes, fut: asyncio.Future[Verdict]) -> None:
        self._running.pop(key, None)
        self._count()
        if fut.cancelled() or fut.exception() is not None:
            return                               # not kept: the next request tries again
        self._cache[key] = fut.result()
        while len(self._cache) > self._entries:
            self._cache.popitem(last=False)

    def _too_slow(self, c: OutputConstraint) -> ApiError:
        return ApiError(400, "invalid_request_error",
                        f"{c.param}: the JSON schema is too complex: compiling it takes longer than "
                        f"{self.budget_s:g} s", c.param or None)
