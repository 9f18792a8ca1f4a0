"""Mask patterns: the Python side of lua/zccp/masks.lua.

Masks rewrite volatile values (IDs, UUIDs, timestamps, e-mail addresses) in the
prompt text before any cache key or fingerprint is computed (never in what the
model sees). The patterns live in ONE file, lua/zccp/mask_patterns.lua, which
nginx loads as Lua and this module reads with a literal-only Lua parser.

Matching is byte-identical to ngx.re.gsub(subject, pattern, replacement, "jo"):
this module calls the very library nginx uses for ngx.re (PCRE1, libpcre.so.3,
JIT-compiled, byte mode, no compile or exec options) through ctypes, and it
replays lua-resty-core's gsub loop (empty matches advance one byte) and
ngx_http_lua's replacement templates ($0, $12, ${1}, $$). See docs/fingerprint.md.

    load_masks(path=None, last_good_path=None) -> MaskSet
    MaskSet.apply(data: bytes) -> bytes   (the same object when nothing matched)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

__all__ = [
    "MaskError", "MaskPattern", "MaskSet", "load_masks", "default_patterns_path",
    "LuaDataError", "parse_lua_data", "load_lua_data", "EMPTY_MASKS",
]

_REPO_LUA = Path(__file__).resolve().parents[2] / "lua" / "zccp"


def default_patterns_path() -> Path:
    """lua/zccp/mask_patterns.lua next to this checkout (ZCCP_MASK_PATTERNS overrides)."""
    env = os.environ.get("ZCCP_MASK_PATTERNS")
    return Path(env) if env else _REPO_LUA / "mask_patterns.lua"


# ---------------------------------------------------------------------------
# A reader for Lua *data* files: `return { ... }` made of literals only.
#
# Used for lua/zccp/mask_patterns.lua and lua/zccp/fp_tables.lua. Supported:
# comments (-- and --[==[ ]==]), `return` (optional), table constructors with
# `name = v`, `[k] = v` and positional fields, `,`/`;` separators, strings
# ("..." / '...' with every LuaJIT escape, [==[ long ]==] strings), numbers
# (decimal, hex integers, unary minus), true, false, nil. Strings come back as
# bytes; a table with only positional fields comes back as a list, any other
# table as a dict (positional fields under the keys 1, 2, ...).
# ---------------------------------------------------------------------------

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
        if self.s.startswith(b"return", self.i) and (self.i + 6 >= len(self.s) or self.s[self.i + 6] not in _NAME_CHARS):
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


# ---------------------------------------------------------------------------
# PCRE1 through ctypes: the library behind ngx.re.
# ---------------------------------------------------------------------------

class MaskError(ValueError):
    pass


_PCRE_STUDY_JIT_COMPILE = 0x0001
_PCRE_INFO_CAPTURECOUNT = 2
_PCRE_ERROR_NOMATCH = -1


def _load_pcre() -> ctypes.CDLL:
    names = ["libpcre.so.3", ctypes.util.find_library("pcre") or "", "libpcre.so.1", "libpcre.so"]
    errors = []
    for name in names:
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError as e:
            errors.append(str(e))
            continue
        lib.pcre_compile.restype = ctypes.c_void_p
        lib.pcre_compile.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p),
                                     ctypes.POINTER(ctypes.c_int), ctypes.c_void_p]
        lib.pcre_study.restype = ctypes.c_void_p
        lib.pcre_study.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        lib.pcre_exec.restype = ctypes.c_int
        lib.pcre_exec.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
                                  ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        lib.pcre_fullinfo.restype = ctypes.c_int
        lib.pcre_fullinfo.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        lib.pcre_free_study.restype = None
        lib.pcre_free_study.argtypes = [ctypes.c_void_p]
        lib.pcre_version.restype = ctypes.c_char_p
        return lib
    raise ImportError("zccp.masks needs PCRE1 (libpcre.so.3, the library nginx's ngx.re uses): "
                      + "; ".join(errors))


_pcre = _load_pcre()
_pcre_free = ctypes.CFUNCTYPE(None, ctypes.c_void_p).in_dll(_pcre, "pcre_free")


def pcre_version() -> str:
    return _pcre.pcre_version().decode()


def _free(code: int, extra: int | None) -> None:
    if extra:
        _pcre.pcre_free_study(extra)
    if code:
        _pcre_free(code)


def _compile_template(repl: bytes) -> tuple[bytes | int, ...]:
    """ngx_http_lua's replacement template: $$, $<digits>, ${<digits>}; anything else after $ is an error."""
    parts: list[bytes | int] = []
    lit = bytearray()
    i, n = 0, len(repl)
    while i < n:
        c = repl[i]
        if c != 0x24:  # '$'
            lit.append(c)
            i += 1
            continue
        i += 1
        if i < n and repl[i] == 0x24:
            lit.append(0x24)
            i += 1
            continue
        bracket = i < n and repl[i] == 0x7B  # '{'
        if bracket:
            i += 1
        j = i
        while j < n and 0x30 <= repl[j] <= 0x39:
            j += 1
        if j == i or (bracket and (j >= n or repl[j] != 0x7D)):
            raise MaskError("failed to compile the replacement template")
        if lit:
            parts.append(bytes(lit))
            lit.clear()
        parts.append(int(repl[i:j]))
        i = j + 1 if bracket else j
    if lit:
        parts.append(bytes(lit))
    return tuple(parts)


