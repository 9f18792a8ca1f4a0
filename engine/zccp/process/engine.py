"""The engine process shell: the arena, the doorbell's callbacks, the job table, the
sweeper and the life cycle. What happens to one request is zccp.prep.flow's business."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import cast

from zccp.transport.abi import EngineState, Kind, Op, SlotLayout, State
from zccp.process import numa
from zccp.api.codec import ModelInfo
from zccp.api.common import ParseLimits
from zccp.transport.arena import Arena, SlotError, SlotView
from zccp.cache.inflight import InFlight
from zccp.cache.mask_store import MaskSource
from zccp.cache.purge_epoch import EpochWatcher
from zccp.cache.store import ResponseCache
from zccp.config import HANDOFF_BACKENDS, Config, ConfigError, mask_state_path, model_names
from zccp.transport.device import CpuDevice, input_view, select_device, token_views
from zccp.transport.doorbell import Connection, DoorbellServer, Ring, encode_notice
from zccp.prep.endpoints import EndpointFlow
from zccp.prep.flow import FlowDeps, RequestFlow
from zccp.observe.logs import RequestLog
from zccp.observe import tracing
from zccp.observe.metrics import EngineMetrics, MetricsServer
from zccp.model.base import ModelBackend
from zccp.model.grammar_cache import GrammarCompiler
from zccp.model.prompt_only import prompt_only
from zccp.model.registry import backend_from_config, backend_uses_torch
from zccp.prep.outcome import RequestContext
from zccp.transport.ring_writer import ResponseWriter
from zccp.serving.model_thread import model_thread
from zccp.process.handoff import (NOT_STORED, Handoff, ModelFacts, OnEnded, OwnerChannel, PrepChannel, done_frame,
                                  open_owner_channel, open_prep_channel)
from zccp.process.jobs import HandoffJob, Job, process_exists, request_id
from zccp.shared_types import Completed
from zccp.process.group import (MODEL_OWNER, ProcessGroup, ProcessRole, metrics_path, own_doorbell, process_count,
                                start_group)
from zccp.upstream.client import UpstreamClient

log = logging.getLogger("zccp.engine")


def layout_from_config(cfg: Config) -> SlotLayout:
    shm = cfg.shared_memory
    return SlotLayout.build(shm.segment_count, shm.segment_size_kb * 1024, shm.tokens_kb * 1024, shm.response_kb * 1024)


class Engine:
    def __init__(self, cfg: Config, role: ProcessRole = MODEL_OWNER) -> None:
        self.cfg = cfg
        self.role = role
        if cfg.server.socket_path is None:   # programmer error: zccp.config.runtime.resolve sets it
            raise ConfigError(f"{cfg.path}: server.socket_path: not resolved for a run directory")
        self._socket_path = cfg.server.socket_path
        # Placement first: the threads torch starts inherit the CPUs, the arena's pages the node.
        self.placement = numa.apply(cfg) if role.owner else None   # a prep process inherits rank 0's CPUs
        # a prep process of a model backend: the prompt side only, its misses to rank 0 (zccp.process.handoff)
        facts = None if role.owner else role.facts
        self.hands_off = facts is not None
        self._channel = PrepChannel() if self.hands_off else None
        # torch only for a backend that computes with it (the null backend starts without it)
        self.uses_torch = backend_uses_torch(cfg.model.backend) and not self.hands_off
        if self.uses_torch:
            import torch

            torch.set_num_threads(len(self.placement.cpus) if self.placement else cfg.model.threads)
        self.layout = layout_from_config(cfg)
        self.arena = (Arena(cfg.shared_memory.name, self.layout, cfg.shared_memory.group) if role.owner
                      else Arena.attach(cfg.shared_memory.name, self.layout, role.epoch))
        if self.placement is not None and self.placement.numa_node is not None:
            numa.bind_range(self.arena.address(), self.layout.arena_size, self.placement.numa_node)
        # a prep process of a model computes nothing: the model's device is rank 0's (ModelFacts)
        self.device = CpuDevice() if self.hands_off else select_device(cfg.gpu, self.arena.mapping(), self.uses_torch)
        if facts is not None:
            self.backend = cast(ModelBackend, prompt_only(cfg.model, facts))
        else:
            self.backend = backend_from_config(cfg.model, self.device.name)
        if self.device.device_id >= 0:
            self.backend.to(self.device.torch_device)
        self.metrics = EngineMetrics()
        self.metrics.info.set(1, backend=cfg.model.backend, model=cfg.model.name, device=self.device.name)
        self.metrics.latency.for_model(cfg.model.name)
        self._rings = self.metrics.rings.series()
        # every model of the stack (engines:), so that any engine answers GET /v1/models for nginx
        self.models = [ModelInfo(name, int(time.time())) for name in model_names(cfg)]
        # Views made once: a request never allocates a tensor header for its slot.
        self._host_tokens = [self.arena.token_array(v) for v in self.arena.slots()]
        # the model's views of the same memory (without torch: the numpy arrays themselves)
        self._tokens = token_views(self._host_tokens, self.uses_torch)
        self._jobs: dict[int, Job] = {}
        # One model thread, decoding every running request in one batch; the loop stays free for rings.
        self._model = None if self.hands_off else model_thread(cfg.model, self.backend, self.metrics)
        self.doorbell = DoorbellServer(self._socket_path, self._on_ring, self._on_close, self._on_ping,
                                       cfg.shared_memory.group)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self.cache = ResponseCache(cfg.cache, self.metrics) if cfg.cache.enabled else None
        self._tasks: set[asyncio.Task[None]] = set()
        self._give_up_s = cfg.limits.request_timeout_ms / 1000
        # model.backend: upstream: misses are forwarded over HTTP (zccp.upstream)
        self.upstream = UpstreamClient(cfg.upstream, cfg.model.name) if cfg.model.backend == "upstream" else None
        self.deps = FlowDeps(
            backend=self.backend,
            limits=ParseLimits(
                served_models=frozenset({cfg.model.name}),
                max_tokens_cap=cfg.limits.max_tokens_cap,
                default_max_tokens=cfg.limits.default_max_tokens,
                max_queue=cfg.model.max_queue,
            ),
            input_view=input_view(self.device, self.uses_torch),
            device_id=facts.device_id if facts is not None else self.device.device_id,
            metrics=self.metrics,
            model=self._model,
            cache=self.cache,
            masks=MaskSource(Path(cfg.cache.mask_patterns) if cfg.cache.mask_patterns else None,
                             last_good=mask_state_path(cfg)) if cfg.cache.enabled else None,
            # The instant null backend runs on the loop itself: no thread hop per request.
            inline=cfg.model.backend == "null" and cfg.model.null_token_delay_ms == 0,
            spawn=self._spawn,
            call_soon=self._call_soon,
            tool_parser=cfg.model.tool_parser,
            request_log=RequestLog(defer=self._after_this_turn),
            inflight=InFlight() if cfg.cache.enabled and cfg.cache.coalesce_wait_ms else None,
            coalesce_wait_s=cfg.cache.coalesce_wait_ms / 1000,
            upstream=self.upstream,
            # schemas compiled off the loop, once each (validated only where nothing decodes here)
            grammars=None if self.hands_off else GrammarCompiler(
                self.backend.grammar_vocab if self.upstream is None and self.backend.has_logits else None,
                metrics=self.metrics),
            hand=self._hand if self.hands_off else None,
            prefix_pins=(facts.prefix_pins if facts is not None
                         else self._model is not None and self._model.prefix is not None),
        )
        # rank 0's page sums its prep processes' values; each of those serves its own state
        self.group: ProcessGroup | None = None
        self.metrics_server = MetricsServer(self._socket_path + ".metrics" if role.owner
                                            else metrics_path(self._socket_path, role.rank),
                                            self.metrics, cfg.shared_memory.group, self._gather)

    # -- doorbell callbacks (event loop thread) -------------------------------------------

    def _reject(self, conn: Connection, ring: Ring, status: int, why: str) -> None:
        self.metrics.rejects.inc(status=str(status))
        log.warning("ring rejected: %s", why,
                    extra={"slot": ring.slot, "generation": ring.generation, "status": status})
        conn.send(encode_notice(Op.REJECT, ring.slot, ring.generation, 0, 1, status))

    def _on_ping(self, conn: Connection) -> None:
        conn.send(encode_notice(Op.PONG, self.layout.slot_count, self.arena.epoch, 0, 1, 200))

    def _on_ring(self, conn: Connection, ring: Ring) -> None:
        self._rings.inc()
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
            prev.cancel()
        try:
            self.arena.validate(view)
        except SlotError as exc:
            return self._reject(conn, ring, 400, str(exc))
        h.state = State.RUNNING
        view.meta.retry_after_s = 0   # a previous answer's; set again only by a 429/503 that names one
        job = Job(conn, view, ring.generation, self._finish_job)
        self._jobs[ring.slot] = job
        conn.jobs.add(job)
        self._start(job)

    def _on_close(self, conn: Connection) -> None:
        for job in list(conn.jobs):
            job.cancel()  # the client side went away: stop generating

    # -- one job ---------------------------------------------------------------------------

    def _context(self, job: Job) -> RequestContext:
        view = job.view
        # positional: the context's and the writer's fields in their order (one per request)
        return RequestContext(view, job.generation, self.arena.payload(view), self._tokens[view.index],
                              self._host_tokens[view.index],
                              ResponseWriter(self.arena, view, job.generation, job.notify, job.cancelled,
                                             self._later if self._loop is not None else None, self._give_up_s),
                              job.cancelled, bytes(view.header.context_id).hex(), request_id(view))

    def _start(self, job: Job) -> None:
        view = job.view
        kind = view.request.kind
        if self.hands_off and kind == Kind.WARMUP:    # it runs the model: rank 0's, whole
            self.metrics.handoffs.inc(kind="whole")
            return self._hand(Handoff(view.index, job.generation, None, whole=True), lambda ended: job.done())
        ctx = self._context(job)
        if kind == Kind.GENERATE:
            return RequestFlow(ctx, self.deps, job.done).start()
        if kind == Kind.SPANS:     # nginx's L1 hits' spans (zccp.observe.tracing)
            return tracing.take_l1_spans(ctx, job.done)
        redis = self.cache.redis if self.cache is not None else None     # PURGE's
        EndpointFlow(ctx, self.deps, job.done, kind, self.models, redis, self.arena.set_purge_epoch).start()

    # -- handoffs (zccp.process.handoff) -------------------------------------------------

    def _hand(self, h: Handoff, ended: OnEnded) -> None:
        """A prep process: the miss to rank 0; nginx's leaving is passed on."""
        job, channel = self._jobs.get(h.slot), self._channel
        assert channel is not None
        if job is None or job.generation != h.generation:
            return ended(NOT_STORED)                    # nginx moved on meanwhile
        job.forward_cancel = lambda: channel.cancel(h.slot, h.generation)
        channel.hand(h, job.conn, ended)

    def _on_handoff(self, conn: Connection, h: Handoff) -> None:
        """Rank 0: a prep process's miss (or its whole request)."""
        try:
            view = self.arena.slot(h.slot)
        except SlotError:
            view = None
        prev = self._jobs.get(h.slot)
        if view is None or view.header.generation != h.generation or (prev is not None and
                                                                       prev.generation == h.generation):
            return conn.send(done_frame(h.slot, h.generation))   # nginx moved on meanwhile
        if prev is not None:
            prev.cancel()
        job = HandoffJob(conn, view, h.generation, self._finish_job)
        self._jobs[h.slot] = job
        conn.jobs.add(job)
        if h.whole:
            return self._start(job)

        def keep(completed: Completed | None, literals: tuple[str, ...]) -> None:
            job.completed, job.literals = completed, literals

        RequestFlow(self._context(job), self.deps, job.done).resume(h, keep)

    def _on_handoff_cancel(self, slot: int, generation: int) -> None:
        job = self._jobs.get(slot)
        if job is not None and job.generation == generation:
            job.cancel()

    def _adopt_channel(self, sock: socket.socket) -> None:
        """Rank 0's end of a (re)started prep process's channel."""
        self._spawn(open_owner_channel(sock, OwnerChannel(self._on_handoff, self._on_handoff_cancel)))

    def _later(self, delay: float, fn: Callable[[], None]) -> None:
        """fn on the loop after delay seconds, from any thread (a writer may finish on the model thread)."""
        assert self._loop is not None
        if threading.get_ident() == self._loop_thread:
            self._loop.call_later(delay, fn)
        else:
            self._loop.call_soon_threadsafe(self._loop.call_later, delay, fn)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _call_soon(self, fn: Callable[..., None], *args: object) -> None:
        """Run fn(*args) on the loop, from any thread."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(fn, *args)

    def _after_this_turn(self, fn: Callable[[], None]) -> None:
        """Run fn on the loop once it has handled what is ready now (from any thread)."""
        if self._loop is None:
            fn()
        elif threading.get_ident() == self._loop_thread:
            self._loop.call_soon(fn)
        else:
            self._loop.call_soon_threadsafe(fn)

    def _finish_job(self, job: Job) -> None:
        if self._loop is None or threading.get_ident() == self._loop_thread:
            self._drop_job(job)
        else:
            self._loop.call_soon_threadsafe(self._drop_job, job)

    def _drop_job(self, job: Job) -> None:
        if self._jobs.get(job.view.index) is job:
            del self._jobs[job.view.index]
        job.conn.jobs.discard(job)

    # -- sweeper ---------------------------------------------------------------------------

    def sweep(self, now_ns: int | None = None) -> int:
        """Reclaim the slots nobody will finish: the deadline nginx wrote into the slot has
        passed, or no job runs for it, it has sat for cleanup_interval_ms and the nginx worker
        that claimed it is gone. A request that is merely long (its worker connected, its
        deadline ahead) is never touched, however long it runs."""
        now_ns = now_ns or time.time_ns()
        grace = self.cfg.shared_memory.cleanup_interval_ms * 1_000_000
        reset = 0
        for view in self.arena.slots():
            h = view.header
            if h.state == State.FREE:
                continue
            generation = int(h.generation)
            why = self._abandoned_because(view, now_ns, grace)
            if why is None:
                continue
            job = self._jobs.get(view.index)
            if job is not None:
                job.cancel()
            if h.generation != generation:
                continue   # nginx claimed it again meanwhile: another request's slot now
            log.warning("sweeper: slot in state %d reset: %s", h.state, why,
                        extra={"slot": view.index, "generation": generation})
            h.state = State.FREE
            self.metrics.sweeps.inc()
            reset += 1
        return reset

    def _abandoned_because(self, view: SlotView, now_ns: int, grace: int) -> str | None:
        h = view.header
        deadline = h.deadline_ns
        if deadline and now_ns > deadline:
            return "its deadline has passed"
        job = self._jobs.get(view.index)
        if job is not None and not job.conn.closed:
            return None   # running, and the worker that rang is connected: it is owned
        if now_ns - h.timestamp_ns < grace:
            return None   # between nginx's claim and its ring, or nginx still copying the answer out
        if process_exists(int(h.owner_pid)):
            return None
        return f"its nginx worker (pid {int(h.owner_pid)}) is gone"

    async def _sweeper(self) -> None:
        period = max(self.cfg.shared_memory.cleanup_interval_ms / 4000, 0.05)
        while True:
            await asyncio.sleep(period)
            self.sweep()

    def _watch_purge_epoch(self) -> asyncio.Task[None] | None:
        """The cache's purge epoch into the control page, kept current (nginx's L1 keys carry
        it); without a cache it stays 0 and nginx's L1, which needs the cache, answers nothing."""
        if self.cache is None:
            return None
        watcher = EpochWatcher(self.cache.redis, self.arena.set_purge_epoch, 3 * self.cfg.cache.timeout_ms / 1000)
        return asyncio.create_task(watcher.run())

    # -- life cycle ------------------------------------------------------------------------

    def _start_tracing(self) -> None:
        """Request spans over OTLP/HTTP when tracing is on (zccp.observe.tracing; off: the SDK not imported)."""
        cfg = self.cfg
        name = next((e.name for e in cfg.engines if e.shared_memory.name == cfg.shared_memory.name), "")
        if tracing.start(cfg.tracing, self.metrics, cfg.model.name, name, cfg.server.listen) and self.role.owner:
            self.arena.set_tracing(tracing.ratio())
            log.info("tracing on: request spans over OTLP/HTTP to %s",
                     cfg.tracing.endpoint or "the OTEL_EXPORTER_OTLP_* endpoint")

    async def _gather(self) -> list[object]:
        return await self.group.gather() if self.group is not None else []

    async def _start_serving(self) -> list[asyncio.Task[None]]:
        """Rank 0: bind, publish the arena, start the prep processes, sweep. A prep process:
        accept on rank 0's socket, nothing else of the arena's is its to change."""
        if not self.role.owner:
            if self._channel is not None:
                await open_prep_channel(self.role.handoff_fd, self._channel)
            await self.doorbell.adopt(self.role.doorbell_fd)
            if (own := own_doorbell(self._socket_path, self.role.rank)) is not None:
                await self.doorbell.listen_also(own)
            await self.metrics_server.start()     # last: rank 0 waits for it
            log.info("prep process %d serving (pid %d)", self.role.rank, os.getpid())
            return []
        count = process_count(self.cfg)
        await self.doorbell.start(accept=count == 1)
        await self.metrics_server.start()
        self.arena.publish(self._socket_path)
        self.metrics.processes.set(count)
        tasks = [asyncio.create_task(self._sweeper())]
        if count > 1:
            facts = None
            if self.cfg.model.backend in HANDOFF_BACKENDS and self._model is not None:
                b = self.backend
                facts = ModelFacts(b.name, b.max_context, b.vocab_size, b.has_logits, self._model.prefix is not None,
                                   self.device.device_id)
            self.group = await start_group(self.cfg, count, self.doorbell, self.arena, self.metrics, facts,
                                           self._adopt_channel)
            tasks.append(asyncio.create_task(self.group.supervise()))
        self.arena.set_engine_state(EngineState.SERVING)
        if (epochs := self._watch_purge_epoch()) is not None:
            tasks.append(epochs)
        return tasks

    async def serve(self, stop: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._start_tracing()
        tasks = await self._start_serving()
        log.info("engine serving: arena %s (%d slots x %d KiB), doorbell %s, model %s (%s) on %s",
                 self.cfg.shared_memory.name, self.layout.slot_count, self.layout.slot_size // 1024,
                 self.cfg.server.socket_path, self.cfg.model.name, self.cfg.model.backend, self.device.name)
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            if self.role.owner:
                self.arena.set_engine_state(EngineState.STOPPING)
            if self.group is not None:
                await self.group.stop()
            for job in list(self._jobs.values()):
                job.cancel()
            await self.doorbell.stop()
            await self.metrics_server.stop()
            if self.cache is not None:
                await self.cache.close()
            if self.upstream is not None:
                await self.upstream.close()
            if self._model is not None:
                self._model.stop()
            if self.deps.grammars is not None:
                self.deps.grammars.close()
            await asyncio.to_thread(tracing.stop)   # the queued spans, bounded by the exporter's timeout
            self.device.close()
            self._tokens.clear()
            self._host_tokens.clear()
            self.arena.close()
            log.info("engine stopped; arena and socket removed")
