"""PCRE1 through ctypes: the very library behind nginx's ngx.re, called the way ngx.re does.

`Regex(pattern, replacement)` compiles like `ngx.re.gsub(s, pattern, replacement, "jo")`
(PCRE1, libpcre.so.3, JIT-compiled, byte mode, no compile or exec options) and
`gsub` replays lua-resty-core's global substitution loop (empty matches advance
one byte) and ngx_http_lua's replacement templates ($0, $12, ${1}, $$), so Python
masks text byte for byte as nginx does (docs/fingerprint.md §2).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import weakref

__all__ = ["MaskError", "Regex", "pcre_version"]

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
    raise ImportError("zccp.cache.pcre needs PCRE1 (libpcre.so.3, the library nginx's ngx.re uses): "
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


class Regex:
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

    def gsub(self, subj: bytes, matches: list[bytes] | None = None) -> tuple[bytes, int]:
        """lua-resty-core's re_sub_str_helper (global): returns (result, number of matches).
        matches: a list that receives the text of each match (`$0`)."""
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
            if matches is not None:
                matches.append(subj[s:e])
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