class _Regex:
    """One compiled pattern + replacement, applied like ngx.re.gsub(s, pattern, replacement, "jo")."""

    __slots__ = ("pattern", "replacement", "_code", "_extra", "_ovsize", "_template", "_const", "__weakref__")

    def __init__(self, pattern: bytes, replacement: bytes):
        self.pattern = pattern
        self.replacement = replacement
        # ngx_http_lua copies the pattern into a NUL-terminated buffer: an embedded NUL ends it.
        cpat = pattern.split(b"\0", 1)[0]
        err = ctypes.c_char_p()
        erroff = ctypes.c_int()
        code = _pcre.pcre_compile(cpat, 0, ctypes.byref(err), ctypes.byref(erroff), None)
        if not code:
            msg = (err.value or b"?").decode("utf-8", "replace")
            raise MaskError(f'pcre_compile() failed: {msg} in "{pattern.decode("utf-8", "replace")}"')
        serr = ctypes.c_char_p()
        extra = _pcre.pcre_study(code, _PCRE_STUDY_JIT_COMPILE, ctypes.byref(serr))
        if serr.value:
            _free(code, extra)
            raise MaskError(f"pcre_study() failed: {serr.value.decode('utf-8', 'replace')}")
        ncap = ctypes.c_int()
        _pcre.pcre_fullinfo(code, extra, _PCRE_INFO_CAPTURECOUNT, ctypes.byref(ncap))
        self._code = code
        self._extra = extra
        weakref.finalize(self, _free, code, extra)
        self._ovsize = (ncap.value + 1) * 3
        self._template = _compile_template(replacement)
        self._const = replacement.replace(b"$$", b"$") if all(isinstance(p, bytes) for p in self._template) else None

    def search(self, subj: bytes) -> bool:
        """Whether the pattern matches somewhere in subj (True as well when PCRE fails)."""
        ov = (ctypes.c_int * self._ovsize)()
        return _pcre.pcre_exec(self._code, self._extra, subj, len(subj), 0, 0, ov, self._ovsize) != _PCRE_ERROR_NOMATCH

    def gsub(self, subj: bytes) -> tuple[bytes, int]:
        """lua-resty-core's re_sub_str_helper (global): returns (result, number of matches)."""
        n = len(subj)
        ov = (ctypes.c_int * self._ovsize)()
        code, extra, ovsize, exec_ = self._code, self._extra, self._ovsize, _pcre.pcre_exec
        pos = cp = count = 0
        out: list[bytes] = []
        const = self._const
        while True:
            rc = exec_(code, extra, subj, n, pos, 0, ov, ovsize)
            if rc == _PCRE_ERROR_NOMATCH:
                break
            if rc < 0:
                raise MaskError(f"pcre_exec() failed: {rc}")
            if rc == 0:
                raise MaskError("capture size too small")
            count += 1
            s, e = ov[0], ov[1]
            out.append(subj[cp:s])
            if const is not None:
                out.append(const)
            else:
                for part in self._template:
                    if isinstance(part, bytes):
                        out.append(part)
                    elif part < rc and ov[2 * part] >= 0:
                        out.append(subj[ov[2 * part]:ov[2 * part + 1]])
            cp = pos = e
            if pos == s:
                pos += 1
                if pos > n:
                    break
        if count == 0:
            return subj, 0
        out.append(subj[cp:])
        return b"".join(out), count


