"""Constrained decoding: the answer held to a grammar, token by token (llguidance).

An OutputConstraint (from the API layer: JSON mode, a JSON schema, a forced tool call)
becomes an llguidance grammar; each constrained sequence gets its own GrammarMatcher
(made with its Sampler), which masks the tokens the grammar does not allow at this
point before the sampler draws, then consumes the token drawn; the tokens its start
forces (a forced call's wrapper) are taken as they are, without a mask or a draw. Once
the grammar is complete only EOS is allowed, so the answer ends there.

A forced tool call is generated in the hermes form the tool parser reads
(`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, zccp.serving.hermes_tools);
the tags are the tokenizer's special tokens when it has them, text otherwise.

Why llguidance (bench/grammar_libs.py): no ahead-of-time compilation of the vocabulary
per schema (its Earley parser computes each mask lazily, ~10 µs a token on the test
vocabularies), a complete JSON-schema compiler, and a small wheel (xgrammar brings
triton and a TVM runtime).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from zccp.serving.hermes_tools import END, START, is_forced_call, wrapper_tokens
from zccp.shared_types import ApiError, OutputConstraint

if TYPE_CHECKING:
    import torch

# Compact JSON: flexible whitespace lets a model pad an answer with whitespace until max_tokens.
_COMPACT: Any = {"whitespace_flexible": False}


def _schema(schema_json: str | None) -> dict[str, Any]:
    if schema_json is None:
        return {"type": "object"}     # JSON mode: any object
    schema = json.loads(schema_json)
    if not isinstance(schema, dict):
        raise ValueError("a JSON schema must be an object")
    return _closed(schema)


# Members whose value is one schema, and those holding a list or a map of schemas.
_SUB_ONE = ("items", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames")
_SUB_LIST = ("anyOf", "oneOf", "prefixItems")
_SUB_MAP = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


def _closed(schema: Any, close: bool = True) -> Any:
    """The schema with every object that lists `properties` and says nothing of
    `additionalProperties` closed to them (what xgrammar's strict mode, vLLM's default, does):
    a client's schema made from a function signature (LangChain's bind_tools, the Agents
    SDK's non-strict tools) rarely says it, and a model that may add keys may add them until
    max_tokens. An explicit `additionalProperties` (true or a schema) is kept. allOf's
    members are not closed (each lists only part of the object's properties)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if (close and isinstance(out.get("properties"), dict) and "additionalProperties" not in out
            and "patternProperties" not in out and "unevaluatedProperties" not in out):
        out["additionalProperties"] = False
    for k in _SUB_ONE:
        if k in out:
            out[k] = _closed(out[k])
    for k in _SUB_LIST:
        if isinstance(out.get(k), list):
            out[k] = [_closed(x) for x in out[k]]
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [_closed(x, close=False) for x in out["allOf"]]
    for k in _SUB_MAP:
        if isinstance(out.get(k), dict):
            out[k] = {n: _closed(x) for n, x in out[k].items()}
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _closed(out["additionalProperties"])
    return out


