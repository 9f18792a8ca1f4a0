#!/usr/bin/env python3
"""Fingerprint speed, this checkout against a baseline commit in the same run
(docs/fingerprint.md §8): nginx's fp.compute() and its stages inside one nginx worker,
and the Python compute() the engine runs for bodies above DECODE_LIMIT.

    .venv/bin/python -m bench.csf_speed [-n 1000] [--baseline main] [--out bench]

The baseline's lua/, nginx/, shm_abi/, engine/ and test nginx snippet (tests/support/nginx/,
tests/nginx/ before it moved) are taken with
`git archive <ref>` into a temporary tree. Two throw-away nginx (Debian nginx +
libnginx-mod-http-lua), one per tree, run side by side; every body is timed on both, one
after the other, so that the shared machine's noise falls on both alike:

* /_fp/bench (fp_test.conf): the CSF (tokenize, shingles, MinHash, band keys) of a text of
  1024 tokens, n times, CPU time of the worker (os.clock): the median.
* /_fp/bench_body (defined here): fp.compute() of a whole request body n times, and its
  stages: cjson decode; decode + mask_apply.apply_doc; the CSF of the text the fingerprint
  read (r.prompt). Medians in microseconds. Bodies: one user message of English prose of
  1, 16 and 64 KiB; a 64 KiB multi-turn chat ending on a short question; a 64 KiB agent
  loop ending on a tool result.
* Python: compute() of 64 KiB and 512 KiB prose bodies (time.process_time, medians), in a
  subprocess per tree (PYTHONPATH=<tree>/engine).

Writes <out>/csf_speed.json and <out>/csf_speed.md (the table) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.fp_nginx import REPO, WORDS, FpNginx

# where a tree keeps fp_test.conf: this checkout's place first, then older commits'
SNIPPET_DIRS = ("tests/support/nginx", "tests/nginx")

DECODE_LIMIT = 65536
BENCH_LOCATION = r"""
# BENCH-ONLY (bench/csf_speed.py): POST a whole request body, ?n=1000&api=anthropic ->
# JSON { compute_us, decode_us, decode_mask_us, csf_us = {p10, median, p90}, tokens, body_bytes }
location = /_fp/bench_body {
    content_by_lua_block {
        local fp = require "zccp.fp.fingerprint"
        local mask_apply = require "zccp.fp.mask_apply"
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
        local out = {
            compute_us = run(function() assert(fp.compute(api, body)) end),
            decode_us = run(function() cjson.decode(body) end),
            decode_mask_us = run(function() mask_apply.apply_doc(cjson.decode(body)) end),
            tokens = r.tokens, body_bytes = #body,
        }
        if r.prompt then
            out.csf_us = run(function() local s = csf.of_text(r.prompt); csf.keys_of(s) end)
        end
        ngx.print(cjson.encode(out))
    }
}
"""

PY_BENCH = r"""
import json, sys, time, statistics
from zccp.cache.fingerprint import compute
from zccp.cache.mask_store import load_masks
masks = load_masks()
out = {}
for label, path in json.loads(sys.argv[1]).items():
    body = open(path, "rb").read()
    for _ in range(3):
        compute("anthropic", body, masks)
    ts = []
    for _ in range(int(sys.argv[2])):
        t0 = time.process_time()
        compute("anthropic", body, masks)
        ts.append((time.process_time() - t0) * 1000)
    ts.sort()
    out[label] = {"p10": ts[len(ts) // 10], "median": statistics.median(ts), "p90": ts[len(ts) * 9 // 10]}
print(json.dumps(out))
"""


# --------------------------------------------------------------------------- inputs

def texts() -> dict[str, str]:
    r = random.Random(1)
    english = " ".join(r.choice(WORDS) for _ in range(1100))
    vocab = [f"{r.choice(WORDS)}{r.randint(0, 999)}" for _ in range(5000)]
    distinct = " ".join(r.choice(vocab) for _ in range(1100))
    cjk = "".join(chr(r.randint(0x4E00, 0x9FFF)) for _ in range(1100))
    return {"english_1024": english, "distinct_words_1024": distinct, "cjk_1024": cjk,
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


def fit(req: dict, nbytes: int, shrink) -> bytes:
    """The request's JSON, trimmed by shrink(req, excess) until it is at most nbytes."""
    while True:
        body = json.dumps(req).encode()
        if len(body) <= nbytes:
            return body
        shrink(req, len(body) - nbytes)


def prose_body(nbytes: int, seed: int = 2) -> bytes:
    req = {"model": "claude-x", "max_tokens": 1024,
           "messages": [{"role": "user", "content": prose(random.Random(seed), nbytes)}]}

    def shrink(q, excess):
        q["messages"][0]["content"] = q["messages"][0]["content"][:-(excess + 1)]
    return fit(req, nbytes, shrink)


def chat_body(nbytes: int) -> bytes:
    """A long conversation ending on a short user question (near-able)."""
    r = random.Random(3)
    msgs = []
    while sum(len(m["content"]) for m in msgs) < nbytes:
        msgs.append({"role": "user" if len(msgs) % 2 == 0 else "assistant", "content": prose(r, 1500)})
    msgs.append({"role": "user" if len(msgs) % 2 == 0 else "assistant", "content": "ok"})
    if msgs[-1]["role"] == "assistant":
        msgs.append({"role": "user", "content": "x"})
    msgs[-1]["content"] = "And how would you summarise all of that for a new colleague in three sentences?"
    req = {"model": "claude-x", "max_tokens": 1024, "system": "You are a helpful assistant.", "messages": msgs}

    def shrink(q, excess):
        q["messages"].pop(0)
        q["messages"].pop(0)
    return fit(req, nbytes, shrink)


def agent_body(nbytes: int) -> bytes:
    """An agent loop: tool_use / tool_result rounds, ending on a tool result (exact-only)."""
    r = random.Random(4)
    msgs: list = [{"role": "user", "content": "Fix the failing tests in this repository."}]
    i = 0
    while len(json.dumps(msgs)) < nbytes:
        msgs.append({"role": "assistant", "content": [
            {"type": "text", "text": "Reading the next file."},
            {"type": "tool_use", "id": f"toolu_{i}", "name": "read_file", "input": {"path": f"src/mod{i}.py"}}]})
        code = "\n".join(f"def f{j}(x):\n    return x * {r.randint(1, 99)}  # {prose(r, 40).strip()}"
                         for j in range(20))
        msgs.append({"role": "user",
                     "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": code}]})
        i += 1
    req = {"model": "claude-x", "max_tokens": 1024, "tools": [
        {"name": "read_file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}],
        "messages": msgs}

    def shrink(q, excess):
        del q["messages"][1:3]
    return fit(req, nbytes, shrink)


def bodies() -> dict[str, bytes]:
    return {"prose 1 KiB": prose_body(1024), "prose 16 KiB": prose_body(16384),
            "prose 64 KiB": prose_body(DECODE_LIMIT), "chat 64 KiB": chat_body(DECODE_LIMIT),
            "agent 64 KiB": agent_body(DECODE_LIMIT)}


# --------------------------------------------------------------------------- trees

def baseline_tree(ref: str, into: Path) -> Path:
    """lua/, nginx/, shm_abi/, engine/ and the test nginx snippet's folder of `ref`, from git."""
    listed = subprocess.run(["git", "ls-tree", "--name-only", ref, *SNIPPET_DIRS], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout.split()
    archive = subprocess.run(["git", "archive", ref, "lua", "nginx", "shm_abi", "engine", listed[0]], cwd=REPO,
                             capture_output=True, check=True).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def start_nginx(tree: Path, work: Path) -> FpNginx:
    work.mkdir(parents=True, exist_ok=True)
    snippet = work / "fp_bench.conf"
    conf = next(tree / d / "fp_test.conf" for d in SNIPPET_DIRS if (tree / d / "fp_test.conf").exists())
    snippet.write_text(conf.read_text() + BENCH_LOCATION)
    srv = FpNginx(work, tree / "lua" / "zccp" / "mask_patterns.lua", work / "last_good.lua", lua_root=tree,
                  snippet=snippet)
    srv.start()
    return srv


def python_compute(tree: Path, files: dict[str, str], reps: int) -> dict:
    out = subprocess.run([sys.executable, "-c", PY_BENCH, json.dumps(files), str(reps)], capture_output=True,
                         text=True, env={"PYTHONPATH": str(tree / "engine"), "PATH": "/usr/bin:/bin"})
    if out.returncode != 0:
        raise RuntimeError(f"python compute in {tree} failed:\n{out.stderr}")
    return json.loads(out.stdout)


# --------------------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=1000)
    ap.add_argument("--py-reps", type=int, default=60)
    ap.add_argument("--baseline", default="main", help="git ref to compare with (default main)")
    ap.add_argument("--out", type=Path, default=REPO / "bench")
    args = ap.parse_args()
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True,
                          text=True).stdout.strip()
    base = subprocess.run(["git", "rev-parse", "--short=12", args.baseline], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.strip()
    res: dict = {"run": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "n": args.n,
                 "trees": {"before": f"{args.baseline} ({base})", "after": f"HEAD ({head}, with the working tree)"},
                 "csf": {}, "compute": {}, "python": {}}
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        trees = {"before": baseline_tree(args.baseline, root / "before"), "after": REPO}
        servers = {k: start_nginx(t, root / f"ngx_{k}") for k, t in trees.items()}
        try:
            for name, text in texts().items():
                for k, srv in servers.items():
                    r = json.loads(srv.post(f"/_fp/bench?n={args.n}", text.encode()))
                    res["csf"].setdefault(name, {})[k] = {"csf_ms": r["median_ms"], "tokens": r["tokens"]}
                print(name, res["csf"][name], flush=True)
            for name, body in bodies().items():
                for k, srv in servers.items():
                    res["compute"].setdefault(name, {})[k] = json.loads(srv.post(f"/_fp/bench_body?n={args.n}", body))
                print(name, {k: v["compute_us"]["median"] for k, v in res["compute"][name].items()}, flush=True)
        finally:
            for srv in servers.values():
                srv.stop()
        files = {}
        for label, size in (("64 KiB", DECODE_LIMIT), ("512 KiB", 512 * 1024)):
            f = root / f"py_{size}.json"
            f.write_bytes(prose_body(size))
            files[label] = str(f)
        for k, t in trees.items():
            for label, v in python_compute(t, files, args.py_reps).items():
                res["python"].setdefault(label, {})[k] = v
        print("python", res["python"], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "csf_speed.json").write_text(json.dumps(res, indent=1) + "\n")
    md = table(res)
    (args.out / "csf_speed.md").write_text(md)
    print(md)
    return 0


def table(res: dict) -> str:
    L = [f"# Fingerprint speed: before / after (`bench/csf_speed.py`, {res['run']})", "",
         f"Before: {res['trees']['before']}; after: {res['trees']['after']}. Medians of {res['n']} runs in one nginx "
         "worker (CPU time, `os.clock`), both trees side by side in the same run; Python: medians of "
         "`time.process_time` in a subprocess per tree. The machine is shared: expect ±10-25 %.", "",
         "| input | before | after | after / before |", "|---|---|---|---|"]

    def row(label: str, b: float, a: float, unit: str) -> None:
        L.append(f"| {label} | {b:.0f} {unit} | {a:.0f} {unit} | {a / b:.2f} |" if unit == "µs" else
                 f"| {label} | {b:.2f} {unit} | {a:.2f} {unit} | {a / b:.2f} |")

    for name, v in res["csf"].items():
        row(f"CSF of `{name}` ({v['after']['tokens']} tokens)", v["before"]["csf_ms"] * 1000,
            v["after"]["csf_ms"] * 1000, "µs")
    for name, v in res["compute"].items():
        b, a = v["before"], v["after"]
        row(f"nginx `compute()`, {name}", b["compute_us"]["median"], a["compute_us"]["median"], "µs")
    for name, v in res["python"].items():
        row(f"Python `compute()`, prose {name}", v["before"]["median"], v["after"]["median"], "ms")
    L += ["", "Stages of the nginx `compute()` (after; medians, µs): decode = `cjson.decode`; masks = "
          "decode + `mask_apply.apply_doc` − decode; CSF = the CSF of the text the fingerprint read (v2: the final "
          "user turn, when text); rest = compute − decode − masks − CSF (canonical form, SHA-256 of the prefix "
          "and exact keys, the final turn's text).", "",
          "| body | compute | decode | masks | CSF | rest | tokens (near only) |", "|---|---|---|---|---|---|---|"]
    for name, v in res["compute"].items():
        a = v["after"]
        c, dec, dm = a["compute_us"]["median"], a["decode_us"]["median"], a["decode_mask_us"]["median"]
        csf = a.get("csf_us", {}).get("median", 0.0)
        L.append(f"| {name} ({a['body_bytes']} B) | {c:.0f} | {dec:.0f} | {dm - dec:.0f} | {csf:.0f} | "
                 f"{c - dm - csf:.0f} | {a['tokens']} |")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    sys.exit(main())
