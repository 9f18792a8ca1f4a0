"""bench/cache_eval/results.json: written with its per-pair and per-query rows as columns + rows,
read back as lists of dicts."""

from __future__ import annotations

import json
from pathlib import Path


def dump_results(res: dict) -> str:
    """results.json with the per-pair and per-query rows as columns + rows (about a third of the size)."""
    out = dict(res)
    for key, sub in (("pairs", None), ("unrelated", "rows")):
        rows = res.get(key) if sub is None else (res.get(key) or {}).get(sub)
        if not rows:
            continue
        cols = sorted({k for r in rows for k in r})
        table = {"columns": cols, "rows": [[r.get(k) for k in cols] for r in rows]}
        if sub is None:
            out[key] = table
        else:
            out[key] = dict(res[key], **{sub: table})
    text = json.dumps(out, separators=(",", ":"), ensure_ascii=False)
    # one row per line, so that the file diffs and greps well
    return text.replace("],[", "],\n[") + "\n"


def load_results(path: Path) -> dict:
    res = json.loads(path.read_text())

    def rows(t):
        if isinstance(t, dict) and "columns" in t:
            return [{k: v for k, v in zip(t["columns"], r, strict=True) if v is not None or k == "similarity"}
                    for r in t["rows"]]
        return t
    res["pairs"] = rows(res.get("pairs"))
    if res.get("unrelated"):
        res["unrelated"]["rows"] = rows(res["unrelated"]["rows"])
    return res
