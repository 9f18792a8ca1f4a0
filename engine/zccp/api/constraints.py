"""The grammar a request asks for (JSON mode, a JSON schema, a forced tool call), from
either API's fields, as an OutputConstraint (zccp.model.grammar runs it).

Nothing is compiled here (this runs on the event loop): the flow has the constraint
compiled, and validated, by zccp.model.grammar_cache in a worker thread under a time
budget; a schema the compiler refuses is a 400 naming `param` from there."""

from __future__ import annotations

from typing import Any

from ..shared_types import OutputConstraint
from .common import dumps


def json_output(schema: dict[str, Any] | None, param: str) -> OutputConstraint:
    """JSON: any object (schema None), or one valid against `schema` (refused with a 400
    naming `param` when the grammar compiler cannot take it, off the loop)."""
    return OutputConstraint("json", dumps(schema).decode() if schema is not None else None, param=param)


def tool_call(tools: list[tuple[str, dict[str, Any] | None]], only: str | None, param: str) -> OutputConstraint:
    """One call of one of `tools` (name, parameters schema), or of the tool named `only`."""
    chosen = [(n, dumps(p).decode() if p is not None else None) for n, p in tools if only is None or n == only]
    return OutputConstraint("tool_call", tools=tuple(chosen), param=param)
