"""The mask set in force, Python side of lua/zccp/fp/mask_store.lua (docs/fingerprint.md §2).

Loads the ONE pattern file, lua/zccp/mask_patterns.lua, with the literal-only reader
(zccp.config.lua_data), resolves a pattern that does not compile through nginx's last-good
file exactly as nginx does, and follows the set nginx names (by digest) in each slot.
zccp.cache.mask_apply holds the set itself (MaskSet) and applies it.

    load_masks(path=None, last_good_path=None) -> MaskSet
    MaskSource(path, last_good).get(digest) -> MaskSet | None
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from zccp.config.lua_data import LuaDataError, load_lua_data
from zccp.cache.mask_apply import MaskError, MaskPattern, MaskSet
from zccp.cache.pcre import Regex
from zccp.config.paths import lua_file

log = logging.getLogger("zccp.cache.mask_store")

__all__ = ["MaskSource", "load_masks", "default_patterns_path", "default_last_good_path"]


def default_patterns_path() -> Path:
    """lua/zccp/mask_patterns.lua of the installed data files (ZCCP_MASK_PATTERNS overrides)."""
    env = os.environ.get("ZCCP_MASK_PATTERNS")
    return Path(env) if env else lua_file("mask_patterns.lua")


def _read_entries(path: Path) -> list[Any]:
    data = load_lua_data(path)
    if not isinstance(data, list):
        raise MaskError(f"{path}: expected `return {{ {{ name = ..., pattern = ..., replacement = ... }}, ... }}`")
    return data


def _prefilter_of(e: dict) -> tuple[bytes, ...]:
    """The entry's `prefilter` list (strings only; anything else is ignored: speed only)."""
    pf = e.get("prefilter")
    return tuple(x for x in pf if isinstance(x, bytes)) if isinstance(pf, list) else ()


def default_last_good_path(path: Path) -> Path:
    return path.with_name(path.stem + ".last_good.lua")


def load_masks(path: str | Path | None = None, last_good_path: str | Path | None = None) -> MaskSet:
    """The mask set nginx's zccp.fp.mask_store has in force for the same files (docs/fingerprint.md):

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

    prev: dict[bytes, dict] = {}
    try:
        if lg.exists():
            for old in _read_entries(lg):
                if (isinstance(old, dict) and isinstance(old.get("name"), bytes)
                        and isinstance(old.get("pattern"), bytes) and isinstance(old.get("replacement"), bytes)
                        and old["name"] not in prev):
                    prev[old["name"]] = old
    except (OSError, LuaDataError, MaskError):
        prev = {}

    try:
        entries = _read_entries(path)
    except (OSError, LuaDataError, MaskError) as exc:
        errors.append((str(path), str(exc)))
        entries = list(prev.values())
        prev = {}

    good: list[MaskPattern] = []
    seen: set[bytes] = set()
    for idx, raw in enumerate(entries, 1):
        e: dict = raw if isinstance(raw, dict) else {}
        name = e.get("name")
        label = name.decode("utf-8", "replace") if isinstance(name, bytes) and name else f"#{idx}"
        if not isinstance(name, bytes) or not name:
            errors.append((label, "entry needs a non-empty string `name`"))
            continue
        if name in seen:
            errors.append((label, "duplicate name"))
            continue
        seen.add(name)
        pat, repl = e.get("pattern"), e.get("replacement")
        try:
            if not isinstance(pat, bytes):
                raise MaskError("`pattern` must be a string")
            if repl is None:
                repl = b""
            if not isinstance(repl, bytes):
                raise MaskError("`replacement` must be a string")
            Regex(pat, repl)
        except MaskError as err:
            errors.append((label, str(err)))
            if name not in prev:
                continue
            e = prev[name]
            pat, repl = e["pattern"], e["replacement"]
            try:
                Regex(pat, repl)
            except MaskError:
                continue
        good.append(MaskPattern(name.decode("utf-8", "surrogateescape"), pat, repl, _prefilter_of(e)))
    return MaskSet.build(good, errors, str(path))


class MaskSource:
    """The mask set nginx has in force, followed by its digest rather than by the file.

    nginx names, in every slot, the digest of the set it applied (request.mask_digest) and
    writes that set to its last-good file on every start and reload. The engine starts from
    the files nginx reads; when a slot names a set it does not hold, it loads the last-good
    file. So nginx and the engine switch together when nginx reloads, whatever the patterns
    file says meanwhile, and the workers of the previous generation, finishing their
    requests during a graceful reload, keep theirs. A digest the engine cannot find gets
    None: that request is served uncached (when in doubt, miss).
    """

    KEEP = 4                  # sets held at once (the current one and the ones before it)
    RETRY_S = 1.0             # an unknown digest is looked for again after this long

    def __init__(self, path: Path | None = None, last_good: Path | None = None) -> None:
        self.path = path or default_patterns_path()
        self.last_good = last_good
        first = self._load(self.path, last_good)
        self._sets: dict[str, MaskSet] = {first.digest: first}
        self._current = first
        self._missing: dict[str, float] = {}

    @staticmethod
    def _load(path: Path, last_good: Path | None) -> MaskSet:
        masks = load_masks(path, last_good)
        for name, err in masks.errors:
            log.error("mask pattern %s not applied: %s", name, err)
        return masks

    def get(self, digest: str | None = None) -> MaskSet | None:
        """The set named by `digest` (hex), or the latest one when nginx named none."""
        if digest is None:
            return self._current
        masks = self._sets.get(digest)
        return masks if masks is not None else self._follow(digest)

    def _follow(self, digest: str) -> MaskSet | None:
        now = time.monotonic()
        if self.last_good is None or now < self._missing.get(digest, 0.0):
            return None
        masks: MaskSet | None = None
        if self.last_good.is_file():
            masks = self._load(self.last_good, self.last_good)
            self._sets[masks.digest] = masks
            self._current = masks
            while len(self._sets) > self.KEEP:
                del self._sets[next(iter(self._sets))]
        if masks is not None and masks.digest == digest:
            log.info("mask set %s now in force: nginx (re)loaded %d pattern(s)", digest[:12], len(masks))
            return masks
        if len(self._missing) > 64:
            self._missing.clear()
        self._missing[digest] = now + self.RETRY_S
        log.warning("nginx applied mask set %s, which %s does not hold: serving its requests uncached",
                    digest[:12], self.last_good)
        return None
