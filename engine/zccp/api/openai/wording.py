"""OpenAI's field errors, in its words and codes (OpenAIApiError), and typed field
readers that raise them; shared by Chat Completions, Completions and Responses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from ...shared_types import ApiError
from ..common import fmt_num
from ..fields import FieldReader, json_type



@dataclass
class OpenAIApiError(ApiError):
    """ApiError plus OpenAI's machine-readable `code` (e.g. "invalid_type")."""

    code: str | None = None



# --- error constructors in OpenAI's wording ---

def _err(message: str, param: str | None, code: str | None, status: int = 400) -> OpenAIApiError:
    return OpenAIApiError(status, "invalid_request_error", message, param, code=code)


_ARTICLE: Final = {
    "string": "a string", "integer": "an integer", "number": "a decimal", "boolean": "a boolean",
    "array": "an array", "object": "an object", "null": "null",
}


def _type_err(param: str, expected: str, value: Any) -> OpenAIApiError:
    got = _ARTICLE[json_type(value)]
    return _err(f"Invalid type for '{param}': expected {expected}, but got {got} instead.", param, "invalid_type")


def _missing(param: str) -> OpenAIApiError:
    return _err(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")


def _invalid_value(param: str, value: Any, allowed: tuple[str, ...]) -> OpenAIApiError:
    quoted = [f"'{a}'" for a in allowed]
    supported = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + ", and " + quoted[-1]
    return _err(f"Invalid value: '{value}'. Supported values are: {supported}.", param, "invalid_value")


def _unsupported(param: str, value: str, default: str) -> OpenAIApiError:
    return _err(f"Unsupported value: '{param}' does not support {value} with this model. "
                f"Only the default ({default}) value is supported.", param, "unsupported_value")


def _empty_array(param: str) -> OpenAIApiError:
    return _err(f"Invalid '{param}': empty array. Expected an array with minimum length 1, "
                "but got an empty array instead.", param, "empty_array")


# --- typed field readers ---

class _Wording:
    """Field errors in OpenAI's words (and codes)."""

    _TYPE = {"string": "a string", "array": "an array", "object": "an object", "integer": "an integer",
             "number": "a decimal", "boolean": "a boolean"}

    def wrong_type(self, path: str, expected: str, value: Any) -> ApiError:
        return _type_err(path, self._TYPE[expected], value)

    def below(self, path: str, expected: str, lo: float, value: Any) -> ApiError:
        if expected == "integer":
            return _err(f"Invalid '{path}': integer below minimum value. Expected a value >= {lo}, "
                        f"but got {value} instead.", path, "integer_below_min_value")
        return _err(f"Invalid '{path}': decimal below minimum value. Expected a value >= {fmt_num(lo)}, "
                    f"but got {fmt_num(value)} instead.", path, "decimal_below_min_value")

    def above(self, path: str, expected: str, hi: float, value: Any) -> ApiError:
        return _err(f"Invalid '{path}': decimal above maximum value. Expected a value <= {fmt_num(hi)}, "
                    f"but got {fmt_num(value)} instead.", path, "decimal_above_max_value")


_F: Final = FieldReader(_Wording())
_number, _int, _bool, _str, _obj, _arr = _F.number, _F.integer, _F.boolean, _F.string, _F.object, _F.array

