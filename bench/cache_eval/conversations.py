"""Request bodies beyond a single user message, in both APIs' shapes: agent loops (tool
calls and their results), images, documents, multi-turn chats. The texts come from
ShareGPT (bench.cache_eval.prompts); the bytes of images and documents are random."""

from __future__ import annotations

import base64
import json
import random
from typing import Any

MODEL = "zccp-tiny"
TOOL_A = {"name": "read_file", "description": "Read a file of the repository",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
TOOL_O = {"type": "function", "function": {"name": "read_file", "description": "Read a file of the repository",
                                           "parameters": TOOL_A["input_schema"]}}
_DIRS = ["src", "lib", "tests", "docs", "app", "pkg/core", "scripts"]
_FILES = ["main", "utils", "config", "models", "views", "handlers", "parser", "client", "server", "schema"]


def body(api: str, msgs: list, max_tokens: int, **extra: Any) -> dict:
    b = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "messages": msgs}
    b.update(extra)
    return b


def path_arg(rng: random.Random) -> dict:
    return {"path": f"{rng.choice(_DIRS)}/{rng.choice(_FILES)}.py"}


def agent(api: str, task: str, calls: list[dict], outputs: list[str], max_tokens: int) -> dict:
    """A coding-agent loop: the task, then one round per (call arguments, tool output); the
    request ends on the last tool output (Anthropic: a user turn of one tool_result block;
    OpenAI: a tool message)."""
    msgs: list = [{"role": "user", "content": task}]
    for i, (arg, out) in enumerate(zip(calls, outputs, strict=True)):
        if api == "anthropic":
            msgs.append({"role": "assistant", "content": [
                {"type": "text", "text": "Let me look at that file."},
                {"type": "tool_use", "id": f"toolu_{i:04d}", "name": "read_file", "input": arg}]})
            msgs.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"toolu_{i:04d}", "content": out}]})
        else:
            msgs.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{i:04d}", "type": "function",
                 "function": {"name": "read_file", "arguments": json.dumps(arg)}}]})
            msgs.append({"role": "tool", "tool_call_id": f"call_{i:04d}", "content": out})
    return body(api, msgs, max_tokens, tools=[TOOL_A if api == "anthropic" else TOOL_O])


def fake_bytes(rng: random.Random, kind: str, n: int) -> bytes:
    head = {"png": b"\x89PNG\r\n\x1a\n", "pdf": b"%PDF-1.4\n"}[kind]
    return head + rng.randbytes(n)


def image(api: str, question: str, data: bytes, max_tokens: int) -> dict:
    b64 = base64.b64encode(data).decode()
    if api == "anthropic":
        blk = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}
    else:
        blk = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64}}
    return body(api, [{"role": "user", "content": [blk, {"type": "text", "text": question}]}], max_tokens)


def document(api: str, question: str, data: bytes, max_tokens: int) -> dict:
    b64 = base64.b64encode(data).decode()
    if api == "anthropic":
        blk = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": b64}}
    else:
        blk = {"type": "file", "file": {"filename": "document.pdf", "file_data": "data:application/pdf;base64," + b64}}
    return body(api, [{"role": "user", "content": [blk, {"type": "text", "text": question}]}], max_tokens)


def chat(api: str, first: str, answer: str, second: str, max_tokens: int) -> dict:
    """A two-turn conversation: question, answer, the next question (the final user turn)."""
    return body(api, [{"role": "user", "content": first}, {"role": "assistant", "content": answer},
                      {"role": "user", "content": second}], max_tokens)
