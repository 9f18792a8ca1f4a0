"""The engine process: arena + doorbell + sweeper around the request pipeline."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from dataclasses import dataclass, field

import torch

from zccp.abi import CacheStatus, EngineState, Flag, Op, SlotLayout, State
from zccp.api.common import ParseLimits
from zccp.arena import Arena, SlotError, SlotView
from zccp.config import Config, mask_state_path
from zccp.device import select_device
from zccp.doorbell import Connection, DoorbellServer, Ring, encode_notice
from zccp.metrics import EngineMetrics, MetricsServer
from zccp.model.registry import build_backend
from zccp.cache import CachedAnswer, CacheKeys, Lookup, ResponseCache
from zccp.cache_keys import MaskSource, keys_for
from zccp.pipeline import Completed, PipelineDeps, Prepared, RequestContext, execute, execute_steps, prepare, replay
from zccp.scheduler import RoundRobinScheduler
from zccp.response import ResponseWriter

log = logging.getLogger("zccp.engine")


@dataclass(eq=False)
class Job:
    conn: Connection
    view: SlotView
    generation: int
    cancel: threading.Event = field(default_factory=threading.Event)

    def cancelled(self) -> bool:
        if self.cancel.is_set():
            return True
        deadline = self.view.header.deadline_ns
        if deadline and time.time_ns() > deadline:
            self.cancel.set()
            return True
        return False


def layout_from_config(cfg: Config) -> SlotLayout:
    shm = cfg.shared_memory
    return SlotLayout.build(shm.segment_count, shm.segment_size_kb * 1024, shm.tokens_kb * 1024, shm.response_kb * 1024)


def backend_options(cfg: Config) -> dict[str, object]:
    m = cfg.model
    if m.backend == "null":
        return {"name": m.name, "reply": m.null_reply, "max_context": m.max_context,
                "token_delay_ms": m.null_token_delay_ms}
    return {
        "name": m.name, "seed": m.seed, "d_model": m.d_model, "n_layers": m.n_layers,
        "n_heads": m.n_heads, "d_ff": m.d_ff, "max_context": m.max_context, "prefill_chunk": m.prefill_chunk,
    }


class Engine:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        torch.set_num_threads(cfg.model.threads)
        self.layout = layout_from_config(cfg)
        self.arena = Arena(cfg.shared_memory.name, self.layout, cfg.shared_memory.group)
        self.device = select_device(cfg.gpu, self.arena.mapping())
        self.backend = build_backend(cfg.model.backend, **backend_options(cfg))
        if self.device.device_id >= 0 and hasattr(self.backend, "to"):
            self.backend.to(self.device.torch_device)
        self.metrics = EngineMetrics()
        self.metrics.info.set(1, backend=cfg.model.backend, model=cfg.model.name, device=self.device.name)
        self.deps = PipelineDeps(
            backend=self.backend,
            limits=ParseLimits(
                served_models=frozenset({cfg.model.name}),
                max_tokens_cap=cfg.limits.max_tokens_cap,
                default_max_tokens=cfg.limits.default_max_tokens,
            ),
            input_view=self.device.input_view,
            device_id=self.device.device_id,
            metrics=self.metrics,
        )
        # Views made once: a request never allocates a tensor header for its slot.
        self._tokens = [self.arena.token_tensor(v) for v in self.arena.slots()]
        self._jobs: dict[int, Job] = {}
        # One model thread, interleaving generations token by token; the loop stays free for rings.
        self._model = RoundRobinScheduler()
        # The instant null backend runs on the loop itself: no thread hop per request.
        self._inline = cfg.model.backend == "null" and cfg.model.null_token_delay_ms == 0
        self.doorbell = DoorbellServer(cfg.server.socket_path, self._on_ring, self._on_close, self._on_ping,
                                       cfg.shared_memory.group)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self.cache = ResponseCache(cfg.cache, self.metrics) if cfg.cache.enabled else None
        self.masks = MaskSource(last_good=mask_state_path(cfg)) if cfg.cache.enabled else None
        self._tasks: set[asyncio.Task[None]] = set()
        self.metrics_server = MetricsServer(cfg.server.socket_path + ".metrics", self.metrics, cfg.shared_memory.group)

    # -- doorbell callbacks (event loop thread) -------------------------------------------

    def _reject(self, conn: Connection, ring: Ring, status: int, why: str) -> None:
        self.metrics.rejects.inc(status=str(status))
        log.warning("ring rejected: %s", why, extra={"slot": ring.slot, "generation": ring.generation, "status": status})
        conn.send(encode_notice(Op.REJECT, ring.slot, ring.generation, 0, 1, status))

    def _on_ping(self, conn: Connection) -> None:
        conn.send(encode_notice(Op.PONG, self.layout.slot_count, self.arena.epoch, 0, 1, 200))

    def _on_ring(self, conn: Connection, ring: Ring) -> None:
        self.metrics.rings.inc()
        try:
            view = self.arena.slot(ring.slot)
        except SlotError as exc:
            return self._reject(conn, ring, 400, str(exc))
        h = view.header
        if h.generation != ring.generation:
            return self._reject(conn, ring, 409, f"stale ring: slot generation is {h.generation}")
        if h.state != State.READY:
            return self._reject(conn, ring, 409, f"slot state {h.state} is not READY")
        prev = self._jobs.get(ring.slot)
        if prev is not None:
            if prev.generation == ring.generation:
                return self._reject(conn, ring, 409, "slot rung twice at the same generation")
            # nginx re-claimed the slot (the previous job's final notice went out, or
            # nginx gave up on it) before that job was dropped here: it is over.
            prev.cancel.set()
        try:
            self.arena.validate(view)
        except SlotError as exc:
            return self._reject(conn, ring, 400, str(exc))
        h.state = State.RUNNING
        job = Job(conn, view, ring.generation)
        self._jobs[ring.slot] = job
        conn.jobs.add(job)
        self._start(job)

    def _on_close(self, conn: Connection) -> None:
        for job in list(conn.jobs):
            job.cancel.set()  # the client side went away: stop generating

    # -- one job ---------------------------------------------------------------------------
    # Parsing and tokenizing run on the loop. The model runs on the model thread,
    # except for the instant null backend answering a non-streaming request: that
    # is written inline, with no thread hop. Streams always leave the loop, because
    # a full response ring makes the writer wait for nginx's ack, and the loop must
    # stay free to deliver the notices nginx is waiting for.

    def _context(self, job: Job) -> RequestContext:
        view, conn = job.view, job.conn

        def notify(total: int, final: bool, status: int) -> None:
            conn.send(encode_notice(Op.NOTICE, view.index, job.generation, total & 0xFFFFFFFF, int(final), status))

        return RequestContext(
            view=view,
            generation=job.generation,
            payload=self.arena.payload(view),
            tokens=self._tokens[view.index],
            writer=ResponseWriter(self.arena, view, job.generation, notify, job.cancelled),
            cancelled=job.cancelled,
            context_id=bytes(view.header.context_id).hex(),
        )

    def _start(self, job: Job) -> None:
        ctx = self._context(job)
        prep = prepare(ctx, self.deps)
        if prep is None:
            return self._done(job, ctx)
        if self.cache is None or self.masks is None:
            return self._run_model(job, ctx, prep, None)
        flags = ctx.view.header.flags
        if flags & Flag.NO_CACHE and flags & Flag.NO_STORE:
            # Neither lookup nor store: no keys to compute, no Redis round trip.
            self.metrics.cache.inc(result="BYPASS")
            ctx.view.meta.cache_status = CacheStatus.BYPASS
            return self._run_model(job, ctx, prep, None)
        try:
            keys = keys_for(ctx.view, ctx.payload, prep.req, self.masks, prep.doc)
        except Exception:
            log.exception("cache keys failed; serving uncached", extra={"context_id": ctx.context_id})
            keys = None
        self._spawn(self._serve_cached(job, ctx, prep, keys))

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve_cached(self, job: Job, ctx: RequestContext, prep: Prepared, keys: CacheKeys | None) -> None:
        assert self.cache is not None
        flags = ctx.view.header.flags
        if keys is None or flags & Flag.NO_CACHE:
            lookup = Lookup("BYPASS")
        else:
            lookup = await self.cache.lookup(keys)
        self.metrics.cache.inc(result=lookup.status)
        if ctx.view.header.generation != job.generation or job.cancelled():
            self.metrics.abandoned.inc()
            return self._done(job, ctx)   # nginx gave up while Redis answered
        meta = ctx.view.meta
        meta.cache_status = getattr(CacheStatus, lookup.status)
        if lookup.answer is not None:
            meta.similarity_ppm = int(lookup.similarity * 1_000_000)
            meta.age_s = lookup.age_s
            replay(ctx, self.deps, prep, lookup.answer)
            return self._done(job, ctx)
        store = keys if keys is not None and not flags & Flag.NO_STORE and lookup.status != "ERROR" else None
        self._run_model(job, ctx, prep, store)

    def _run_model(self, job: Job, ctx: RequestContext, prep: Prepared, store: CacheKeys | None) -> None:
        if self._inline and not prep.req.stream:
            self._store(store, execute(ctx, self.deps, prep))
            return self._done(job, ctx)

        def finished(completed: Completed | None) -> None:   # on the model thread
            if store is not None and completed is not None and self._loop is not None:
                self._loop.call_soon_threadsafe(self._store, store, completed)
            self._done(job, ctx)

        self._model.submit(execute_steps(ctx, self.deps, prep), finished)

    def _store(self, keys: CacheKeys | None, completed: Completed | None) -> None:
        """Only complete, successful answers are stored (loop thread)."""
        if keys is None or completed is None or self.cache is None:
            return
        r = completed.result
        answer = CachedAnswer(r.text, r.stop_reason, r.stop_sequence, r.output_tokens, completed.deltas, time.time())
        self._spawn(self.cache.store(keys, answer))

    def _done(self, job: Job, ctx: RequestContext) -> None:
        ctx.payload.release()
        self._finish_job(job)

    def _finish_job(self, job: Job) -> None:
        def drop() -> None:
            if self._jobs.get(job.view.index) is job:
                del self._jobs[job.view.index]
            job.conn.jobs.discard(job)

        if self._loop is None or threading.get_ident() == self._loop_thread:
            drop()
        else:
            self._loop.call_soon_threadsafe(drop)

    # -- sweeper ---------------------------------------------------------------------------

    def sweep(self, now_ns: int | None = None) -> int:
        """Reset slots stuck past cleanup_interval_ms (a worker died, a ring never came)."""
        now_ns = now_ns or time.time_ns()
        limit = self.cfg.shared_memory.cleanup_interval_ms * 1_000_000
        reset = 0
        for view in self.arena.slots():
            h = view.header
            if h.state == State.FREE or not h.timestamp_ns or now_ns - h.timestamp_ns < limit:
                continue
            job = self._jobs.get(view.index)
            if job is not None:
                job.cancel.set()
            log.warning("sweeper: slot stuck in state %d, reset", h.state, extra={"slot": view.index, "generation": int(h.generation)})
            h.state = State.FREE
            self.metrics.sweeps.inc()
            reset += 1
        return reset

    async def _sweeper(self) -> None:
        period = max(self.cfg.shared_memory.cleanup_interval_ms / 4000, 0.05)
        while True:
            await asyncio.sleep(period)
            self.sweep()

    # -- life cycle ------------------------------------------------------------------------

    async def serve(self, stop: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        await self.doorbell.start()
        await self.metrics_server.start()
        self.arena.publish(self.cfg.server.socket_path)
        self.arena.set_engine_state(EngineState.SERVING)
        sweeper = asyncio.create_task(self._sweeper())
        log.info("engine serving: arena %s (%d slots x %d KiB), doorbell %s, model %s (%s) on %s",
                 self.cfg.shared_memory.name, self.layout.slot_count, self.layout.slot_size // 1024,
                 self.cfg.server.socket_path, self.cfg.model.name, self.cfg.model.backend, self.device.name)
        try:
            await stop.wait()
        finally:
            sweeper.cancel()
            self.arena.set_engine_state(EngineState.STOPPING)
            for job in list(self._jobs.values()):
                job.cancel.set()
            await self.doorbell.stop()
            await self.metrics_server.stop()
            if self.cache is not None:
                await self.cache.close()
            self._model.stop()
            self.device.close()
            self._tokens.clear()
            self.arena.close()
            log.info("engine stopped; arena and socket removed")


def run_engine(cfg: Config) -> None:
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        engine = Engine(cfg)
        await engine.serve(stop)

    asyncio.run(main())
