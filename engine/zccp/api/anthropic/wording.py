"""The Messages API's field errors, in its (pydantic's) words, and typed field readers
that raise them; shared by the parser, the cache_control reader and chat_input."""

from __future__ import annotations

from typing import Any, Final

from ...shared_types import ApiError
from ..fields import FieldReader


def _bad(path: str, msg: str) -> ApiError:
    return ApiError(400, "invalid_request_error", f"{path}: {msg}", path)


def _required(obj: dict[str, Any], key: str, path: str) -> Any:
    if key not in obj:
        raise _bad(path, "Field required")
    return obj[key]


class _Wording:
    """Field errors in the Messages API's (pydantic's) words."""

    _TYPE = {"string": "a valid string", "array": "a valid list", "object": "a valid dictionary",
             "integer": "a valid integer", "number": "a valid number", "boolean": "a valid boolean"}

    def wrong_type(self, path: str, expected: str, value: Any) -> ApiError:
        return _bad(path, f"Input should be {self._TYPE[expected]}")

    def below(self, path: str, expected: str, lo: float, value: Any) -> ApiError:
        return _bad(path, f"Input should be greater than or equal to {lo}")

    def above(self, path: str, expected: str, hi: float, value: Any) -> ApiError:
        return _bad(path, f"Input should be less than or equal to {hi}")


_F: Final = FieldReader(_Wording())
_str, _list, _dict = _F.string, _F.array, _F.object


def _text_of(block: dict[str, Any], path: str) -> str:
    """A text block's text: the real API refuses an empty one and a whitespace-only one."""
    text = _str(_required(block, "text", path + ".text"), path + ".text")
    if not text.strip():
        raise _bad(path + ".text", "text content blocks must contain non-whitespace text" if text
                   else "text content blocks must be non-empty")
    return text


def _no_extras(obj: dict[str, Any], allowed: frozenset[str], prefix: str) -> None:
    for key in obj:
        if key not in allowed:
            raise _bad(prefix + key, "Extra inputs are not permitted")


def _int(v: Any, path: str, ge: int) -> int:
    return _F.integer(v, path, ge)


def _unit(v: Any, path: str) -> float:
    """A number in [0, 1] (temperature, top_p)."""
    return _F.number(v, path, 0, 1)


