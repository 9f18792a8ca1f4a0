"""The model thread: continuous batching for every backend.

Every running sequence advances by one token per step, all of them in ONE forward
(zccp.model.base.DecodeBatch); sequences join and leave the batch between steps.
A step is:

  1. take new sequences from the inbox into the waiting queue, shared by tenant
     (zccp.serving.fair_queue: submit() refuses past a tenant's share of model.max_queue, the
     flow answers 429; a request larger than the queue, a 400);
  2. drop cancelled sequences wherever they are (client gone, deadline, nginx's
     deadline_ns = 1): a batch row is freed at once;
  3. flush the response bytes a full ring held back; a sequence whose ring was full
     was parked out of the batch and joins again once nginx has acked room, so one
     slow client never stalls the thread or the others;
  4. admit waiting sequences, the tenant holding the fewest rows first (round robin
     among equals, zccp.serving.fair_queue), while the batch has rows (model.max_batch) and the KV
     bound (model.kv_cache_mb) holds for every admitted sequence at its longest
     (prompt + max_tokens, padded to the longest row, with the KV buffers' spare
     room), the last fair_queue.spare_rows() rows kept for a tenant holding none once
     several tenants are seen (zccp.serving.admission); reuse cached prefix blocks;
  5. prefill what the step's token budget leaves beside the running rows (model.step_tokens,
     at least one chunk; zccp.serving.prefill_step), so a long prompt delays the running streams by
     one chunk per step, not by all of it (a prompt alone in the model, with no stream to
     delay, is not cut by the budget); the next chunks of several waiting sequences go
     into ONE forward, padded to the longest (ModelBackend.prefill_many), as long as the
     padded rows fit the chunk and the planner's group size (Planner.group) and are at most
     half padding, and their pasts padded to the longest add no more (Planner.group_rows);
     each group's first tokens are sent as soon as its forward ends; a sequence whose
     prefill completes samples its first token and joins;
  6. one decode forward for the batch; each row's token goes to its sink.

A finished sequence leaves the batch; its sink may still hold bytes for a full ring,
which are flushed before on_done runs. One thread, because the model is the serial
resource and torch parallelises inside each forward.

A sequence's failure is its own (docs/isolation.md): a sampler, a grammar or a sink that
raises for one row fails that sequence alone (its ApiError, or a 500, through its slot,
which is released at once) and the others go on; a prefill group that fails is retried
one sequence at a time. Only a forward of the whole batch failing fails its rows.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zccp.serving.admission import Admitting
from zccp.transport.doorbell import Connection
from zccp.serving.fair_queue import Admission, FairQueue
from zccp.observe.metrics import EngineMetrics
from zccp.model.base import DecodeBatch, ModelBackend
from zccp.serving.planner import Planner
from zccp.serving.prefill_step import OUT, PARK, RUN, Prefilling
from zccp.serving.prefix_cache import PrefixCache
from zccp.transport.ring_writer import SlotAbandoned
from zccp.serving.sequences import BatchLimits, Sequence, Sink
from zccp.shared_types import ApiError, StopReason

if TYPE_CHECKING:
    import torch

    from zccp.model.sampling import Choice, Sampler

__all__ = ["Admission", "BatchLimits", "BatchScheduler", "Sequence", "Sink"]

log = logging.getLogger("zccp.scheduler")

IDLE_POLL_S = 0.002        # how often parked or draining sequences are looked at when nothing runs
# a decode step of at most this many rows writes its streamed notices from the model thread
# (doorbell.Connection.direct_writes); a wider one leaves them to the event loop
DIRECT_NOTICE_ROWS = 2




class BatchScheduler(Admitting, Prefilling):
    def __init__(self, backend: ModelBackend, limits: BatchLimits, planner: Planner,
                 prefix: PrefixCache | None, metrics: EngineMetrics, name: str = "zccp-model") -> None:
        self.backend = backend
        self.limits = limits
        self.planner = planner
        self.prefix = prefix
        self.metrics = metrics
        self._inbox: queue.SimpleQueue[Sequence | None] = queue.SimpleQueue()
        self._waiting = FairQueue(limits.max_queue)      # submitted, not yet admitted
        self._live: set[Sequence] = set()  # admitted and not done: what a failed step must answer
        self._prefilling: deque[Sequence] = deque()
        self._rows: list[Sequence] = []   # row i of the batch
        self._batch: DecodeBatch = backend.new_batch()
        self._parked: list[Sequence] = []
        self._draining: list[Sequence] = []
        self._stopping = False
        self._steps = metrics.decode_steps.series()
        self._shown: tuple[int, int, int, int] | None = None   # the batch gauges as last set
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # -- any thread ----------------------------------------------------------------------

    def submit(self, seq: Sequence) -> bool:
        """Queue a sequence; False when its tenant's share of the queue is taken."""
        return self.submit_all([seq]) is Admission.OK

    def submit_all(self, seqs: list[Sequence]) -> Admission:
        """Queue one request's sequences (its n choices), all or none (zccp.serving.fair_queue)."""
        if not seqs:
            return Admission.OK
        got = self._waiting.reserve(seqs[0].tenant, len(seqs))
        if got is Admission.OK:
            for seq in seqs:
                self._inbox.put(seq)
        return got

    def stop(self, timeout: float = 10.0) -> None:
        self._inbox.put(None)
        self._thread.join(timeout)

    # -- the model thread ------------------------------------------------------------------

    def _computing(self) -> bool:
        return bool(self._waiting or self._prefilling or self._rows)

    def _quiet(self) -> bool:
        """No stream in the model and none waiting for it: no row decodes, is parked on a full
        ring or drains its last bytes, and the queue is empty."""
        return not (self._rows or self._parked or self._draining or self._waiting)

    def _active(self) -> list[Sequence]:
        """The admitted sequences that hold (or will hold) a batch row."""
        return [*self._prefilling, *self._rows, *self._parked]

    def _run(self) -> None:
        with self.backend.inference():
            while self._take():
                try:
                    self._step()
                except BaseException:   # a bug must not kill the thread: fail what was admitted
                    log.exception("model step failed")
                    self._fail_all()

    def _take(self) -> bool:
        """Move the inbox into the waiting queue; False once stopped and idle. Blocks
        while there is nothing at all to do; polls while only full rings are pending."""
        while True:
            try:
                if self._computing():
                    if self._inbox.empty():      # the usual decode step: no queue.Empty raised
                        return True
                    item = self._inbox.get_nowait()
                elif self._parked or self._draining:
                    item = self._inbox.get(timeout=IDLE_POLL_S)
                elif self._stopping:
                    return False
                else:
                    item = self._inbox.get()
            except queue.Empty:
                return True
            if item is None:
                self._stopping = True
            else:
                self._waiting.append(item)

    def _step(self) -> None:
        self._reap()
        self._flush()
        # a decode step with nothing waiting or prefilling skips both (the planner's chunk
        # reads the device's free memory: a device call per token otherwise)
        if self._waiting:
            self._admit()
        if self._prefilling:
            self._prefill()
        self._decode()
        # the batch gauges only when one moved (a step's token is no reason to set four)
        shown = (len(self._rows), len(self._waiting) if self._waiting else 0, len(self._parked), self._batch.nbytes)
        if shown != self._shown:
            self._shown = shown
            m = self.metrics
            m.batch_rows.set(shown[0])
            m.queue_waiting.set(shown[1])
            m.parked.set(shown[2])
            m.kv_bytes.set(shown[3])

    # -- 2. cancellation ----------------------------------------------------------------

    def _reap(self) -> None:
        if self._waiting:
            for seq in [s for s in self._waiting if s.cancelled()]:
                self._waiting.remove(seq)
                self._drop(seq)
        gone = [i for i, s in enumerate(self._rows) if s.cancelled()]
        if gone:
            leaving = [self._rows[i] for i in gone]
            self._leave(set(gone))
            for seq in leaving:
                self._drop(seq)
        for lst in (self._prefilling, self._parked, self._draining):
            if lst:
                for seq in [s for s in lst if s.cancelled()]:
                    lst.remove(seq)
                    self._drop(seq)

    def _drop(self, seq: Sequence) -> None:
        seq.state = seq.ids = seq.input_ids = None
        seq.sink.abandoned(SlotAbandoned("cancelled while in the model"))
        self._done(seq, None)

    # -- 3. full rings --------------------------------------------------------------------

    def _flush(self) -> None:
        if not (self._draining or self._parked):
            return
        for seq in list(self._draining):
            if self._sink_call(seq, seq.sink.flush):
                self._draining.remove(seq)
                self._done(seq, seq.result)
        for seq in list(self._parked):
            if self._sink_call(seq, seq.sink.flush):
                self._parked.remove(seq)
                self._batch.join(seq.state)
                seq.state = None
                self._rows.append(seq)

    def _sink_call(self, seq: Sequence, fn: Callable[..., Any], *args: Any) -> Any:
        """A sink call; if the slot is no longer ours (or writing fails) the sequence
        ends here, out of every list but the batch (rows leave in _decode): None."""
        try:
            return fn(*args)
        except SlotAbandoned as exc:
            self._forget(seq)
            seq.sink.abandoned(exc)
            self._done(seq, None)
        except ApiError as err:                  # e.g. a tool parser refusing this answer
            self._fail(seq, err)
        except Exception:
            log.exception("writing the answer failed")
            self._fail(seq)
        return None

    def _forget(self, seq: Sequence) -> None:
        for lst in (self._prefilling, self._parked, self._draining):
            if seq in lst:
                lst.remove(seq)
        seq.state = seq.ids = None

    # -- 6. decode ---------------------------------------------------------------------------

    def _decode(self) -> None:
        rows = self._rows
        if not rows:
            return
        try:
            toks = self._choose(self._batch.decode([s.last for s in rows]), [s.sampler for s in rows])
        except Exception:
            log.exception("decode step failed")
            self._fail_rows()
            return
        self._steps.inc()
        Connection.direct_writes = len(rows) <= DIRECT_NOTICE_ROWS
        leaving: set[int] = set()
        for i, (seq, tok) in enumerate(zip(rows, toks, strict=False)):
            outcome = self._emit(seq, tok)
            if outcome == RUN:
                continue
            leaving.add(i)
            if outcome == PARK:
                seq.state = self._batch.park(i)
                self._parked.append(seq)
        if leaving:
            self._leave(leaving)

    def _choose(self, out: torch.Tensor | list[int], samplers: list[Sampler | None]) -> list[Choice]:
        """Each row's next token: sampled from its logits, or the backend's own choice; a
        row whose sampler failed has its exception instead (sample_rows)."""
        if isinstance(out, list):
            return list(out)
        ready = [s for s in samplers if s is not None]
        assert len(ready) == len(samplers)      # every running sequence got its sampler at admission
        from zccp.model.sampling import sample_rows   # a backend with logits: torch is there

        return sample_rows(self.backend.process_logits(out), ready)

    def _leave(self, rows: set[int]) -> None:
        keep = [i for i in range(len(self._rows)) if i not in rows]
        self._batch.leave(keep)
        self._rows = [self._rows[i] for i in keep]

    # -- one token ---------------------------------------------------------------------------

    def _emit(self, seq: Sequence, tok: Choice) -> str:
        """Deliver a sampled token: RUN (keeps decoding), PARK (its ring is full) or OUT
        (finished, or failed: a row whose sampling failed ends alone, with its error)."""
        if isinstance(tok, Exception):
            if not isinstance(tok, ApiError):
                log.error("sampling failed for one sequence", exc_info=tok)
            self._fail(seq, tok if isinstance(tok, ApiError) else None)
            return OUT
        if tok in self.backend.eos_ids:
            self._finish(seq, "end_turn")
            return OUT
        seq.produced += 1
        seq.last = tok
        drawn = seq.sampler.last if seq.sampler is not None else None
        # the logprobs only when asked for (a sink that never asks takes the token alone)
        done = self._sink_call(seq, seq.sink.token, tok, *(() if drawn is None else (drawn,)))
        if done is None:
            return OUT                                        # abandoned or failed
        if done:
            self._finish(seq, "stop_sequence")
        elif (stopped := tok in seq.params.stop_token_ids) or seq.produced >= seq.params.max_tokens:
            self._finish(seq, "end_turn" if stopped else "max_tokens")   # vLLM's stop_token_ids: the token kept
        elif seq.sink.blocked:
            return PARK
        else:
            return RUN
        return OUT

    def _finish(self, seq: Sequence, reason: StopReason) -> None:
        seq.result = self._sink_call(seq, seq.sink.end, reason, seq.produced)
        if seq.result is None:
            return
        flushed = self._sink_call(seq, seq.sink.flush)
        if flushed:
            self._done(seq, seq.result)
        elif flushed is not None:
            self._draining.append(seq)

    def _done(self, seq: Sequence, value: Any) -> None:
        self._live.discard(seq)
        try:
            seq.on_done(value)
        except BaseException:
            log.exception("completion callback failed")

    # -- failures ------------------------------------------------------------------------------

    def _fail(self, seq: Sequence, err: ApiError | None = None) -> None:
        """One sequence fails, alone: its error through its slot, its place everywhere but a
        batch row freed (a row leaves with the step's leavers: its outcome is OUT)."""
        self._forget(seq)
        seq.input_ids = None
        try:
            seq.sink.fail(*(() if err is None else (err,)))   # a sink that never names an error takes none
        except Exception:
            log.exception("answering a failed sequence failed")
        self._done(seq, None)

    def _fail_rows(self) -> None:
        """The batch's forward failed: every row in it (nothing else) fails."""
        rows, self._rows = self._rows, []
        self._batch = self.backend.new_batch()
        for seq in rows:
            self._fail(seq)

    def _fail_all(self) -> None:
        """A step failed outside any one sequence's part (a bug): every admitted sequence,
        wherever the step had put it, is answered, so none holds its slot to the deadline."""
        self._fail_rows()
        for seq in list(self._live):
            self._fail(seq)
        self._prefilling.clear()
        self._parked.clear()
        self._draining.clear()

