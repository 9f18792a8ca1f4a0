"""The error kinds both APIs answer with, from their one table (lua/zccp/error_kinds.lua,
which nginx's zccp.errors requires too): status codes and OpenAI's type/code per kind."""

from __future__ import annotations

from dataclasses import dataclass

from zccp.config.lua_data import load_lua_data
from zccp.config.paths import lua_file


@dataclass(frozen=True)
class ErrorKind:
    name: str                    # the Anthropic error type, e.g. "rate_limit_error"
    status: int                  # HTTP status on /v1/messages
    openai_status: int           # HTTP status on /v1/chat/completions
    openai_type: str
    openai_code: str | None


def _load() -> dict[str, ErrorKind]:
    out = {}
    for name, row in load_lua_data(lua_file("error_kinds.lua")).items():
        status = int(row["status"])
        out[name] = ErrorKind(name, status, int(row.get("openai_status", status)), row["openai_type"].decode(),
                              row["openai_code"].decode() if "openai_code" in row else None)
    return out


KINDS: dict[str, ErrorKind] = _load()


def kind(name: str, status: int) -> ErrorKind:
    """The row for `name`; an unknown kind falls back on the generic row of its status class."""
    return KINDS.get(name) or KINDS["api_error" if status >= 500 else "invalid_request_error"]
