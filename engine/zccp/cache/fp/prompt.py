"""The prompt text the CSF reads (docs/fingerprint.md §3): `role: text\\n` per entry,
from a decoded, masked request. The Python side of lua/zccp/fp/prompt.lua.

    prompt_text(api, doc) -> bytes
    prompt_prefix(api, doc) -> prefix(n): the first bytes of it, built lazily
"""

from __future__ import annotations

from typing import Any

from zccp.cache.fp.canonical import as_bytes


# lua-cjson decodes {} and [] to the same empty table: an empty container is both
# an object and an array, exactly as lua/zccp/fp/prompt.lua sees it.
def _is_obj(v: Any) -> bool:
    return isinstance(v, dict) or (isinstance(v, list) and not v)


def _is_arr(v: Any) -> bool:
    return isinstance(v, list) or (isinstance(v, dict) and not v)


def _text_pieces(content: Any, out: list) -> None:
    if isinstance(content, (str, bytes)):
        out.append(content)
        return
    if content is None:
        return
    if _is_arr(content):
        for i, blk in enumerate(content):
            if i:
                out.append(b"\n")
            t = blk.get("type") if isinstance(blk, dict) else None   # [] has no type either
            if isinstance(t, (str, bytes)):
                txt = blk.get("text")
                if as_bytes(t) == b"text" and isinstance(txt, (str, bytes)):
                    out.append(txt)
                else:
                    out.extend((b"[", t, b"]"))
            else:
                out.append(b"[?]")
        return
    out.append(b"[?]")


def _entry(role: Any, content: Any, out: list) -> None:
    out.extend((role if isinstance(role, (str, bytes)) else b"?", b": "))
    _text_pieces(content, out)
    out.append(b"\n")


def prompt_pieces(api: str, doc: dict) -> list:
    """The prompt text as a list of str / bytes pieces (str pieces encode with surrogateescape)."""
    out: list = []
    messages = doc.get("messages")
    msgs = messages if isinstance(messages, list) else []
    if api == "anthropic":
        if "system" in doc and doc["system"] is not None:
            _entry(b"system", doc["system"], out)
        for m in msgs:
            if _is_obj(m):
                m = m or {}
                _entry(m.get("role"), m.get("content"), out)
            else:
                _entry(None, b"[?]", out)
    else:
        rest: list = []
        for m in msgs:
            if _is_obj(m):
                m = m or {}
                role = m.get("role")
                first = isinstance(role, (str, bytes)) and as_bytes(role) in (b"system", b"developer")
                _entry(role, m.get("content"), out if first else rest)
            else:
                _entry(None, b"[?]", rest)
        out.extend(rest)
    return out


def prompt_text(api: str, doc: dict) -> bytes:
    """The (already masked) prompt text the CSF reads: `role: text\\n` per entry."""
    return b"".join(as_bytes(p) for p in prompt_pieces(api, doc))


def prompt_prefix(api: str, doc: dict):
    """prefix(n) -> (at least the first n bytes of the prompt text, or all of it; whether
    that is all): the CSF reads at most 1024 tokens, so a long prompt is never joined whole."""
    return prefix_of(prompt_pieces(api, doc))


def prefix_of(pieces: list):
    """prefix(n) -> (at least the first n bytes of the joined pieces, or all of them; whether all)."""
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
