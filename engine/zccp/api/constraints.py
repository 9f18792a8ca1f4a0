"""The grammar a request asks for (JSON mode, a JSON schema, a forced tool call), from
either API's fields, as an OutputConstraint (zccp.model.grammar runs it).

Nothing is compiled here (this runs on the event loop): the flow has the constraint
compiled, and validated, by zccp.model.grammar_cache in a worker thread under a time
budget; a schema the compiler refuses is a 400 naming `param` from there."""

from __future__ import annotations

from typing import Any

from ..shared_types import ApiError, OutputConstraint
from .bounds import MAX_TOOLS_SCHEMA_BYTES, schema_problem, schema_size_problem
from .common import dumps


def _bad(param: str, why: str) -> ApiError:
    return ApiError(400, "invalid_request_error", f"{param}: {why}", param)


def schema_json(schema: Any, param: str) -> str:
    """A schema as JSON text, refused (400 naming `param`) when it is too deep or too large
    for the grammar compiler's budget: checked before serialising (orjson stops at 255 levels)."""
    if (why := schema_problem(schema)) is not None:
        raise _bad(param, why)
    text = dumps(schema).decode()
    if (why := schema_size_problem(len(text))) is not None:
        raise _bad(param, why)
    return text


def json_output(schema: dict[str, Any] | None, param: str) -> OutputConstraint:
    """JSON: any object (schema None), or one valid against `schema` (refused with a 400
    naming `param` when it is too deep or large (here) or the grammar compiler cannot take it, off the loop)."""
    return OutputConstraint("json", schema_json(schema, param) if schema is not None else None, param=param)


def tool_call(tools: list[tuple[str, dict[str, Any] | None]], only: str | None, param: str) -> OutputConstraint:
    """One call of one of `tools` (name, parameters schema), or of the tool named `only`."""
    chosen = [(n, schema_json(p, param) if p is not None else None) for n, p in tools if only is None or n == only]
    if (total := sum(len(p) for _, p in chosen if p)) > MAX_TOOLS_SCHEMA_BYTES:
        raise _bad(param, f"the tools' schemas are {total} bytes together; at most {MAX_TOOLS_SCHEMA_BYTES} "
                          "are allowed")
    return OutputConstraint("tool_call", tools=tuple(chosen), param=param)
