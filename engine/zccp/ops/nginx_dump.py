"""`nginx -T`'s output read back into a tree of directives, each with its file and line.

`nginx -T` prints every configuration file it read, each after a line
`# configuration file PATH:`; an `include` is expanded here by matching its pattern
against those files (nginx printed each file once, in the order it read them). Written
by hand: nginx's grammar is small (words, quoted strings, `;`, `{`, `}`, comments), and
the Python parsers of it (crossplane) read files from disk, not a dump, and are not
packaged for Debian.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

_FILE_HEADER = re.compile(r"^# configuration file (.+):$", re.M)
_MAX_INCLUDE_DEPTH = 16


class DumpError(ValueError):
    """Text that is not `nginx -T`'s output, or a configuration it cannot have accepted."""


@dataclass
class Directive:
    name: str
    args: list[str]
    file: str
    line: int
    children: list[Directive] | None = None   # None: a simple directive; a list: a block

    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def blocks(self, name: str) -> list[Directive]:
        return [d for d in self.children or [] if d.name == name and d.children is not None]

    def values(self, name: str) -> list[Directive]:
        return [d for d in self.children or [] if d.name == name]


@dataclass
class _Token:
    text: str
    line: int
    quoted: bool = False


@dataclass
class Dump:
    files: dict[str, str] = field(default_factory=dict)   # path -> text, in nginx's order

    @property
    def main(self) -> str:
        if not self.files:
            raise DumpError("no '# configuration file PATH:' line: not the output of nginx -T")
        return next(iter(self.files))


def split_dump(text: str) -> Dump:
    """The files of an `nginx -T` output (its stdout; stderr's lines before are ignored)."""
    heads = list(_FILE_HEADER.finditer(text))
    d = Dump()
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        d.files.setdefault(m.group(1), text[m.end() + 1:end])
    return d


def _skip_lua_block(text: str, i: int, line: int) -> tuple[int, int]:
    """From just after a *_by_lua_block's `{`: the index after its matching `}` (Lua code,
    strings and comments skipped roughly: enough to find the block's end)."""
    depth = 1
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j
        elif text.startswith("--", i):
            j = text.find("\n", i)
            i = (j if j >= 0 else n) - 1
        elif text.startswith("[[", i):
            j = text.find("]]", i)
            j = j if j >= 0 else n
            line += text.count("\n", i, j)
            i = j + 1
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1, line
        i += 1
    raise DumpError(f"line {line}: a *_by_lua_block without its closing brace")


def tokenize(text: str) -> list[_Token]:
    out: list[_Token] = []
    i, line, n = 0, 1, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c.isspace():
            i += 1
        elif c == "#":
            j = text.find("\n", i)
            i = j if j >= 0 else n
        elif c in ";{}":
            out.append(_Token(c, line))
            i += 1
            if c == "{" and len(out) >= 2:
                # the name of the directive this brace opens: a Lua block's body is Lua
                k = len(out) - 2
                while k > 0 and out[k - 1].text not in ";{}":
                    k -= 1
                if out[k].text.endswith("_by_lua_block") and not out[k].quoted:
                    i, line = _skip_lua_block(text, i, line)
                    out.append(_Token("}", line))
        elif c in "\"'":
            j, buf, start = i + 1, [], line
            while j < n and text[j] != c:
                if text[j] == "\\" and j + 1 < n:
                    buf.append(text[j + 1] if text[j + 1] in "\"'\\" else text[j:j + 2])
                    j += 2
                    continue
                if text[j] == "\n":
                    line += 1
                buf.append(text[j])
                j += 1
            out.append(_Token("".join(buf), start, quoted=True))
            i = j + 1
        else:
            j = i
            while j < n and not text[j].isspace() and text[j] not in ";{}\"'":
                j += 1 if text[j] != "\\" else 2
            out.append(_Token(text[i:j], line))
            i = j
    return out


class _Parser:
    def __init__(self, dump: Dump) -> None:
        self.dump = dump
        self.base = str(PurePosixPath(dump.main).parent)
        self.tokens = {path: tokenize(text) for path, text in dump.files.items()}

    def parse_file(self, path: str, depth: int = 0) -> list[Directive]:
        if depth > _MAX_INCLUDE_DEPTH:
            raise DumpError(f"{path}: includes nested deeper than {_MAX_INCLUDE_DEPTH}")
        toks = self.tokens[path]
        out, pos = self._block(path, toks, 0, depth)
        if pos != len(toks):
            raise DumpError(f"{path}:{toks[pos].line}: unexpected '}}'")
        return out

    def _block(self, path: str, toks: list[_Token], pos: int, depth: int) -> tuple[list[Directive], int]:
        out: list[Directive] = []
        while pos < len(toks):
            t = toks[pos]
            if t.text == "}" and not t.quoted:
                return out, pos
            words: list[_Token] = []
            while pos < len(toks) and (toks[pos].quoted or toks[pos].text not in ";{}"):
                words.append(toks[pos])
                pos += 1
            if pos >= len(toks) or not words:
                where = f"{path}:{(words or [t])[0].line}"
                raise DumpError(f"{where}: a directive without its ';' or '{{'")
            d = Directive(words[0].text, [w.text for w in words[1:]], path, words[0].line)
            if toks[pos].text == "{":
                d.children, pos = self._block(path, toks, pos + 1, depth)
                if pos >= len(toks):
                    raise DumpError(f"{d.where()}: '{{' without its '}}'")
                out.append(d)
                pos += 1
            else:
                pos += 1
                if d.name == "include" and d.args:
                    out.extend(self._include(d, depth))
                else:
                    out.append(d)
        return out, pos

    def _include(self, d: Directive, depth: int) -> list[Directive]:
        pattern = d.args[0]
        if not pattern.startswith("/"):
            pattern = f"{self.base}/{pattern}"
        out: list[Directive] = []
        for path in self.dump.files:
            if fnmatch.fnmatchcase(path, pattern):
                out.extend(self.parse_file(path, depth + 1))
        return out


def parse_dump(text: str) -> list[Directive]:
    """The main context of an `nginx -T` output, includes expanded in place."""
    dump = split_dump(text)
    return _Parser(dump).parse_file(dump.main)
