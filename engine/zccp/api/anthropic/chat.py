"""A validated Messages body as chat-template messages (backends with a chat template)."""

from __future__ import annotations

from typing import Any, Final

from ...shared_types import ChatInput
from ..common import JOIN
from .parse import _system
from .wording import _bad, _dict, _list, _required, _str


_SKIPPED_BLOCKS: Final = frozenset({"thinking", "redacted_thinking"})   # earlier turns' reasoning


def _tool_result_text(block: dict[str, Any], path: str, media: list[tuple[str, str]]) -> str:
    content = block.get("content", "")
    if isinstance(content, str):
        return content
    parts = []
    for k, item in enumerate(_list(content, path + ".content")):
        item = _dict(item, f"{path}.content.{k}")
        if item.get("type") == "text":
            parts.append(_str(_required(item, "text", f"{path}.content.{k}.text"), f"{path}.content.{k}.text"))
        else:
            media.append((f"{path}.content.{k}", str(item.get("type"))))
    return JOIN.join(parts)


def chat_input(obj: dict[str, Any]) -> ChatInput:
    """A validated body (parse_document) as chat-template messages: system first;
    tool_use blocks become the assistant's tool_calls, tool_result blocks "tool"
    messages, in block order; images and documents are listed in `media`."""
    messages: list[dict[str, Any]] = []
    media: list[tuple[str, str]] = []
    if (v := obj.get("system")) is not None and (system := _system(v)):
        messages.append({"role": "system", "content": system})
    for i, msg in enumerate(obj["messages"]):
        path, role, content = f"messages.{i}", msg["role"], msg["content"]
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
            continue
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for j, block in enumerate(content):
            bpath = f"{path}.content.{j}"
            btype = block["type"]
            if btype == "text":
                texts.append(block["text"])
            elif btype == "tool_use" and role == "assistant":
                calls.append({"id": _str(_required(block, "id", bpath + ".id"), bpath + ".id"), "type": "function",
                              "function": {"name": _str(_required(block, "name", bpath + ".name"), bpath + ".name"),
                                           "arguments": _dict(_required(block, "input", bpath + ".input"),
                                                              bpath + ".input")}})
            elif btype == "tool_result" and role == "user":
                if texts:
                    messages.append({"role": "user", "content": JOIN.join(texts)})
                    texts = []
                call_id = _str(_required(block, "tool_use_id", bpath + ".tool_use_id"), bpath + ".tool_use_id")
                messages.append({"role": "tool", "tool_call_id": call_id,
                                 "content": _tool_result_text(block, bpath, media)})
            elif btype not in _SKIPPED_BLOCKS:
                media.append((bpath, btype))
        if role == "assistant":
            messages.append({"role": "assistant", "content": JOIN.join(texts),
                             **({"tool_calls": calls} if calls else {})})
        elif texts:
            messages.append({"role": "user", "content": JOIN.join(texts)})
    tools: list[dict[str, Any]] | None = None
    choice: str | dict[str, Any] | None = None
    if obj.get("tools"):
        tools = []
        for i, tool in enumerate(obj["tools"]):
            if tool.get("type", "custom") != "custom" or "input_schema" not in tool:
                raise _bad(f"tools.{i}", f"tool type {tool.get('type', 'custom')!r} is not supported here: "
                                         "only custom tools (name, description, input_schema)")
            fn = {"name": tool["name"], "description": tool.get("description") or "",
                  "parameters": tool["input_schema"]}
            tools.append({"type": "function", "function": fn})
        tc = obj.get("tool_choice") or {"type": "auto"}
        choice = {"auto": "auto", "any": "required", "none": "none"}.get(tc["type"]) or \
            {"type": "function", "function": {"name": tc.get("name")}}
        if choice == "none":
            tools = None                 # a turn that may not call tools is not shown them
    return ChatInput(messages, tools, choice, tuple(media))


