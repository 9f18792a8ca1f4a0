"""A request made ready for the model (zccp.prep.flow's first step): the body parsed once with
orjson, checked against what the backend can do, and every prompt tokenized into the
slot's token array; a client error raises an API-shaped ApiError, which the flow answers
through the slot."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from zccp.api import ApiCodec
from zccp.prep.checks import check_forwardable, check_needs_logits
from zccp.model.base import ModelBackend
from zccp.model.grammar import CompiledGrammar, frame_tokens
from zccp.model.prompt import Prompt
from zccp.model.tokenizer import PromptTooLong
from zccp.prep.outcome import RequestContext
from zccp.prep.prompt_pins import pin_points
from zccp.transport.ring_writer import SlotAbandoned
from zccp.shared_types import ApiError, GenerationRequest, Pin

if TYPE_CHECKING:
    from zccp.prep.flow import FlowDeps


@dataclass(slots=True)
class Prepared:
    """A parsed, tokenized request, ready for the model (never changed once made: not frozen
    only because a frozen dataclass's __init__ costs a setattr call per field, per request)."""

    codec: ApiCodec
    req: GenerationRequest
    input_view: Callable[[np.ndarray], Any]   # the device seam (FlowDeps.input_view)
    doc: dict[str, Any]              # the parsed body (the fingerprint may reuse it, and mask it)
    host_ids: np.ndarray             # the prompt ids on the CPU (a view of the slot's array)
    pins: tuple[Pin, ...] = ()       # the prefixes its cache_control breakpoints pin (zccp.prep.prompt_pins)
    # every prompt's (input_ids, host_ids), in order (/v1/completions may send several); the first: the above
    prompts: tuple[tuple[Any, np.ndarray], ...] = ()
    grammar: CompiledGrammar | None = None   # req.sampling.constraint, compiled (zccp.model.grammar_cache)
    _input: Any = field(default=None, init=False, repr=False)

    @property
    def input_ids(self) -> Any:
        """The prompt's ids as the model reads them (the device's view of host_ids; without torch
        the array itself), made on first use: a fixed reply or a cache answer never needs one."""
        if self._input is None:
            self._input = self.input_view(self.host_ids)
        return self._input

    @property
    def prompt_len(self) -> int:
        return len(self.host_ids)

    @property
    def choices(self) -> int:
        """Sequences this request runs: n for each prompt."""
        return max(1, len(self.prompts)) * self.req.n


def prepare(ctx: RequestContext, deps: FlowDeps, codec: ApiCodec) -> Prepared:
    """Parse and tokenize into the slot's token array; a client error raises ApiError."""
    req, spans, doc = parse_and_tokenize(ctx, deps, codec)
    tokens = ctx.host_tokens
    at, n = spans[0]
    host = tokens[at:at + n]                 # numpy: the torch view is made when a model reads it
    pins: tuple[Pin, ...] = ()
    if req.cache_marks and deps.prefix_pins:
        pins = pin_points(deps.backend.prompt, doc, req, deps.limits, host)
    prep = Prepared(codec, req, deps.input_view, doc, host, pins)
    if req.prompts:                          # /v1/completions: every prompt's views
        prep.prompts = ((prep.input_ids, host),) + tuple(
            (deps.input_view(t), t) for t in (tokens[a:a + k] for a, k in spans[1:]))
    return prep


def parse_and_tokenize(ctx: RequestContext, deps: FlowDeps,
                       codec: ApiCodec) -> tuple[GenerationRequest, list[tuple[int, int]], dict[str, Any]]:
    """The request, and where each of its prompts lies in the slot's token array."""
    doc = codec.decode(ctx.payload)
    req = codec.parse(doc, deps.limits)
    if deps.upstream is not None:
        check_forwardable(req)
    elif req.sampling.constraint is not None or req.sampling.logprobs is not None:
        check_needs_logits(req, deps.backend.has_logits, deps.tool_parser)
    try:
        spans = encode(ctx, deps, codec, req, doc)
    except PromptTooLong as exc:
        raise ApiError(413, "request_too_large",
                       f"prompt is {exc.needed} tokens; a slot holds at most {exc.capacity}") from None
    # one prompt (a chat: every request but /v1/completions' several): no generators
    total, n = spans[0][1], spans[0][1]
    if len(spans) > 1:
        total, n = sum(k for _, k in spans), max(k for _, k in spans)
    if not ctx.writer.set_meta(prompt_len=total, max_tokens=req.sampling.max_tokens,
                               gpu_device_id=deps.device_id):
        raise SlotAbandoned(f"slot {ctx.view.index}: claimed again while the request was parsed")
    ctx.view.header.tokens_len = total
    limit = deps.backend.max_context
    if n + req.sampling.max_tokens + (frame := frame_tokens(req.sampling.constraint)) > limit:   # docs/tools.md
        raise ApiError(400, "invalid_request_error", f"prompt is too long: {n} tokens + max_tokens "
                       f"{req.sampling.max_tokens}{f' + {frame} (forced call)' if frame else ''} > {limit} maximum",
                       param="max_tokens" if n < limit else "prompt" if req.prompts else "messages")
    return req, spans, doc

def encode(ctx: RequestContext, deps: FlowDeps, codec: ApiCodec, req: GenerationRequest,
           doc: dict[str, Any]) -> list[tuple[int, int]]:
    """Every prompt's ids into the slot's token array, one after the other: (start, length)
    each. A chat has one prompt; /v1/completions' prompts are texts (no template) or ids."""
    fmt, tokens = deps.backend.prompt, ctx.tokens
    if not req.prompts:
        return [(0, fmt.encode_into_slot(Prompt(req, lambda: codec.chat_input(doc)), tokens, ctx.host_tokens))]
    spans: list[tuple[int, int]] = []
    at = 0
    for i, p in enumerate(req.prompts):
        try:
            if isinstance(p, str):
                one = req if p is req.prompt_text else replace(req, prompt_text=p)
                n = fmt.encode_into(Prompt(one, lambda: codec.chat_input(doc)), tokens[at:])
            else:
                n = write_ids(deps.backend, p, tokens[at:], i)
        except PromptTooLong as exc:
            raise PromptTooLong(at + exc.needed, len(tokens)) from None
        if n == 0:
            raise ApiError(400, "invalid_request_error", f"prompt {i} is empty (no tokens)", param="prompt")
        spans.append((at, n))
        at += n
    return spans

def write_ids(backend: ModelBackend, ids: tuple[int, ...], out: Any, index: int) -> int:
    """A prompt given as token ids, as is (checked against the model's vocabulary)."""
    vocab = backend.vocab_size
    if (bad := max(ids)) >= vocab:
        raise ApiError(400, "invalid_request_error", f"Invalid 'prompt': token id {bad} (prompt {index}) is "
                       f"out of range for {backend.name}, whose vocabulary has {vocab} ids",
                       param="prompt")
    n = len(ids)
    if n > len(out):
        raise PromptTooLong(n, len(out))
    (out if isinstance(out, np.ndarray) else out.numpy())[:n] = ids
    return n