# ---------------------------------------------------------------------------
# Prefilters (lua/zccp/fp_tables.lua `mask_prefilters`, read by zccp.masks in Lua too):
# for a mask whose pattern is listed, regexes that every match of it contains. When
# one finds nothing in a string, the mask's gsub cannot match there and is skipped.
# ---------------------------------------------------------------------------

def _load_prefilters() -> dict[bytes, tuple[_Regex, ...]]:
    try:
        entries = load_lua_data(_REPO_LUA / "fp_tables.lua").get("mask_prefilters") or []
    except (OSError, LuaDataError, AttributeError):  # pragma: no cover
        return {}
    cache: dict[bytes, _Regex] = {}
    out: dict[bytes, tuple[_Regex, ...]] = {}
    for e in entries:
        if not isinstance(e, dict) or not isinstance(e.get("pattern"), bytes) or not isinstance(e.get("requires"), list):
            continue
        req = []
        for r in e["requires"]:
            if isinstance(r, bytes):
                try:
                    if r not in cache:
                        cache[r] = _Regex(r, b"")
                    req.append(cache[r])
                except MaskError:
                    pass
        if req:
            out[e["pattern"]] = tuple(req)
    return out


_PREFILTERS = _load_prefilters()


# ---------------------------------------------------------------------------
# Mask sets.
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class MaskPattern:
    name: str
    pattern: bytes
    replacement: bytes


@dataclass(frozen=True)
class MaskSet:
    """The mask patterns in force, in order; `errors` lists (name, message) of rejected ones."""

    patterns: tuple[MaskPattern, ...] = ()
    errors: tuple[tuple[str, str], ...] = ()
    source: str = ""
    _compiled: tuple[_Regex, ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def from_patterns(cls, entries: Iterable[Any], strict: bool = True) -> "MaskSet":
        """From (name, pattern, replacement) tuples or dicts; strict=True raises on a bad one."""
        good: list[MaskPattern] = []
        comp: list[_Regex] = []
        errors: list[tuple[str, str]] = []
        for idx, e in enumerate(entries, 1):
            if isinstance(e, dict):
                e = (e.get("name"), e.get("pattern"), e.get("replacement"))
            name, pat, repl = (_b(x) for x in e)
            try:
                if not name:
                    raise MaskError("entry has no name")
                r = _Regex(pat, repl)
            except MaskError as err:
                if strict:
                    raise MaskError(f"mask {name.decode('utf-8', 'replace') or idx}: {err}") from None
                errors.append((name.decode("utf-8", "replace") if name else f"#{idx}", str(err)))
                continue
            good.append(MaskPattern(name.decode("utf-8", "surrogateescape"), pat, repl))
            comp.append(r)
        return cls(tuple(good), tuple(errors), "", tuple(comp))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.patterns)

    @property
    def digest(self) -> str:
        """Hex SHA-256 over name NUL pattern NUL replacement NUL, per pattern in order
        (zccp.masks.digest() in Lua gives the same: compare them to detect drift)."""
        h = hashlib.sha256()
        for p in self.patterns:
            h.update(p.name.encode("utf-8", "surrogateescape") + b"\0" + p.pattern + b"\0" + p.replacement + b"\0")
        return h.hexdigest()

    def apply(self, data: bytes) -> bytes:
        """Every pattern in order; returns `data` itself (same object) when nothing matched."""
        found: dict[int, bool] = {}   # prefilter results for the current `data`
        for r in self._compiled:
            req = _PREFILTERS.get(r.pattern)
            if req is not None:
                skip = False
                for f in req:
                    hit = found.get(id(f))
                    if hit is None:
                        hit = found[id(f)] = f.search(data)
                    if not hit:
                        skip = True
                        break
                if skip:
                    continue
            new, n = r.gsub(data)
            if n:
                data = new
                found.clear()
        return data

    def apply_changed(self, data: bytes) -> tuple[bytes, bool]:
        """(masked, changed): changed is True when the masked text differs from `data`."""
        out = self.apply(data)
        return out, (out is not data and out != data)

    def __len__(self) -> int:
        return len(self.patterns)


