"""A cached answer: what the cache keeps of a complete, successful response, and how
it is made from one (CachedAnswer.of) and replayed into a result (CachedAnswer.result)."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from zccp.request import Completed, GenerationResult


@dataclass(frozen=True)
class CachedAnswer:
    text: str
    stop_reason: str
    stop_sequence: str | None
    output_tokens: int
    deltas: tuple[int, ...]           # character lengths of the streamed deltas, to replay them alike
    created: float

    @classmethod
    def of(cls, completed: Completed, now: float) -> CachedAnswer:
        """The entry to store for a finished answer."""
        r = completed.result
        return cls(r.text, r.stop_reason, r.stop_sequence, r.output_tokens, completed.deltas, now)

    def result(self, input_tokens: int) -> GenerationResult:
        return GenerationResult(self.text, self.stop_reason, self.stop_sequence,  # type: ignore[arg-type]
                                input_tokens, self.output_tokens)

    def to_json(self) -> bytes:
        return orjson.dumps({"text": self.text, "stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence,
                             "output_tokens": self.output_tokens, "deltas": list(self.deltas),
                             "created": self.created})

    @classmethod
    def from_json(cls, raw: bytes) -> CachedAnswer | None:
        """An entry read back from Redis; anything malformed is a miss, never a crash."""
        try:
            d = orjson.loads(raw)
            deltas = tuple(int(n) for n in d["deltas"])
            ans = cls(str(d["text"]), str(d["stop_reason"]), d["stop_sequence"], int(d["output_tokens"]),
                      deltas, float(d["created"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None
        if ans.stop_reason not in ("end_turn", "max_tokens", "stop_sequence") or sum(deltas) != len(ans.text):
            return None
        return ans
