"""A cached answer: what the cache keeps of a complete, successful response, and how
it is made from one (CachedAnswer.of) and replayed into a result (CachedAnswer.result).

An entry also keeps the masked values (the literals a mask replaced in the request that
produced it) that its text carries: a request whose masks made it look like that one
but that does not itself contain those values must not be served this text
(CachedAnswer.leaks_to)."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from zccp.shared_types import Completed, GenerationResult


@dataclass(frozen=True)
class CachedAnswer:
    text: str
    stop_reason: str
    stop_sequence: str | None
    output_tokens: int
    deltas: tuple[int, ...]           # character lengths of the streamed deltas, to replay them alike
    created: float
    literals: tuple[str, ...] = ()    # masked values of the request that the text contains
    # the prompt tokens of the request it answered, when that request was unmasked (0: not
    # kept). An exact HIT of an unmasked request reports them: the exact key says the two
    # are one request, and nginx's L1, which replays the engine's bytes to other spellings
    # of it, cannot count a prompt (flow._replay).
    input_tokens: int = 0

    @classmethod
    def of(cls, completed: Completed, now: float, literals: tuple[str, ...] = (),
           unmasked: bool = False) -> CachedAnswer:
        """The entry to store for a finished answer (literals: see literals_in; unmasked: the
        request was not masked, so its prompt size is the entry's)."""
        r = completed.result
        return cls(r.text, r.stop_reason, r.stop_sequence, r.output_tokens, completed.deltas, now, literals,
                   r.input_tokens if unmasked else 0)

    def leaks_to(self, masked_values: tuple[bytes, ...]) -> str | None:
        """A masked value of this entry's request that its text carries and that is not one
        of `masked_values` (the values the masks replaced in the request about to be served:
        the masked fields themselves, never the rest of its body), or None."""
        own = set(masked_values)
        for lit in self.literals:
            if lit.encode() not in own:
                return lit
        return None

    def result(self, input_tokens: int) -> GenerationResult:
        return GenerationResult(self.text, self.stop_reason, self.stop_sequence,  # type: ignore[arg-type]
                                input_tokens, self.output_tokens)

    def to_json(self) -> bytes:
        return orjson.dumps({"text": self.text, "stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence,
                             "output_tokens": self.output_tokens, "deltas": list(self.deltas),
                             "created": self.created, "literals": list(self.literals),
                             "input_tokens": self.input_tokens})

    @classmethod
    def from_json(cls, raw: bytes) -> CachedAnswer | None:
        """An entry read back from Redis; anything malformed is a miss, never a crash."""
        try:
            d = orjson.loads(raw)
            deltas = tuple(int(n) for n in d["deltas"])
            literals = d["literals"]
            if not isinstance(literals, list) or not all(isinstance(x, str) and x for x in literals):
                return None
            ans = cls(str(d["text"]), str(d["stop_reason"]), d["stop_sequence"], int(d["output_tokens"]),
                      deltas, float(d["created"]), tuple(literals), max(0, int(d.get("input_tokens", 0))))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None
        if ans.stop_reason not in ("end_turn", "max_tokens", "stop_sequence") or sum(deltas) != len(ans.text):
            return None
        return ans


def literals_in(text: str, literals: tuple[bytes, ...]) -> tuple[str, ...]:
    """The request's masked values that `text` contains (those the guard must check later).
    A value that is not valid UTF-8 cannot be in the text."""
    out: list[str] = []
    for lit in literals:
        try:
            s = lit.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if s and s in text and s not in out:
            out.append(s)
    return tuple(out)