def _tool_call_schema(tools: Sequence[tuple[str, str | None]]) -> dict[str, Any]:
    """{"name": <one of the tools>, "arguments": <that tool's parameters>}."""
    options = [{
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": _schema(params)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    } for name, params in tools]
    return options[0] if len(options) == 1 else {"anyOf": options}


def frame_tokens(c: OutputConstraint | None) -> int:
    """The room a forced call's frame takes beyond max_tokens (0 for any other answer)."""
    return wrapper_tokens(c) if c is not None and is_forced_call(c) else 0


def grammar_text(c: OutputConstraint, tags: tuple[int | None, int | None] = (None, None)) -> str:
    """The llguidance grammar of a constraint. tags: the ids of the tool-call tags when
    they are special tokens (None: the tags are text)."""
    import llguidance

    if c.kind == "json":
        return llguidance.LLMatcher.grammar_from_json_schema(_schema(c.schema), overrides=_COMPACT)
    schema = {**_tool_call_schema(c.tools), "x-guidance": _COMPACT}
    start = f"<[{tags[0]}]>" if tags[0] is not None else json.dumps(START)
    end = f"<[{tags[1]}]>" if tags[1] is not None else json.dumps(END)
    lark = f'start: {start} "\\n" call "\\n" {end}\ncall: %json {json.dumps(schema)}\n'
    return llguidance.grammar_from("lark", lark)


def compile_error(c: OutputConstraint, vocab: GrammarVocab | None) -> tuple[CompiledGrammar | None, str | None]:
    """Compile a constraint (validate only, without a vocabulary): (the compiled grammar,
    None), or (None, the compiler's message). Slow for a large schema (seconds): run off
    the event loop and off the model thread (zccp.model.grammar_cache)."""
    import llguidance

    try:
        if vocab is None:
            err, msgs = llguidance.LLMatcher.validate_grammar_with_warnings(grammar_text(c))
            return None, "; ".join(msgs) if err else None
        m = llguidance.LLMatcher(vocab.lltok, grammar_text(c, vocab.tags), log_level=0, limits=_limits())
    except (ValueError, TypeError, RecursionError) as exc:
        return None, _short(str(exc) or type(exc).__name__)
    if m.is_error():
        return None, _short(m.get_error())
    return CompiledGrammar(m, vocab.n_vocab), None


def _limits() -> Any:
    import llguidance

    # terse errors: a verbose one carries the whole grammar (a large schema's megabyte) into the answer
    return llguidance.LLParserLimits(verbose_errors=False)


MAX_ERROR_CHARS = 400


def _short(message: str) -> str:
    return message if len(message) <= MAX_ERROR_CHARS else message[:MAX_ERROR_CHARS] + "…"


def invalid_schema(param: str, message: str) -> ApiError:
    return ApiError(400, "invalid_request_error", f"{param}: invalid JSON schema: {message}", param or None)


class ByteTokens:
    """llguidance's view of a vocabulary given as each id's bytes (llguidance.TokenizerWrapper)."""

    def __init__(self, tokens: list[bytes], eos: int, special: Iterable[int]) -> None:
        self.eos_token_id = eos
        self.bos_token_id = None
        self.tokens = tokens
        self.special_token_ids = sorted(special)
        self._single = {t[0]: i for i, t in enumerate(tokens) if len(t) == 1 and i not in self.special_token_ids}

    def __call__(self, data: bytes) -> list[int]:
        # byte by byte through the single-byte tokens (llguidance only needs a valid split)
        return [self._single[b] for b in data if b in self._single]


class GrammarVocab:
    """One backend's vocabulary for the grammar (built once, shared by every matcher)."""

    def __init__(self, lltok: Any, n_vocab: int, tags: tuple[int | None, int | None]) -> None:
        self.lltok = lltok
        self.n_vocab = n_vocab
        self.tags = tags

    @classmethod
    def from_bytes(cls, tokens: list[bytes], n_vocab: int, eos: Sequence[int], special: Iterable[int],
                   tags: tuple[int | None, int | None] = (None, None)) -> GrammarVocab:
        import llguidance

        special = set(special)
        # special ids carry a 0xFF-prefixed name, so no text can match them
        toks = [b"\xff" + (t or b"<special>") if i in special else t for i, t in enumerate(tokens)]
        toks += [b"\xff<unused>"] * (n_vocab - len(toks))
        wrapper = llguidance.TokenizerWrapper(ByteTokens(toks, eos[0], special | set(range(len(tokens), n_vocab))))
        return cls(llguidance.LLTokenizer(wrapper, n_vocab=n_vocab, eos_token=list(eos)), n_vocab, tags)

    @classmethod
    def from_hf(cls, tokenizer: Any, n_vocab: int, eos: Sequence[int]) -> GrammarVocab:
        import llguidance.hf

        ids = tokenizer.convert_tokens_to_ids([START, END])
        special = set(tokenizer.all_special_ids) | {
            i for i, t in tokenizer.added_tokens_decoder.items() if getattr(t, "special", False)}
        tags = tuple(i if isinstance(i, int) and i in special else None for i in ids)
        lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=n_vocab, eos_token=list(eos))
        return cls(lltok, n_vocab, (tags[0], tags[1]))

    def matcher(self, c: OutputConstraint) -> GrammarMatcher:
        """A compiled matcher, here and now (generate()'s path; the scheduler's sequences
        arrive with theirs compiled, CompiledGrammar)."""
        compiled, err = compile_error(c, self)
        if compiled is None:
            raise ValueError(err)
        return compiled.matcher()


class CompiledGrammar:
    """A constraint compiled once for one vocabulary; each sequence's matcher is a copy of
    its initial state (LLMatcher.deep_copy, microseconds), so the model thread never compiles."""

    __slots__ = ("_m", "_n")

    def __init__(self, m: Any, n_vocab: int) -> None:
        self._m = m
        self._n = n_vocab

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self._m.deep_copy(), self._n)


class GrammarMatcher:
    """One sequence's grammar state: mask() before each draw, accept() the token drawn;
    forced() the tokens its start leaves no choice about (a forced call's wrapper)."""

    __slots__ = ("_m", "_n", "_ahead")

    def __init__(self, m: Any, n_vocab: int) -> None:
        self._m = m
        self._n = n_vocab
        self._ahead: list[int] | None = None      # the start's forced tokens, not yet taken

    def forced(self) -> int | None:
        """The next token when the grammar allows only it, at the start (llguidance's
        fast-forward tokens: `<tool_call>\\n{"name":"get_weather","arguments":` is fixed text):
        taken without a mask or a draw. Computed once (~55 µs, four masks' worth, on the tiny
        vocabulary): asked at every step it would cost more than it saves."""
        if self._ahead is None:
            self._ahead = list(reversed(self._m.compute_ff_tokens()))
        return self._ahead.pop() if self._ahead else None

    def allowed(self) -> torch.Tensor:
        """The tokens the grammar allows next, as a bool tensor of the vocabulary's width."""
        mask = self._m.compute_bitmask()
        if self._m.is_error():
            raise ApiError(400, "invalid_request_error",
                           f"the output grammar failed while generating: {_short(self._m.get_error())}")
        bits = np.unpackbits(np.frombuffer(mask, np.uint8), bitorder="little")
        import torch

        return torch.from_numpy(bits[: self._n].astype(np.bool_))

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (1-D) with every token the grammar does not allow at -inf (a new tensor)."""
        allowed = self.allowed()
        width = logits.shape[-1]
        if width > self._n:
            import torch

            allowed = torch.cat([allowed, allowed.new_zeros(width - self._n)])
        return logits.masked_fill(~allowed[:width].to(logits.device), float("-inf"))

    def accept(self, token: int) -> None:
        # a token the grammar refuses leaves the matcher in error for good: this row ends here
        # (a schema too complex to parse, e.g. a oneOf wider than llguidance's rows, ends here: a 400)
        if not self._m.consume_token(token) or self._m.is_error():
            raise ApiError(400, "invalid_request_error",
                           f"the output grammar failed while generating: {_short(self._m.get_error())}")

    @property
    def complete(self) -> bool:
        return bool(self._m.is_accepting())
