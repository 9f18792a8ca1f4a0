"""One upstream answer into the slot: the upstream's events, rendered by the client's
codec (the same encoders and renderers a local model's answer goes through), written
into the response ring from the event loop without ever waiting on it.

Before the first byte of the upstream's answer a failure is the client's API-shaped
error (a status of its own); after it, a stream ends with the API's error event (a
non-streamed answer, nothing written yet, still gets its status).

A client that goes away (nginx cancels the job or takes the slot back) ends the exchange
within CANCEL_POLL_S, whether or not the upstream is sending anything: the relay runs as a
task of its own and a watch cancels it, closing the upstream connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace

import orjson

from zccp.api.codec import ApiCodec, StreamEncoder
from zccp.prep.outcome import Outcome
from zccp.transport.ring_writer import ResponseWriter, SlotAbandoned
from zccp.shared_types import (ApiError, ChatInput, Completed, GenerationRequest, GenerationResult, TextDelta,
                               ToolArgsDelta, ToolCall, ToolCallStart)
from zccp.upstream.client import UpstreamAnswer, UpstreamClient
from zccp.upstream.wire import Finish, UpstreamBroken, UpstreamStreamError, anthropic_body, openai_body

log = logging.getLogger("zccp.upstream")

HOLD_BYTES = 1 << 16     # held-back bytes (the ring full) past which reading the upstream pauses
HOLD_POLL_S = 0.001
CANCEL_POLL_S = 0.02     # how often a running exchange checks that its client is still there


class UpstreamReply:
    def __init__(self, codec: ApiCodec, req: GenerationRequest, writer: ResponseWriter, outcome: Outcome,
                 prompt_tokens: int, cancelled: Callable[[], bool],
                 verdict: Callable[[GenerationResult], None]) -> None:
        self._codec = codec
        self._req = req
        self._writer = writer
        self._outcome = outcome
        self._prompt_tokens = prompt_tokens
        self._cancelled = cancelled
        self._verdict = verdict
        self._encoder: StreamEncoder | None = None

    def _gone(self) -> bool:
        return self._cancelled() or not self._writer.owned()

    async def run(self, client: UpstreamClient, chat: ChatInput) -> Completed | None:
        """The whole answer; never raises. A Completed when it is complete and successful."""
        task = asyncio.ensure_future(self._exchange(client, chat))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=CANCEL_POLL_S)
                if done:
                    return task.result()
                if self._gone():
                    break
        except asyncio.CancelledError:
            task.cancel()
            raise
        task.cancel()                  # its finally closes the upstream connection
        await asyncio.wait({task})
        if not task.cancelled() and task.exception() is None:
            return task.result()       # it ended on its own meanwhile
        self._outcome.abandoned(SlotAbandoned("the client went away while the upstream answered"))
        return None

    async def _exchange(self, client: UpstreamClient, chat: ChatInput) -> Completed | None:
        answer: UpstreamAnswer | None = None
        try:
            try:
                make = openai_body if client.cfg.api == "openai" else anthropic_body
                trace = self._outcome.trace
                sent_on = trace.upstream_headers(client.model) if trace is not None else None
                answer = await client.open(make(self._req, chat, client.model), sent_on)
                return await self._relay(answer)
            except (UpstreamBroken, UpstreamStreamError) as exc:
                err = exc.err if isinstance(exc, UpstreamStreamError) else ApiError(502, "api_error", str(exc))
                log.warning("upstream answer failed: %s", err, extra=self._outcome.ctx.ids())
                self._fail(err)
            except ApiError as err:
                self._fail(err)
        except SlotAbandoned as exc:
            self._outcome.abandoned(exc)
        except Exception:
            log.exception("upstream request failed", extra=self._outcome.ctx.ids())
            self._outcome.failed(self._encoder)
        finally:
            if answer is not None:
                await answer.close()
        return None

    def _fail(self, err: ApiError) -> None:
        writer = self._writer
        if not writer.started:
            return self._outcome.client_error(err)
        assert self._encoder is not None
        writer.write(self._encoder.error(err))
        writer.finish(failed=True)
        self._outcome.answered(self._codec.http_status(err))

    async def _relay(self, answer: UpstreamAnswer) -> Completed | None:
        codec, req, writer = self._codec, self._req, self._writer
        rid, created = codec.new_response_id(), int(time.time())
        self._outcome.response_id = rid
        enc = None
        if req.stream:
            self._encoder = enc = codec.stream(req, rid, created, self._prompt_tokens, 0)
            writer.begin(200, sse=True)
            writer.write(enc.start())
        text: list[str] = []
        deltas: list[int] = []
        calls: list[ToolCall] = []
        finish: Finish | None = None
        outcome = self._outcome
        outcome.submitted = time.perf_counter()
        async for ev in answer.events():
            if self._cancelled():
                raise SlotAbandoned("the client went away while the upstream answered")
            if not outcome.first_token:
                outcome.first_token = time.perf_counter()
            if isinstance(ev, TextDelta):
                text.append(ev.text)
                deltas.append(len(ev.text))
                if enc is not None:
                    writer.write(enc.delta(ev))
            elif isinstance(ev, ToolCall):
                ev = self._checked(ev)
                calls.append(ev)
                if enc is not None:
                    writer.write(enc.tool_call(ev))
            elif isinstance(ev, ToolCallStart):
                if enc is not None:
                    writer.write(enc.tool_start(ev))
            elif isinstance(ev, ToolArgsDelta):
                if enc is not None:
                    writer.write(enc.tool_args(ev))
            else:
                finish = ev
            if enc is None:   # nothing sent before the end: the count so far (meta.completion_len)
                writer.set_meta(completion_len=len(deltas) + len(calls))
            if writer.pending > HOLD_BYTES:
                await self._room()
        assert finish is not None      # events() ends with a Finish or raises
        outcome.last_token = time.perf_counter()
        result = GenerationResult(
            text="".join(text), stop_reason=finish.stop_reason, stop_sequence=finish.stop_sequence,
            input_tokens=finish.input_tokens if finish.input_tokens is not None else self._prompt_tokens,
            output_tokens=finish.output_tokens if finish.output_tokens is not None else len(deltas) + len(calls),
            tool_calls=tuple(calls), cached_tokens=finish.cached_tokens)
        writer.set_meta(completion_len=result.output_tokens)
        self._verdict(result)
        if enc is not None:
            writer.write(enc.finish(result))
            writer.finish()
        else:
            writer.answer(200, False, codec.render(req, result, rid, created))
            deltas = [len(result.text)] if result.text else []
        self._outcome.answered(200, result)
        return Completed(result, tuple(deltas))

    def _checked(self, call: ToolCall) -> ToolCall:
        """Arguments are a JSON object (the Anthropic renderers embed them as is); kept
        byte for byte when they are. The start of one is a call cut by max_tokens (the
        upstream's answer ends with it, docs/tools.md): passed on as truncated."""
        try:
            ok = isinstance(orjson.loads(call.arguments), dict)
        except orjson.JSONDecodeError:
            if call.arguments.lstrip().startswith("{"):
                return replace(call, truncated=True)
            ok = False
        if not ok:
            raise UpstreamBroken(f"the upstream's tool call {call.name!r} has arguments that are not a JSON object")
        return call

    async def _room(self) -> None:
        """Pause reading the upstream until nginx has taken most of what is held back."""
        writer = self._writer
        while writer.pending > HOLD_BYTES // 2:
            await asyncio.sleep(HOLD_POLL_S)
            if self._cancelled():
                raise SlotAbandoned("the client went away while the upstream answered")
            writer.flush_pending()
