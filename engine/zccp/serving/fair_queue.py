"""The sequences waiting for the model, shared by tenant instead of first in first out.

Two halves (docs/isolation.md, "Fair share"):

- reserve() (any thread) bounds the queue. A request takes as many places as it runs
  sequences (n choices × prompts), all or none. Up to model.max_queue places anyone may
  take; past that, a tenant still below its share (max_queue // tenants waiting) may
  queue, so one tenant's burst cannot turn every other tenant away with 429s. Shares sum
  to max_queue, so the queue never holds more than 2 × max_queue. A request larger than
  max_queue could never be admitted: NEVER (a 400, not a 429 to retry).
- next() (the model thread) picks the sequence to admit: the head of the waiting tenant
  with the fewest sequences admitted (batch rows held), ties to the tenant served least
  recently: round robin over tenants, one sequence each turn, weighted by what each
  holds already (a max-min fair share of the rows). Within a tenant, first in first out.
- spare_rows() are kept for tenants holding no row: a running sequence is never
  pre-empted, so tenants that took every row between them (two tenants each sending a
  batch of long answers) would make the next tenant wait for one of their answers to end.
  Once more than one tenant has been admitted, a tenant that holds a row already is
  admitted only while more than spare_rows(max_batch) rows stay free; a tenant holding
  none takes any free row. However many tenants there are, together they hold at most
  max_batch - spare_rows rows plus the one row each that a newcomer took from the spare
  ones, and a freed row refills the spare ones before anyone's second row. An engine that
  has only ever served one tenant (no keys, everyone anonymous) keeps every row for it.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from enum import Enum

from zccp.api.bounds import never_fits
from zccp.serving.sequences import Sequence
from zccp.shared_types import ApiError


SERVED_KEPT = 4096        # tenants whose last turn is remembered while they wait for nothing


def spare_rows(max_batch: int) -> int:
    """Batch rows kept free for a tenant holding none: an eighth, at least one (none when
    the batch has a single row)."""
    return 0 if max_batch < 2 else -(-max_batch // 8)


class Admission(Enum):
    OK = "ok"
    FULL = "full"          # try again later (429)
    NEVER = "never"        # more sequences than the queue holds: it can never be queued (400)


def refusal(got: Admission, count: int, max_queue: int) -> ApiError:
    """The answer to a request the queue did not take: a 429 to retry, or (NEVER) the 400 of
    the one rule, zccp.api.bounds.never_fits. Every API's parser applies that rule to what it
    queues (n, prompts x n) and refuses first, so NEVER here only guards a path that forgot to."""
    if got is Admission.NEVER:
        why = never_fits(count, max_queue) or f"this request runs {count} sequences"
        return ApiError(400, "invalid_request_error", f"Invalid 'n': {why}.", param="n")
    return ApiError(429, "rate_limit_error", "the model's queue is full (model.max_queue requests wait already); "
                    "retry shortly")


class FairQueue:
    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self._lock = threading.Lock()
        self._places: Counter[bytes] = Counter()     # reserved and not yet admitted, per tenant (_lock)
        self._total = 0                              # their sum (_lock)
        # the model thread's
        self._waiting: dict[bytes, deque[Sequence]] = {}
        self._served: dict[bytes, int] = {}          # when each tenant was last admitted (a step count)
        self._turn = 0

    # -- any thread ------------------------------------------------------------------------

    def reserve(self, tenant: bytes, count: int) -> Admission:
        """Places for `count` sequences of `tenant`, all or none."""
        if count > self.max_queue:
            return Admission.NEVER
        with self._lock:
            if self._total + count > self.max_queue:
                tenants = len(self._places) + (tenant not in self._places)
                share = self.max_queue // tenants
                if self._places[tenant] + count > share:
                    return Admission.FULL
            self._places[tenant] += count
            self._total += count
        return Admission.OK

    def release(self, tenant: bytes, count: int = 1) -> None:
        """Places given back: admitted, or dropped while waiting."""
        with self._lock:
            left = self._places[tenant] - count
            if left > 0:
                self._places[tenant] = left
            else:
                del self._places[tenant]
            self._total -= count

    @property
    def reserved(self) -> int:
        return self._total

    # -- the model thread ------------------------------------------------------------------

    def append(self, seq: Sequence) -> None:
        self._waiting.setdefault(seq.tenant, deque()).append(seq)

    def __len__(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def __iter__(self) -> Iterator[Sequence]:
        for q in list(self._waiting.values()):
            yield from q

    def next(self, admitted: Iterable[Sequence], max_batch: int | None = None) -> Sequence | None:
        """The sequence whose turn it is (not removed: pop() it once it fits), None when
        nothing waits or when the waiting tenant whose turn it is holds a row already and
        only spare rows are free (applied once more than one tenant has been admitted).
        admitted: the sequences holding batch rows now; max_batch: the batch's rows."""
        if not self._waiting:
            return None
        held = Counter(s.tenant for s in admitted)
        tenant = min(self._waiting, key=lambda t: (held[t], self._served.get(t, -1)))
        if max_batch is not None and held[tenant] and len(self._served) > 1:
            if max_batch - held.total() <= spare_rows(max_batch):
                return None                      # the rows left are kept for a tenant holding none
        return self._waiting[tenant][0]

    def pop(self, seq: Sequence) -> None:
        """`seq` (the one next() gave) leaves the queue to be admitted."""
        self.remove(seq)
        self._turn += 1
        self._served[seq.tenant] = self._turn

    def remove(self, seq: Sequence) -> None:
        """`seq` leaves the queue (admitted, or cancelled while waiting); its place is freed."""
        q = self._waiting[seq.tenant]
        q.remove(seq)
        if not q:
            del self._waiting[seq.tenant]
            if len(self._served) > SERVED_KEPT:      # the turns of tenants gone quiet are forgotten
                self._served = {t: n for t, n in self._served.items() if t in self._waiting}
        self.release(seq.tenant)
