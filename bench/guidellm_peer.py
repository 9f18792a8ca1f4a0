"""guidellm (vLLM's benchmark tool, a third-party client) against ZCCP's hf backend and the
peer (`transformers serve --continuous-batching`) on the medium checkpoint, both orders.

    PYTHONPATH=engine .venv/bin/python -m bench.guidellm_peer --guidellm /tmp/glvenv/bin/guidellm \
        [--seconds 30] [--concs 1,8] [--orders DP,PD] [--append] [--out bench/guidellm_peer]

guidellm 0.8 is not a project dependency: install it in a venv of its own (bench/guidellm.md)
and name its executable. The checkpoint and the servers are bench.first_token's (one torch
thread each; ZCCP with the response cache off, so every request reaches the model; each cell's
prompts new, from a seed of its own, so no prefix KV cache holds them). Each cell is one
`guidellm run` of a scenario written here: `/v1/chat/completions`, synthetic text of
--prompt-tokens prompt tokens, `max_tokens` --output-tokens (the backend's max_tokens: with the
data's output_tokens guidellm adds vLLM's `ignore_eos`, which `transformers serve` refuses with
a 422; so an answer may end at EOS, on both servers alike; guidellm's default sampling),
`concurrent` with c streams, --seconds; the order is D then P for every concurrency, then P
then D. From guidellm's benchmarks JSON: TTFT p50/p99 (its own, request sent -> first
streamed token: for a server that streams the prompt back first this is the echo's, not a
generated token's; bench.first_token times the first generated one), ITL p50, output tokens/s
(the output tokens of the successful requests / the benchmark's duration) and the counts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.first_token import start_zccp
from bench.peer import build, start_peer
from tests.support.hf_checkpoint import HF_MODEL


def scenario(target: str, model: str, ckpt: Path, conc: int, a: argparse.Namespace, seed: int) -> dict:
    """guidellm writes its report (benchmarks.json, .csv) into the directory it runs in. seed: the
    synthetic prompts' (guidellm's default is one fixed seed: every run would send the same
    prompts, which a server's prefix cache then answers without a prefill)."""
    return {"metadata": {"name": "zccp-peer", "description": "ZCCP hf and transformers serve"},
            # max_tokens from the backend, not the data's output_tokens: with those guidellm adds
            # vLLM's ignore_eos, which the peer refuses (422, an unexpected field)
            "spec": {"backend": {"kind": "openai_http", "target": target, "model": model,
                                 "request_format": "/v1/chat/completions", "max_tokens": a.output_tokens},
                     "tokenizer": {"kind": "huggingface_auto", "model": str(ckpt)},
                     "profile": {"kind": "concurrent"},
                     "data": [{"kind": "synthetic_text", "prompt_tokens": a.prompt_tokens}],
                     "seed": {"kind": "static", "value": seed},
                     "constraints": [{"kind": "max_duration", "seconds": a.seconds}]},
            "benchmarks": [{"profile.streams": conc}]}


def summary(report: Path) -> dict[str, Any]:
    b = json.loads(report.read_text())["benchmarks"][0]
    m = b["metrics"]

    def stat(key: str, q: str) -> float | None:
        ok = m[key]["successful"]
        return round(ok["percentiles"][q], 2) if ok["count"] else None

    out = m["output_token_count"]["successful"]
    return {"successful": m["request_totals"]["successful"], "errored": m["request_totals"]["errored"],
            "duration_s": round(b["duration"], 1),
            "prompt_tokens_p50": stat("prompt_token_count", "p50"),
            "output_tokens_p50": stat("output_token_count", "p50"),
            "ttft_p50_ms": stat("time_to_first_token_ms", "p50"), "ttft_p99_ms": stat("time_to_first_token_ms", "p99"),
            "itl_p50_ms": stat("inter_token_latency_ms", "p50"), "itl_p99_ms": stat("inter_token_latency_ms", "p99"),
            "output_tok_s": round(out["total_sum"] / b["duration"], 1) if b["duration"] else None}


def run_cell(exe: str, sc: dict, work: Path, log: Path) -> None:
    path = work / "scenario.json"
    path.write_text(json.dumps(sc))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("PYTHONPATH", None)                    # guidellm's own venv, not this tree's packages
    with log.open("ab") as f:
        done = subprocess.run([exe, "run", "-c", str(path), "--disable-console-interactive"], cwd=work, env=env,
                              stdout=f, stderr=subprocess.STDOUT, timeout=sc["spec"]["constraints"][0]["seconds"] + 300)
    if done.returncode:
        raise RuntimeError(f"guidellm exited {done.returncode}: {log.read_text()[-3000:]}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--guidellm", required=True, help="the guidellm executable (its own venv)")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--concs", default="1,8")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--orders", default="DP,PD")
    ap.add_argument("--out", default=str(Path(__file__).with_suffix("")))
    ap.add_argument("--append", action="store_true", help="add to the rows of --out's JSON")
    a = ap.parse_args(argv)
    rows: list[dict[str, Any]] = json.loads(Path(a.out + ".json").read_text())["rows"] if a.append else []
    with tempfile.TemporaryDirectory(prefix="zccp-gl-") as tmp, contextlib.ExitStack() as stack:
        run = Path(tmp)
        ckpt = build(run / "ckpt")
        d = start_zccp(run / "D", ckpt, None, {})
        stack.callback(d.stop)
        proc, p_url = start_peer(ckpt, 1, run / "serve.log")
        stack.callback(lambda: (proc.terminate(), proc.wait(20)))
        targets = {"D": (d.base_url, HF_MODEL), "P": (p_url, str(ckpt))}
        for url, model in targets.values():         # the peer loads its model on its first request
            for _ in range(2):
                httpx.post(url + "/v1/chat/completions", timeout=300, json={
                    "model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "warm up"}]})
        for order in a.orders.split(","):
            for conc in (int(c) for c in a.concs.split(",")):
                for name in order:
                    work = run / f"{order}-{conc}-{name}"
                    work.mkdir()
                    report = work / "benchmarks.json"
                    load = os.getloadavg()[0]
                    seed = int(time.time() * 1000) % 1_000_000_007        # new prompts every cell
                    run_cell(a.guidellm, scenario(*targets[name], ckpt, conc, a, seed), work, run / "guidellm.log")
                    row = {"variant": name, "order": order, "conc": conc, "loadavg": round(load, 2),
                           "utc": time.strftime("%H:%M:%S", time.gmtime()), **summary(report)}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                    Path(a.out + ".json").write_text(json.dumps({"args": vars(a), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
