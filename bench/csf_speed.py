#!/usr/bin/env python3
"""Fingerprint speed: the CSF and the whole fp.compute() inside one nginx worker, and the
Python compute() the engine runs for bodies above DECODE_LIMIT (docs/fingerprint.md §8).

    cd /work/main && PYTHONPATH=engine python bench/csf_speed.py [-n 1000] [--only csf|compute|python]

Starts a throw-away nginx with the test-only locations of tests/nginx/fp_test.conf plus one
bench-only location (written to a temporary snippet here; fp_test.conf is not changed) and:

* csf: POSTs 1024-token texts to /_fp/bench, which times (os.clock, CPU time of the worker)
  n runs of fp.csf + band keys, and n runs of fp.compute() on an Anthropic request carrying
  the text. One JSON line per text.
* compute: POSTs whole Anthropic bodies of 1 KiB, 16 KiB and 64 KiB (one user message of
  English prose; the 64 KiB one just under DECODE_LIMIT) to /_fp/bench_body, which times n
  runs of fp.compute() on that body, plus the stages (cjson decode, masks.apply of the
  text, the CSF of the prompt) for orientation. Medians in microseconds.
* python: medians of the Python compute() for 64 KiB and 512 KiB bodies of the same kind.

The machine is shared and noisy: every figure is a median of many runs (p10/p90 shown).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "engine"))
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "tests"))

import test_fingerprint_identity as TFI  # noqa: E402
from test_fingerprint_identity import WORDS, FpNginx  # noqa: E402

from zccp.cache import fingerprint as F  # noqa: E402
from zccp.cache.masks import load_masks  # noqa: E402

BENCH_LOCATION = r"""
# BENCH-ONLY (bench/csf_speed.py): POST a whole request body, ?n=1000&api=anthropic ->
# JSON { compute_us = {p10, median, p90}, decode_us, mask_us, csf_us, tokens }
location = /_fp/bench_body {
    content_by_lua_block {
        local fp = require "zccp.fingerprint"
        local masks = require "zccp.masks"
        local csf = require "zccp.fp.csf"
        local cjson = require "cjson"
        ngx.req.read_body()
        local body = ngx.req.get_body_data() or ""
        local n = tonumber(ngx.var.arg_n) or 1000
        local api = ngx.var.arg_api or "anthropic"
        local clock = os.clock
        local function run(f)
            for _ = 1, 20 do f() end
            local ts = {}
            for i = 1, n do
                local c0 = clock()
                f()
                ts[i] = (clock() - c0) * 1e6
            end
            table.sort(ts)
            return { p10 = ts[math.floor(n * 0.1) + 1], median = ts[math.floor(n / 2) + 1],
                     p90 = ts[math.floor(n * 0.9) + 1] }
        end
        local r = assert(fp.compute(api, body, true))
        local doc = cjson.decode(body)
        local text = doc.messages[1].content
        ngx.print(cjson.encode({
            compute_us = run(function() assert(fp.compute(api, body)) end),
            decode_us = run(function() cjson.decode(body) end),
            mask_us = run(function() masks.apply(text) end),
            csf_us = run(function() local s = csf.of_text(r.prompt); csf.keys_of(s) end),
            tokens = r.tokens, body_bytes = #body,
        }))
    }
}
"""


def texts() -> dict[str, str]:
    r = random.Random(1)
    english = " ".join(r.choice(WORDS) for _ in range(1100))
    vocab = [f"{r.choice(WORDS)}{r.randint(0, 999)}" for _ in range(5000)]
    distinct = " ".join(r.choice(vocab) for _ in range(1100))
    cjk = "".join(chr(r.randint(0x4E00, 0x9FFF)) for _ in range(1100))
    mixed = " ".join(r.choice([r.choice(WORDS), chr(r.randint(0x4E00, 0x9FFF)), "naïve", "😀", "Привет"])
                     for _ in range(1100))
    return {"english_1024": english, "distinct_words_1024": distinct, "cjk_1024": cjk, "mixed_1024": mixed,
            "short_20": " ".join(r.choice(WORDS) for _ in range(20))}


def prose(r: random.Random, nbytes: int) -> str:
    """English-like prose: capitalised sentences, punctuation, paragraphs, a few numbers."""
    out: list[str] = []
    size = 0
    while size < nbytes:
        words = [r.choice(WORDS) for _ in range(r.randint(6, 20))]
        words[0] = words[0].capitalize()
        if r.random() < 0.15:
            words.insert(r.randrange(len(words)), str(r.randint(1, 2024)))
        s = " ".join(words) + r.choice([".", ".", ".", "?", "!", ":", ";"])
        s += "\n\n" if r.random() < 0.1 else " "
        out.append(s)
        size += len(s)
    return "".join(out)


def anthropic_body(nbytes: int, seed: int = 2) -> bytes:
    """An Anthropic request of (just under) nbytes: one user message of prose."""
    r = random.Random(seed)
    text = prose(r, nbytes)
    req = {"model": "claude-x", "max_tokens": 1024, "messages": [{"role": "user", "content": text}]}
    while True:
        body = json.dumps(req).encode()
        if len(body) <= nbytes:
            return body
        text = text[: len(text) - (len(body) - nbytes) - 1]
        req["messages"][0]["content"] = text


def py_median_ms(body: bytes, masks, reps: int) -> dict:
    ts = []
    for _ in range(3):
        F.compute("anthropic", body, masks)
    for _ in range(reps):
        t0 = time.process_time()
        F.compute("anthropic", body, masks)
        ts.append((time.process_time() - t0) * 1000)
    ts.sort()
    return {"p10": round(ts[len(ts) // 10], 3), "median": round(statistics.median(ts), 3),
            "p90": round(ts[len(ts) * 9 // 10], 3)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=1000)
    ap.add_argument("--py-reps", type=int, default=60)
    ap.add_argument("--only", choices=["csf", "compute", "python"])
    args = ap.parse_args()
    masks = load_masks()
    want = {args.only} if args.only else {"csf", "compute", "python"}
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        snippet = root / "fp_bench.conf"
        snippet.write_text((REPO / "tests" / "nginx" / "fp_test.conf").read_text() + BENCH_LOCATION)
        TFI.SNIPPET = snippet  # FpNginx includes TFI.SNIPPET
        srv = FpNginx(root, REPO / "lua" / "zccp" / "mask_patterns.lua", root / "last_good.lua")
        if want & {"csf", "compute"}:
            srv.start()
        try:
            if "csf" in want:
                for name, text in texts().items():
                    res = json.loads(srv.post(f"/_fp/bench?n={args.n}", text.encode()))
                    body = json.dumps({"model": "m", "max_tokens": 16,
                                       "messages": [{"role": "user", "content": text}]}).encode()
                    res["python_compute_ms"] = py_median_ms(body, masks, 20)["median"]
                    res = {"text": name, **{k: round(v, 4) if isinstance(v, float) else v for k, v in res.items()}}
                    print(json.dumps(res), flush=True)
            if "compute" in want:
                for label, size in (("1KiB", 1024), ("16KiB", 16384), ("64KiB", F.DECODE_LIMIT)):
                    body = anthropic_body(size)
                    res = json.loads(srv.post(f"/_fp/bench_body?n={args.n}", body))
                    res = {"lua_compute": label, **res}
                    print(json.dumps(res, default=lambda v: round(v, 1)), flush=True)
            if "python" in want:
                for label, size in (("64KiB", F.DECODE_LIMIT), ("512KiB", 512 * 1024)):
                    body = anthropic_body(size)
                    print(json.dumps({"python_compute": label, "body_bytes": len(body),
                                      "ms": py_median_ms(body, masks, args.py_reps)}), flush=True)
        finally:
            if want & {"csf", "compute"}:
                srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
