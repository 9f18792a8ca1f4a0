"""Reading a decoded JSON body's fields by type, for both APIs.

Strict JSON types (a bool is not a number, a float is not an integer). The checks are
the same for Anthropic's and OpenAI's parsers; what differs is how each API words the
error, so each passes its Wording to a FieldReader:

    F = FieldReader(MyWording())
    F.string(v, "model"); F.integer(v, "max_tokens", 1); F.number(v, "temperature", 0, 2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..shared_types import ApiError


def is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def json_type(v: object) -> str:
    """The JSON name of a decoded value's type: string, integer, number, ..."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


class Wording(Protocol):
    """One API's error for a field of the wrong type or out of its bounds. `expected` is
    a JSON type (string, integer, number, boolean, array, object)."""

    def wrong_type(self, path: str, expected: str, value: Any) -> ApiError: ...

    def below(self, path: str, expected: str, lo: float, value: Any) -> ApiError: ...

    def above(self, path: str, expected: str, hi: float, value: Any) -> ApiError: ...


@dataclass(frozen=True)
class FieldReader:
    """Typed field readers that raise the API's own ApiError."""

    wording: Wording

    def string(self, v: Any, path: str) -> str:
        if not isinstance(v, str):
            raise self.wording.wrong_type(path, "string", v)
        return v

    def boolean(self, v: Any, path: str) -> bool:
        if not isinstance(v, bool):
            raise self.wording.wrong_type(path, "boolean", v)
        return v

    def array(self, v: Any, path: str) -> list[Any]:
        if not isinstance(v, list):
            raise self.wording.wrong_type(path, "array", v)
        return v

    def object(self, v: Any, path: str) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise self.wording.wrong_type(path, "object", v)
        return v

    def integer(self, v: Any, path: str, lo: int | None = None) -> int:
        if not is_int(v):
            raise self.wording.wrong_type(path, "integer", v)
        if lo is not None and v < lo:
            raise self.wording.below(path, "integer", lo, v)
        return v

    def number(self, v: Any, path: str, lo: float, hi: float) -> float:
        if not is_number(v):
            raise self.wording.wrong_type(path, "number", v)
        if v < lo:
            raise self.wording.below(path, "number", lo, v)
        if v > hi:
            raise self.wording.above(path, "number", hi, v)
        return float(v)
