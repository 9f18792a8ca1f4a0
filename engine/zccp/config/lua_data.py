"""A reader for Lua *data* files: `return { ... }` made of literals only.

Used for lua/zccp/mask_patterns.lua, lua/zccp/fp/tables.lua and
lua/zccp/error_kinds.lua, which nginx runs as Lua and the engine reads with this
parser (no Lua runtime in the engine). Supported: comments (-- and --[==[ ]==]),
`return` (optional), table constructors with `name = v`, `[k] = v` and positional
fields, `,`/`;` separators, strings ("..." / '...' with every LuaJIT escape,
[==[ long ]==] strings), numbers (decimal, hex integers, unary minus), true,
false, nil. Strings come back as bytes; a table with only positional fields comes
back as a list, any other table as a dict (positional fields under the keys 1, 2, ...).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["LuaDataError", "parse_lua_data", "load_lua_data"]

class LuaDataError(ValueError):
    pass


_ESCAPES = {ord("a"): 7, ord("b"): 8, ord("f"): 12, ord("n"): 10, ord("r"): 13,
            ord("t"): 9, ord("v"): 11, ord("\\"): 92, ord('"'): 34, ord("'"): 39}
_WS = b" \t\r\n\f\v"
_NAME_START = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_NAME_CHARS = _NAME_START | set(b"0123456789")
_DIGITS = set(b"0123456789")
_HEX = set(b"0123456789abcdefABCDEF")


class _Parser:
    def __init__(self, src: bytes, where: str):
        self.s = src
        self.i = 0
        self.where = where

    def err(self, msg: str) -> LuaDataError:
        line = self.s.count(b"\n", 0, self.i) + 1
        return LuaDataError(f"{self.where}:{line}: {msg}")

    def skip(self) -> None:
        s, n = self.s, len(self.s)
        while self.i < n:
            c = s[self.i]
            if c in _WS:
                self.i += 1
            elif s.startswith(b"--", self.i):
                self.i += 2
                level = self._long_open()
                if level is not None:
                    self._long_body(level)
                else:
                    j = s.find(b"\n", self.i)
                    self.i = n if j < 0 else j + 1
            else:
                return

    def _long_open(self) -> int | None:
        """At '[' '='* '[': consume it and return the level; else None (nothing consumed)."""
        s, i = self.s, self.i
        if i < len(s) and s[i] == ord("["):
            j = i + 1
            while j < len(s) and s[j] == ord("="):
                j += 1
            if j < len(s) and s[j] == ord("["):
                self.i = j + 1
                return j - i - 1
        return None

    def _at_long_open(self) -> bool:
        """At '[' '='* '[' (a long string), consuming nothing."""
        save = self.i
        level = self._long_open()
        self.i = save
        return level is not None

    def _long_body(self, level: int) -> bytes:
        s = self.s
        close = b"]" + b"=" * level + b"]"
        j = s.find(close, self.i)
        if j < 0:
            raise self.err("unfinished long string or comment")
        body = s[self.i:j]
        self.i = j + len(close)
        # Lua: every line break (\n, \r, \r\n, \n\r) reads as \n; a first one is skipped.
        out = bytearray()
        k, m = 0, len(body)
        first = True
        while k < m:
            c = body[k]
            if c in (10, 13):
                if k + 1 < m and body[k + 1] in (10, 13) and body[k + 1] != c:
                    k += 1
                if not (first and not out):
                    out.append(10)
                k += 1
            else:
                out.append(c)
                k += 1
            first = False
        return bytes(out)

    def _short_string(self, q: int) -> bytes:
        s, n = self.s, len(self.s)
        self.i += 1
        out = bytearray()
        while True:
            if self.i >= n:
                raise self.err("unfinished string")
            c = s[self.i]
            if c == q:
                self.i += 1
                return bytes(out)
            if c in (10, 13):
                raise self.err("unfinished string")
            if c != 92:
                out.append(c)
                self.i += 1
                continue
            self.i += 1
            if self.i >= n:
                raise self.err("unfinished string")
            e = s[self.i]
            if e in _ESCAPES:
                out.append(_ESCAPES[e])
                self.i += 1
            elif e in (10, 13):
                self.i += 1
                if self.i < n and s[self.i] in (10, 13) and s[self.i] != e:
                    self.i += 1
                out.append(10)
            elif e == ord("x"):
                h = s[self.i + 1:self.i + 3]
                if len(h) != 2 or not all(ch in _HEX for ch in h):
                    raise self.err("invalid escape sequence \\x")
                out.append(int(h, 16))
                self.i += 3
            elif e == ord("z"):
                self.i += 1
                while self.i < n and s[self.i] in _WS:
                    self.i += 1
            elif e == ord("u"):
                j = s.find(b"}", self.i)
                if not s.startswith(b"{", self.i + 1) or j < 0:
                    raise self.err("invalid escape sequence \\u")
                try:
                    cp = int(s[self.i + 2:j], 16)
                except ValueError:
                    raise self.err("invalid escape sequence \\u") from None
                if cp >= 0x110000:
                    raise self.err("invalid escape sequence \\u")
                out += chr(cp).encode("utf-8", "surrogatepass")
                self.i = j + 1
            elif e in _DIGITS:
                j = self.i
                while j < n and j < self.i + 3 and s[j] in _DIGITS:
                    j += 1
                v = int(s[self.i:j])
                if v > 255:
                    raise self.err("invalid escape sequence (decimal escape too large)")
                out.append(v)
                self.i = j
            else:
                raise self.err(f"invalid escape sequence \\{chr(e)}")

    def _number(self) -> int | float:
        s, n = self.s, len(self.s)
        j = self.i
        if s.startswith((b"0x", b"0X"), j):
            j += 2
            k = j
            while k < n and s[k] in _HEX:
                k += 1
            if k == j:
                raise self.err("malformed number")
            self.i = k
            return int(s[j:k], 16)
        k = j
        while k < n and (s[k] in _DIGITS or s[k] in b".eE" or (s[k] in b"+-" and s[k - 1] in b"eE")):
            k += 1
        tok = s[j:k].decode()
        self.i = k
        try:
            return int(tok) if tok.isdigit() else float(tok)
        except ValueError:
            raise self.err(f"malformed number {tok!r}") from None

    def _name(self) -> str:
        s, j = self.s, self.i
        while j < len(s) and s[j] in _NAME_CHARS:
            j += 1
        name = s[self.i:j].decode()
        self.i = j
        return name

    def value(self) -> Any:
        self.skip()
        s = self.s
        if self.i >= len(s):
            raise self.err("unexpected end of file")
        c = s[self.i]
        if c == ord("{"):
            return self.table()
        if c in (34, 39):
            return self._short_string(c)
        if c == ord("["):
            level = self._long_open()
            if level is None:
                raise self.err("unexpected '['")
            return self._long_body(level)
        if c == ord("-"):
            self.i += 1
            self.skip()
            v = self.value()
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise self.err("unary minus on a non-number")
            return -v
        if c in _DIGITS or (c == ord(".") and self.i + 1 < len(s) and s[self.i + 1] in _DIGITS):
            return self._number()
        if c in _NAME_START:
            name = self._name()
            if name == "true":
                return True
            if name == "false":
                return False
            if name == "nil":
                return None
            raise self.err(f"only literals are allowed (found the name {name!r})")
        raise self.err(f"unexpected character {chr(c)!r}")

    def table(self) -> Any:
        self.i += 1  # '{'
        pos: list[Any] = []
        named: dict[Any, Any] = {}
        while True:
            self.skip()
            if self.i >= len(self.s):
                raise self.err("unfinished table")
            c = self.s[self.i]
            if c == ord("}"):
                self.i += 1
                break
            if c in _NAME_START:
                save = self.i
                name = self._name()
                self.skip()
                if self.i < len(self.s) and self.s[self.i] == ord("=") and not self.s.startswith(b"==", self.i):
                    self.i += 1
                    named[name] = self.value()
                else:
                    self.i = save
                    pos.append(self.value())
            elif c == ord("[") and not self._at_long_open():
                self.i += 1
                k = self.value()
                self.skip()
                if not self.s.startswith(b"]", self.i):
                    raise self.err("']' expected")
                self.i += 1
                self.skip()
                if not self.s.startswith(b"=", self.i):
                    raise self.err("'=' expected")
                self.i += 1
                named[k] = self.value()
            else:
                pos.append(self.value())
            self.skip()
            if self.i < len(self.s) and self.s[self.i] in b",;":
                self.i += 1
            elif not self.s.startswith(b"}", self.i):
                raise self.err("',' or '}' expected")
        if not named:
            return pos
        for k, v in enumerate(pos, 1):
            named[k] = v
        return named

    def chunk(self) -> Any:
        self.skip()
        end = self.i + 6
        if self.s.startswith(b"return", self.i) and (end >= len(self.s) or self.s[end] not in _NAME_CHARS):
            self.i += 6
        v = self.value()
        self.skip()
        if self.s.startswith(b";", self.i):
            self.i += 1
            self.skip()
        if self.i != len(self.s):
            raise self.err("only one `return { ... }` is allowed")
        return v


def parse_lua_data(src: bytes | str, where: str = "<lua>") -> Any:
    if isinstance(src, str):
        src = src.encode()
    if src.startswith(b"#"):  # a shebang line, as Lua allows
        j = src.find(b"\n")
        src = b"" if j < 0 else src[j:]
    return _Parser(src, where).chunk()


def load_lua_data(path: str | Path) -> Any:
    p = Path(path)
    return parse_lua_data(p.read_bytes(), str(p))


