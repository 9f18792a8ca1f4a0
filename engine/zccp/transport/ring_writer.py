"""Writing a response into a slot's response region, a ring of response_cap bytes.

Bytes go in at `response_len % response_cap`; response_len (cumulative) is
committed after the bytes, then a NOTICE tells nginx. nginx consumes, then
advances response_acked; when the ring is full the writer waits for that ack,
so a response of any size streams through a fixed region: never an overflow,
never a silent truncation. The model thread never waits: it writes with
write_nowait(), which keeps what does not fit for flush_pending() (the scheduler
parks that sequence until nginx has acked room).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from zccp.transport.abi import Flag, State
from zccp.transport.arena import Arena, SlotView


class SlotAbandoned(Exception):
    """The slot is no longer ours (generation moved on, deadline passed, client gone)."""


# notify(response_len, final, status)
Notify = Callable[[int, bool, int], None]
# later(delay_s, fn): fn on the event loop after delay_s
Later = Callable[[float, Callable[[], None]], object]

log = logging.getLogger("zccp.ring_writer")


class ResponseWriter:
    ACK_POLL_S = 0.0002
    ACK_POLL_MAX_S = 0.005

    def __init__(self, arena: Arena, view: SlotView, generation: int, notify: Notify, cancelled: Callable[[], bool],
                 later: Later | None = None, give_up_s: float = 60.0) -> None:
        """later(delay_s, fn): run fn after delay_s on the caller's event loop. With it,
        write() and finish() never wait: what the ring cannot take now is written as
        nginx acks room, from timers (the event loop must never sleep for a slow client
        or a writer that stopped acking), and finish() follows the last byte; the
        writer gives up after give_up_s without room, or once the slot is not ours."""
        self._later = later
        self._give_up_s = give_up_s
        self._final: int | None = None       # a deferred finish(): the state to end in
        self._view = view
        self._gen = generation
        self._notify = notify
        self._cancelled = cancelled
        self._region = arena.response_region(view)
        self._cap = len(self._region)
        self._total = 0
        self._pending = bytearray()          # write_nowait's bytes the ring had no room for
        # (end offset, output tokens) per write not yet wholly committed: meta.committed_mark
        # names the tokens whose bytes are in the ring (nginx settles early endings from it)
        self._marks: deque[tuple[int, int]] = deque()
        self._tokens = 0
        self.started = False
        self.status = 0

    def owned(self) -> bool:
        """Whether the slot is still at the generation this writer answers: every write to
        it, bytes or metadata, is conditioned on it (a claim nginx gave up on is another
        request's slot)."""
        return self._view.header.generation == self._gen

    def _check_owner(self) -> None:
        if self._view.header.generation != self._gen or self._cancelled():   # owned(), inlined
            raise SlotAbandoned(f"slot {self._view.index} generation {self._gen}")

    def set_meta(self, **fields: int) -> bool:
        """Write the slot's meta fields (cache_status, cache_ttl_s, ...) while the slot is
        ours; False, writing nothing, once it is not."""
        if not self.owned():
            return False
        meta = self._view.meta
        for name, value in fields.items():
            setattr(meta, name, value)
        return True

    def count_tokens(self, tokens: int) -> None:
        """meta.completion_len = tokens while the slot is ours and its client is there: nginx
        settles a client that left at this count once it freed the slot, so a token the model
        thread made after nginx's hang-up (deadline_ns = 1, before the free) is not counted."""
        if self._view.header.generation == self._gen and not self._cancelled():
            self._view.meta.completion_len = tokens

    def begin(self, status: int, sse: bool) -> None:
        """Status and content kind; fixed once the first byte is committed."""
        self._check_owner()
        h = self._view.header
        h.status = status
        h.flags = (h.flags | Flag.RESPONSE_SSE) if sse else (h.flags & ~Flag.RESPONSE_SSE)
        h.state = State.STREAMING
        self.status = status
        self.started = True

    def _room(self) -> int:
        """Bytes the ring can take now (raises SlotAbandoned when it is not ours)."""
        self._check_owner()
        acked = self._view.header.response_acked
        if acked > self._total:
            raise SlotAbandoned(f"slot {self._view.index}: response_acked {acked} > committed {self._total}")
        return self._cap - (self._total - acked)

    def _wait_for_room(self, need: int) -> int:
        delay = self.ACK_POLL_S
        while True:
            room = self._room()
            if room >= min(need, self._cap) or room >= self._cap // 4:
                return room
            time.sleep(delay)
            delay = min(delay * 2, self.ACK_POLL_MAX_S)

    def _put(self, view: memoryview, room: int, notify: bool = True, checked: bool = False) -> int:
        """Commit up to `room` bytes of view (and tell nginx); how many were committed.
        checked: the caller checked ownership just before (nothing in between)."""
        n = min(room, len(view))
        if n <= 0:
            return 0
        if not checked:
            self._check_owner()   # before the bytes go in: the ring may be another request's
        pos = self._total % self._cap
        first = min(n, self._cap - pos)
        if first == len(view):           # the usual write: all of it, no wrap (no slice made)
            self._region[pos : pos + first] = view
        else:
            self._region[pos : pos + first] = view[:first]
            if n > first:
                self._region[0 : n - first] = view[first:n]
        # after the copy only the generation: a slot nginx gave up on (and claimed again) must
        # not see response_len move; a cancellation is noticed by _room() and the step's reap
        if self._view.header.generation != self._gen:
            raise SlotAbandoned(f"slot {self._view.index} generation {self._gen}")
        self._total += n
        self._view.header.response_len = self._total & 0xFFFFFFFF
        marks = self._marks
        while marks and marks[0][0] <= self._total:
            self._tokens = marks.popleft()[1]
        # one aligned 64-bit store after response_len: nginx never sees a count without its bytes
        self._view.meta.committed_mark = ((self._total & 0xFFFFFFFF) << 32) | (self._tokens & 0xFFFFFFFF)
        if notify:
            self._notify(self._total, False, self.status)
        return n

    def write(self, data: bytes) -> None:
        """Write all of data, waiting for nginx's acks while the ring is full (with
        `later`: without waiting, the rest follows as room comes)."""
        if not self.started:
            raise RuntimeError("begin() first")  # programmer error
        if self._later is not None:
            return self.write_nowait(data)
        view = memoryview(data)
        while view:
            view = view[self._put(view, self._wait_for_room(len(view))):]

    def answer(self, status: int, sse: bool, data: bytes) -> None:
        """A whole answer at once: begin, write, finish. When it fits the ring, nginx gets
        one notice (the final one) instead of two."""
        self.begin(status, sse)
        acked = self._view.header.response_acked
        n = len(data)
        if acked <= self._total and n <= self._cap - (self._total - acked):
            # begin() checked ownership just now: the copy needs only _put's check after
            # it, and the end only that one (two slot reads per answer, not five)
            self._put(memoryview(data), n, notify=False, checked=True)
            self._end(State.DONE)
            return
        self.write(data)   # too big for the ring now (or acked past it: _room raises)
        self.finish()

    # -- never waiting: the batch scheduler's writes ----------------------------------------

    def write_nowait(self, data: bytes, tokens: int | None = None) -> None:
        """Write what fits now and keep the rest for flush_pending(); never sleeps.
        tokens: the answer's output tokens once these bytes are committed (None: unchanged)."""
        if not self.started:
            raise RuntimeError("begin() first")  # programmer error
        if tokens is not None:
            self._marks.append((self._total + len(self._pending) + len(data), tokens))
        if self._pending:
            self._pending += data
            self.flush_pending()
            return
        view = memoryview(data)
        # _room() checked ownership just now: _put needs only its check after the copy
        done = self._put(view, self._room(), checked=True) if view else 0
        if done < len(view):
            self._pending += view[done:]

    def flush_pending(self) -> bool:
        """Write held-back bytes as far as the ring has room; True when none are left."""
        if self._pending:
            done = self._put(memoryview(self._pending), self._room(), checked=True)
            del self._pending[:done]
        return not self._pending

    @property
    def pending(self) -> int:
        return len(self._pending)

    def finish(self, failed: bool = False) -> None:
        self._check_owner()
        final = State.FAILED if failed else State.DONE
        if self._pending and self._later is not None:
            self._final = final
            deadline = time.monotonic() + self._give_up_s
            self._later(self.ACK_POLL_S, lambda: self._drain(self.ACK_POLL_S, deadline))
            return
        self._end(final)

    def _end(self, final: int) -> None:
        self._view.header.state = final
        self._notify(self._total, True, self.status)

    def _drain(self, delay: float, deadline: float) -> None:
        """A deferred finish: the held-back bytes as room comes, then the final notice."""
        try:
            if self.flush_pending():
                self._check_owner()
                self._end(self._final if self._final is not None else State.DONE)
                return
            if time.monotonic() > deadline or time.time_ns() > self._view.header.deadline_ns:
                raise SlotAbandoned(f"slot {self._view.index}: no room in the response ring "
                                    f"for {self.pending} bytes before the deadline")
        except SlotAbandoned as exc:
            log.info("response abandoned: %s", exc)
            return
        nxt = min(delay * 2, self.ACK_POLL_MAX_S)
        assert self._later is not None   # _drain is scheduled only through _later
        self._later(nxt, lambda: self._drain(nxt, deadline))
