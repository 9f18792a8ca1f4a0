"""`zccp-masks test PATTERN_FILE --text ... | --json BODY`: what each mask pattern changes.

Runs the patterns as nginx does (zccp.cache.pcre: the same PCRE library, byte mode,
ngx.re.gsub's replacement templates), in order, each on the result of the one before,
on the sample texts, or on the strings of a request body that nginx masks (the
`system` and the messages' text members, zccp.cache.mask_apply). Prints every change, and
warns about a pattern that matched nothing in the samples: a typo that compiles masks
nothing, silently, once live.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zccp.cache.mask_apply import _DocMasker, _mask
from zccp.cache.mask_store import _read_entries
from zccp.cache.pcre import MaskError, Regex
from zccp.config.lua_data import LuaDataError


@dataclass
class PatternResult:
    name: str
    error: str | None = None
    changes: list[tuple[str, str]] = field(default_factory=list)   # (matched text, what replaced it)


class _Collect(_DocMasker):
    """The strings of a request nginx's masks apply to, unchanged."""

    def __init__(self) -> None:
        super().__init__(masks=None, in_place=False)   # type: ignore[arg-type]
        self.seen: list[bytes] = []

    def text(self, s: str | bytes) -> str | bytes:
        self.seen.append(s if isinstance(s, bytes) else s.encode("utf-8", "surrogateescape"))
        return s


def masked_strings(body: dict) -> list[bytes]:
    c = _Collect()
    _mask(c, body)
    return c.seen


def _s(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def run(entries: list[Any], samples: list[bytes]) -> tuple[list[PatternResult], list[bytes]]:
    """Each entry applied in order to every sample; returns the per-pattern results and the
    samples as the whole set leaves them."""
    results = []
    texts = list(samples)
    for idx, e in enumerate(entries, 1):
        e = e if isinstance(e, dict) else {}
        name = e.get("name")
        res = PatternResult(_s(name) if isinstance(name, bytes) and name else f"#{idx}")
        results.append(res)
        pat, repl = e.get("pattern"), e.get("replacement", b"")
        if not isinstance(pat, bytes) or not isinstance(repl, bytes):
            res.error = "`pattern` and `replacement` must be strings"
            continue
        try:
            rx = Regex(pat, repl)
            for i, t in enumerate(texts):
                found: list[bytes] = []
                out, n = rx.gsub(t, found)
                if n:
                    # what each match became: the match run through the pattern alone
                    res.changes += [(_s(m), _s(rx.gsub(m)[0])) for m in found]
                    texts[i] = out
        except MaskError as exc:
            res.error = str(exc)
    return results, texts


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="zccp-masks", description="Test mask patterns before they are live.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("test", help="apply PATTERN_FILE to samples: what each pattern changes")
    t.add_argument("pattern_file", help="a mask_patterns.lua (cache.mask_patterns)")
    t.add_argument("--text", action="append", default=[], help="a sample text (repeatable)")
    t.add_argument("--json", action="append", default=[], metavar="BODY",
                   help="a request body (JSON, or @FILE): its strings nginx masks (repeatable)")
    args = p.parse_args(argv)
    samples = [x.encode("utf-8", "surrogateescape") for x in args.text]
    for body in args.json:
        try:
            doc = json.loads(Path(body[1:]).read_text() if body.startswith("@") else body)
        except (OSError, ValueError) as exc:
            p.error(f"--json {body[:40]!r}: {exc}")
        if not isinstance(doc, dict):
            p.error("--json: a request body is a JSON object")
        samples += masked_strings(doc)
    if not samples:
        p.error("give at least one --text or --json sample")
    try:
        entries = _read_entries(Path(args.pattern_file))
    except (OSError, LuaDataError, MaskError) as exc:
        print(f"zccp-masks: {args.pattern_file}: {exc}", file=sys.stderr)
        sys.exit(1)
    results, texts = run(entries, samples)
    bad = 0
    for r in results:
        if r.error:
            bad += 1
            print(f"{r.name}: REFUSED: {r.error}")
        elif not r.changes:
            print(f"{r.name}: WARNING: matched nothing in the samples")
        for before, after in r.changes:
            print(f"{r.name}: {before!r} -> {after!r}")
    for sample, masked in zip(samples, texts, strict=True):
        if sample != masked:
            print(f"masked: {_s(masked)!r}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