EMPTY_MASKS = MaskSet()


def _b(x: Any) -> bytes:
    if x is None:
        return b""
    if isinstance(x, bytes):
        return x
    if isinstance(x, str):
        return x.encode("utf-8", "surrogateescape")
    raise MaskError(f"expected a string, got {type(x).__name__}")


def _entries(data: Any, where: str) -> list[Any]:
    if not isinstance(data, list):
        raise MaskError(f"{where}: expected `return {{ {{ name = ..., pattern = ..., replacement = ... }}, ... }}`")
    return data


def _read_entries(path: Path) -> list[Any]:
    return _entries(load_lua_data(path), str(path))


def _entry_fields(e: Any) -> tuple[Any, Any, Any]:
    if not isinstance(e, dict):
        return None, None, None
    return e.get("name"), e.get("pattern"), e.get("replacement")


def default_last_good_path(path: Path) -> Path:
    return path.with_name(path.stem + ".last_good.lua")


def load_masks(path: str | Path | None = None, last_good_path: str | Path | None = None) -> MaskSet:
    """The mask set nginx's zccp.masks has in force for the same files (docs/fingerprint.md):

    each entry of `path` (default lua/zccp/mask_patterns.lua) that compiles is used;
    one that does not is reported in `errors` by its name and replaced, at its
    position, by the entry of the same name in `last_good_path` (the set nginx last
    had in force; default: <path's stem>.last_good.lua next to it), else dropped. If
    `path` itself cannot be read or parsed, the whole last-good set is used.
    Unlike nginx, this never writes the last-good file.
    """
    path = Path(path) if path is not None else default_patterns_path()
    lg = Path(last_good_path) if last_good_path is not None else default_last_good_path(path)
    errors: list[tuple[str, str]] = []

    prev: dict[bytes, tuple[bytes, bytes]] = {}
    prev_order: list[bytes] = []
    try:
        if lg.exists():
            for e in _read_entries(lg):
                name, pat, repl = _entry_fields(e)
                if isinstance(name, bytes) and isinstance(pat, bytes) and isinstance(repl, bytes) and name not in prev:
                    prev[name] = (pat, repl)
                    prev_order.append(name)
    except (OSError, LuaDataError, MaskError):
        prev, prev_order = {}, []

    try:
        entries = _read_entries(path)
    except (OSError, LuaDataError, MaskError) as e:
        errors.append((str(path), str(e)))
        entries = [{"name": n, "pattern": prev[n][0], "replacement": prev[n][1]} for n in prev_order]
        prev = {}

    good: list[MaskPattern] = []
    comp: list[_Regex] = []
    seen: set[bytes] = set()
    for idx, e in enumerate(entries, 1):
        name, pat, repl = _entry_fields(e)
        label = name.decode("utf-8", "replace") if isinstance(name, bytes) and name else f"#{idx}"
        if not isinstance(name, bytes) or not name:
            errors.append((label, "entry needs a non-empty string `name`"))
            continue
        if name in seen:
            errors.append((label, "duplicate name"))
            continue
        seen.add(name)
        try:
            if not isinstance(pat, bytes):
                raise MaskError("`pattern` must be a string")
            if repl is None:
                repl = b""
            if not isinstance(repl, bytes):
                raise MaskError("`replacement` must be a string")
            r = _Regex(pat, repl)
        except MaskError as err:
            errors.append((label, str(err)))
            if name not in prev:
                continue
            pat, repl = prev[name]
            try:
                r = _Regex(pat, repl)
            except MaskError:
                continue
        good.append(MaskPattern(name.decode("utf-8", "surrogateescape"), pat, repl))
        comp.append(r)
    return MaskSet(tuple(good), tuple(errors), str(path), tuple(comp))
