"""Constrained decoding: the answer held to a grammar, token by token (llguidance).

An OutputConstraint (from the API layer: JSON mode, a JSON schema, a forced tool call)
becomes an llguidance grammar; each constrained sequence gets its own GrammarMatcher
(made with its Sampler), which masks the tokens the grammar does not allow at this
point before the sampler draws, then consumes the token drawn. Once the grammar is
complete only EOS is allowed, so the answer ends there.

A forced tool call is generated in the hermes form the tool parser reads
(`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, zccp.hermes_tools);
the tags are the tokenizer's special tokens when it has them, text otherwise.

Why llguidance (bench/grammar_libs.py): no ahead-of-time compilation of the vocabulary
per schema (its Earley parser computes each mask lazily, ~10 µs a token on the test
vocabularies), a complete JSON-schema compiler, and a small wheel (xgrammar brings
triton and a TVM runtime).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from zccp.hermes_tools import END, START
from zccp.shared_types import ApiError, OutputConstraint

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


def check_constraint(c: OutputConstraint, param: str) -> None:
    """ApiError (400) for a schema the grammar compiler refuses, named by its request field."""
    import llguidance

    try:
        err, msgs = llguidance.LLMatcher.validate_grammar_with_warnings(grammar_text(c))
    except ValueError as exc:
        err, msgs = True, [str(exc)]
    if err:
        raise ApiError(400, "invalid_request_error", f"{param}: invalid JSON schema: {'; '.join(msgs)}", param)


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
        return GrammarMatcher(self, grammar_text(c, self.tags))


class GrammarMatcher:
    """One sequence's grammar state: mask() before each draw, accept() the token drawn."""

    __slots__ = ("_m", "_n")

    def __init__(self, vocab: GrammarVocab, grammar: str) -> None:
        import llguidance

        self._m = llguidance.LLMatcher(vocab.lltok, grammar)
        self._n = vocab.n_vocab
        if self._m.is_error():
            raise ValueError(self._m.get_error())

    def allowed(self) -> torch.Tensor:
        """The tokens the grammar allows next, as a bool tensor of the vocabulary's width."""
        bits = np.unpackbits(np.frombuffer(self._m.compute_bitmask(), np.uint8), bitorder="little")
        return torch.from_numpy(bits[: self._n].astype(np.bool_))

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (1-D) with every token the grammar does not allow at -inf (a new tensor)."""
        allowed = self.allowed()
        width = logits.shape[-1]
        if width > self._n:
            allowed = torch.cat([allowed, allowed.new_zeros(width - self._n)])
        return logits.masked_fill(~allowed[:width].to(logits.device), float("-inf"))

    def accept(self, token: int) -> None:
        self._m.consume_token(token)

    @property
    def complete(self) -> bool:
        return bool(self._m.is_accepting())
