"""model.backend: upstream (issue 19 part 3): the latency ZCCP adds in front of an
OpenAI-compatible upstream, against calling the upstream directly and against LiteLLM's
proxy in front of the same upstream; and repeated prompts answered without the upstream.

The upstream is a ZCCP stack with the null backend (a fixed answer in well under a
millisecond of model time), so what is measured is the hop, not a model. Every request
is a 1 KiB user prompt made unique (no cache can answer it), non-streamed, max_tokens 16,
at concurrency 16, from one asyncio httpx client on the same machine; the targets run in
alternating rounds so that drift of the shared machine hits each alike.

    python -m bench.upstream [--n 400] [--rounds 2]

Writes bench/upstream_c<C>.json (bench/upstream.md holds the tables).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from bench.procs import delta, snapshot
from tests.support.checkout import REPO, require_this_checkout
from tests.support.harness import Stack
from tests.support.leftovers import remove_socket_dirs
from zccp.ops.stack import free_port

UP_MODEL, GW_MODEL = "zccp-up", "zccp-gw"
MASTER_KEY = "sk-" + "5e1f0c2a9b7d4e3f8a6c1b0d2e4f6a8c" * 2   # LiteLLM's proxy will not start without one
FILLER = ("The harbour town kept its ledgers in a stone house by the quay; " * 20)[:1000]


def body(model: str, i: int) -> dict:
    return {"model": model, "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": f"request {i}: {FILLER}"}]}


WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima mike november oscar papa "
         "quebec romeo sierra tango").split()


def repeated(k: int) -> dict:
    """The k-th of 20 prompts told apart by words (the default masks replace numbers)."""
    return {"model": GW_MODEL, "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": f"Tell me about {WORDS[k]}, please."}]}


async def run(url: str, model: str, n: int, c: int, offset: int) -> dict:
    lat: list[float] = []
    errors = 0
    sem = asyncio.Semaphore(c)
    limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
    # every target gets the header (LiteLLM checks it; ZCCP with auth.mode off ignores it)
    async with httpx.AsyncClient(timeout=60, limits=limits, trust_env=False,
                                 headers={"authorization": f"Bearer {MASTER_KEY}"}) as h:
        async def one(i: int) -> None:
            nonlocal errors
            async with sem:
                t = time.perf_counter()
                r = await h.post(url, json=body(model, offset + i))
                dt = time.perf_counter() - t
                if r.status_code == 200 and r.json()["choices"][0]["message"]["content"]:
                    lat.append(dt)
                else:
                    errors += 1
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.perf_counter() - t0
    lat.sort()
    return {"n": n, "errors": errors, "p50_ms": 1000 * statistics.median(lat),
            "p90_ms": 1000 * lat[int(0.9 * len(lat))], "mean_ms": 1000 * statistics.fmean(lat),
            "rps": len(lat) / wall}


def start_litellm(up_url: str, root: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cfg = root / "litellm.yaml"
    cfg.write_text(yaml.safe_dump({"model_list": [{"model_name": GW_MODEL, "litellm_params": {
        "model": f"openai/{UP_MODEL}", "api_base": up_url, "api_key": "unused"}}]}))
    exe = Path(sys.executable).with_name("litellm")
    log = (root / "litellm.log").open("wb")
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_PROXY": "*", "LITELLM_MASTER_KEY": MASTER_KEY}
    proc = subprocess.Popen([str(exe), "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port)],
                            stdout=log, stderr=log, env=env)
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 180
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"litellm exited: {(root / 'litellm.log').read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health/liveliness", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("litellm did not start")


def upstream_requests(up: Stack) -> int:
    return sum(1 for line in up.log("nginx-access.log").splitlines() if "/v1/chat/completions" in line)


def main() -> None:
    require_this_checkout()
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--c", type=int, default=16)
    ap.add_argument("--no-litellm", action="store_true")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="zccp-bench-upstream-"))
    big = {"shared_memory": {"segment_count": 64}, "server": {"workers": 2}}
    up = Stack(root / "up", {"model": {"backend": "null", "name": UP_MODEL}, **big}).start()
    gw_cfg = {**big, "model": {"backend": "upstream", "name": GW_MODEL},
              "upstream": {"urls": [up.base_url + "/v1"], "api": "openai", "model": UP_MODEL}}
    gw = Stack(root / "gw", gw_cfg).start()                       # no cache: every request forwarded
    # the cache in front; exact keys only: the bench's prompts share 1 KiB of text, and a near
    # hit (cache.near_duplicate) would answer distinct ones too, hiding what is counted
    gwc = Stack(root / "gwc", {**gw_cfg, "cache": {"near_duplicate": False}}, with_redis=True).start()
    procs = []
    try:
        targets = {"direct": (up.base_url + "/v1/chat/completions", UP_MODEL),
                   "zccp": (gw.base_url + "/v1/chat/completions", GW_MODEL)}
        # the processes whose CPU serves a target's requests (the upstream's included)
        up_pids = [svc.proc.pid for svc in (up.nginx, up.engine) if svc is not None and svc.proc is not None]
        roots = {"direct": up_pids,
                 "zccp": up_pids + [svc.proc.pid for svc in (gw.nginx, gw.engine)
                                    if svc is not None and svc.proc is not None]}
        if not args.no_litellm:
            proc, lurl = start_litellm(up.base_url + "/v1", root)
            procs.append(proc)
            targets["litellm"] = (lurl + "/v1/chat/completions", GW_MODEL)
            roots["litellm"] = up_pids + [proc.pid]
        for url, model in targets.values():        # warm-up: connections, the first requests
            asyncio.run(run(url, model, 64, args.c, 10_000_000))
        rows: dict[str, list[dict]] = {k: [] for k in targets}
        offset = 0
        for _ in range(args.rounds):
            for name, (url, model) in targets.items():
                before = [snapshot(pid) for pid in roots[name]]
                row = asyncio.run(run(url, model, args.n, args.c, offset))
                cpu = sum(delta(b, snapshot(pid))["cpu_s"] for b, pid in zip(before, roots[name], strict=True))
                row["server_cpu_ms_per_req"] = 1000 * cpu / args.n
                rows[name].append(row)
                offset += args.n
        summary = {}
        for name, rs in rows.items():
            summary[name] = {k: statistics.median(r[k] for r in rs)
                             for k in ("p50_ms", "p90_ms", "mean_ms", "rps", "server_cpu_ms_per_req")}
            summary[name]["errors"] = sum(r["errors"] for r in rs)
        over = {k: summary[k]["p50_ms"] - summary["direct"]["p50_ms"] for k in summary if k != "direct"}
        over_cpu = {k: summary[k]["server_cpu_ms_per_req"] - summary["direct"]["server_cpu_ms_per_req"]
                    for k in summary if k != "direct"}
        # repeated prompts: 20 distinct prompts, each asked 10 times, through the cached gateway
        before = upstream_requests(up)
        with httpx.Client(base_url=gwc.base_url, timeout=60, trust_env=False) as h:
            statuses = [h.post("/v1/chat/completions", json=repeated(i % 20)).status_code for i in range(200)]
        forwarded = upstream_requests(up) - before
        out = {"load": {"n_per_round": args.n, "rounds": args.rounds, "concurrency": args.c, "prompt_bytes": 1024,
                        "max_tokens": 16, "cpus": os.cpu_count()},
               "rows": rows, "summary": summary, "overhead_p50_ms": over, "added_server_cpu_ms_per_req": over_cpu,
               "load_avg_1m_at_end": os.getloadavg()[0],
               "repeated": {"requests": 200, "distinct": 20, "ok": statuses.count(200),
                            "reached_upstream": forwarded}}
        (REPO / "bench" / f"upstream_c{args.c}.json").write_text(json.dumps(out, indent=2) + "\n")
        print(json.dumps(out["summary"], indent=2), json.dumps(over), json.dumps(over_cpu),
              json.dumps(out["repeated"]))
    finally:
        for p in procs:
            p.terminate()
            p.wait(20)
        for s in (gwc, gw, up):
            s.stop()
        remove_socket_dirs()


if __name__ == "__main__":
    main()
