"""A validated Chat Completions body as chat-template messages (backends with a chat template)."""

from __future__ import annotations

from typing import Any

import orjson

from ...shared_types import ChatInput
from ..common import JOIN


def _parts_text(content: Any, path: str, media: list[tuple[str, str]]) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    pieces = []
    for j, part in enumerate(content):
        if part["type"] in ("text", "refusal"):
            pieces.append(part.get("text") or part.get("refusal") or "")
        else:
            media.append((f"{path}.content[{j}]", part["type"]))
    return JOIN.join(pieces)


def _arguments(raw: Any) -> Any:
    """Tool-call arguments as the template takes them: the object (a JSON string that is
    not one stays a string)."""
    if isinstance(raw, str):
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw
        return parsed if isinstance(parsed, dict) else raw
    return raw


def chat_input(obj: dict[str, Any]) -> ChatInput:
    """A validated body (parse_document) as chat-template messages: the system and
    developer messages joined first (as GenerationRequest.system), then the turns in
    order; image, audio and file parts are listed in `media`."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    media: list[tuple[str, str]] = []
    for i, msg in enumerate(obj["messages"]):
        path, role = f"messages[{i}]", msg["role"]
        text = _parts_text(msg.get("content"), path, media)
        if role in ("system", "developer"):
            system.append(text)
        elif role == "tool":
            turns.append({"role": "tool", "tool_call_id": msg["tool_call_id"], "content": text})
        elif role == "assistant":
            m: dict[str, Any] = {"role": "assistant", "content": text}
            if msg.get("tool_calls"):
                m["tool_calls"] = [
                    {"id": tc["id"], "type": "function",
                     "function": {"name": tc["function"]["name"], "arguments": _arguments(tc["function"]["arguments"])}}
                    for tc in msg["tool_calls"]]
            turns.append(m)
        else:
            turns.append({"role": "user", "content": text})
    messages = ([{"role": "system", "content": JOIN.join(system)}] if system else []) + turns
    tools = obj.get("tools") or None
    choice = obj.get("tool_choice") or ("auto" if tools else None)
    if choice == "none":
        tools = None                     # a turn that may not call tools is not shown them
    return ChatInput(messages, tools, choice, tuple(media))


