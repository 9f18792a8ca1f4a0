"""Anthropic Messages API: the request's cache_control breakpoints (prompt caching).

cache_marks() reads and checks them as the real API does (at most 4; a 1-hour one never
after a 5-minute one; errors in its style, "<dotted.path>: <message>"); cut_at() cuts the
request at one of them, the prompt that breakpoint covers (zccp.prep.prompt_pins).
"""

from __future__ import annotations

from typing import Any, Final

from ...shared_types import ApiError, CacheMark
from .wording import _bad, _dict, _no_extras, _required

_CACHE_CONTROL_FIELDS: Final = frozenset({"type", "ttl"})
_CACHE_TTLS: Final = {"5m": 300, "1h": 3600}
_MAX_BREAKPOINTS: Final = 4


def _cache_ttl(block: Any, path: str) -> int | None:
    """The TTL (s) of a block's cache_control, None without one."""
    if not isinstance(block, dict) or (cc := block.get("cache_control")) is None:
        return None
    path += ".cache_control"
    cc = _dict(cc, path)
    _no_extras(cc, _CACHE_CONTROL_FIELDS, path + ".")
    if _required(cc, "type", path + ".type") != "ephemeral":
        raise _bad(path + ".type", "Input should be 'ephemeral'")
    ttl = cc.get("ttl", "5m")
    if ttl not in _CACHE_TTLS:
        raise _bad(path + ".ttl", "Input should be '5m' or '1h'")
    return _CACHE_TTLS[ttl]


def cache_marks(body: dict[str, Any]) -> tuple[CacheMark, ...]:
    """The cache_control breakpoints on tools, system blocks and message content blocks, in
    the order the API lays the prompt out (tools, system, messages; a tool_result's inner
    blocks before the tool_result's own); at most 4, and a 1-hour one never after a 5-minute
    one, as the API requires."""
    marks: list[CacheMark] = []
    for i, tool in enumerate(body.get("tools") or ()):
        if (ttl := _cache_ttl(tool, f"tools.{i}")) is not None:
            marks.append(CacheMark("tools", i, -1, ttl))
    if isinstance(system := body.get("system"), list):
        for i, block in enumerate(system):
            if (ttl := _cache_ttl(block, f"system.{i}")) is not None:
                marks.append(CacheMark("system", i, -1, ttl))
    for i, msg in enumerate(body["messages"]):
        if isinstance(content := msg["content"], list):
            for j, block in enumerate(content):
                path = f"messages.{i}.content.{j}"
                if isinstance(block, dict) and block.get("type") == "tool_result" \
                        and isinstance(inner := block.get("content"), list):
                    for k, part in enumerate(inner):
                        if (ttl := _cache_ttl(part, f"{path}.content.{k}")) is not None:
                            marks.append(CacheMark("messages", i, j, ttl, k))
                if (ttl := _cache_ttl(block, path)) is not None:
                    marks.append(CacheMark("messages", i, j, ttl))
    if len(marks) > _MAX_BREAKPOINTS:
        raise ApiError(400, "invalid_request_error",
                       f"A maximum of {_MAX_BREAKPOINTS} blocks with cache_control may be provided. "
                       f"Found {len(marks)}.")
    for a, b in zip(marks, marks[1:], strict=False):
        if b.ttl_s > a.ttl_s:
            raise ApiError(400, "invalid_request_error",
                           "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block. "
                           "Note that blocks are processed in the following order: `tools`, `system`, `messages`.")
    return tuple(marks)


def cut_at(body: dict[str, Any], mark: CacheMark) -> dict[str, Any]:
    """The request cut right after the block `mark` sits on: what the prompt holds up to
    that breakpoint (tools, then system, then messages), as a warm-up body (parse_warmup)."""
    cut: dict[str, Any] = {"model": body["model"], "messages": []}
    tools = body.get("tools") or []
    choice = body.get("tool_choice")
    keep_choice = {"tool_choice": choice} if isinstance(choice, dict) and choice.get("type") == "none" else {}
    if mark.where == "tools":
        return {**cut, "tools": tools[: mark.index + 1], **keep_choice} if tools else cut
    if tools:
        cut.update(tools=tools, **keep_choice)
    system = body.get("system")
    if mark.where == "system":
        assert isinstance(system, list)        # a system breakpoint sits on one of its blocks
        return {**cut, "system": system[: mark.index + 1]}
    if system is not None:
        cut["system"] = system
    msgs = body["messages"]
    blocks = msgs[mark.index]["content"][: mark.block + 1]
    if mark.part >= 0:               # inside a tool_result: its content up to that block
        result = blocks[-1]
        blocks = [*blocks[:-1], {**result, "content": result["content"][: mark.part + 1]}]
    cut["messages"] = [*msgs[: mark.index], {**msgs[mark.index], "content": blocks}]
    return cut
