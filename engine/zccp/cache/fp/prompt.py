"""The final user turn (docs/fingerprint.md §3): the text the CSF reads, when the last
message of a decoded, masked request is a user turn of text only. The Python side of
lua/zccp/fp/prompt.lua.

    final_turn(doc) -> list of str/bytes pieces of the turn's text, or None (exact-only)
    prefix_of(pieces) -> prefix(n): the first bytes of the joined pieces, built lazily
"""

from __future__ import annotations

from typing import Any

from zccp.cache.fp.canonical import as_bytes
from zccp.cache.fp.tables import TEXT_BLOCK_KEYS, TURN_KEYS


def _is(v: Any, word: bytes) -> bool:
    return isinstance(v, (str, bytes)) and as_bytes(v) == word


def final_turn(doc: dict) -> list | None:
    """The text of a text-only final user turn as pieces (joined: the CSF's input), or None."""
    msgs = doc.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return None
    last = msgs[-1]
    # an object with role "user" and no member but role and content (lua-cjson's empty
    # container [] is an object without a role)
    if not isinstance(last, dict) or not _is(last.get("role"), b"user") or not last.keys() <= TURN_KEYS:
        return None
    content = last.get("content")
    if isinstance(content, (str, bytes)):
        return [content]
    if not isinstance(content, list) or not content:
        return None   # null, a number, an object, or no blocks at all
    out: list = []
    for i, blk in enumerate(content):
        if (not isinstance(blk, dict) or not _is(blk.get("type"), b"text")
                or not isinstance(blk.get("text"), (str, bytes)) or not blk.keys() <= TEXT_BLOCK_KEYS):
            return None   # an image, a document, a tool result, ...: exact-only
        if i:
            out.append(b"\n")
        out.append(blk["text"])
    return out


def prefix_of(pieces: list):
    """prefix(n) -> (at least the first n bytes of the joined pieces, or all of them; whether all):
    the CSF reads at most 1024 tokens, so a long text is never joined whole."""
    def prefix(n: int) -> tuple[bytes, bool]:
        out: list[bytes] = []
        size = 0
        for p in pieces:
            if size >= n:
                return b"".join(out), False
            need = n - size
            if len(p) > need:    # a str of more than `need` code points has more than `need` bytes
                b = (p[:need].encode("utf-8", "surrogateescape") if isinstance(p, str) else p[:need])
                out.append(b)
                return b"".join(out), False
            b = as_bytes(p)
            out.append(b)
            size += len(b)
        return b"".join(out), True
    return prefix
