#!/usr/bin/env python3
"""The front tier's cost and spread (docs/scale-out.md, "The front tier"; issue 19 part 4).

    PYTHONPATH=engine .venv/bin/python -m bench.front_tier [-n 40] [--seconds 5] [--out bench]

1. Routing decision, CPU per request, inside one nginx worker (os.clock, batches of 100
   calls, median of 40 batches): zccp.front.tier.key_of (the fingerprint's keys of the body:
   decode, mask, canonical form, SHA-256) and zccp.front.tier.first_pick (rendezvous over the
   hosts, skipping those marked down in the shared dict), for request bodies of 0.5 to
   64 KiB and 2 to 64 hosts. The same nginx + Lua the front runs (Debian nginx + lua module).
2. Spread: 1,000 distinct conversations (Anthropic bodies, a first turn each: their own
   system prompt and question), keys computed in nginx exactly as the front does, ranked over
   2, 3 and 4 hosts named like Pod IPs; and how many keys move when a fourth host joins and
   when one of four leaves.
3. The front as a whole, CPU per proxied request: the rendered front (zccp-nginx render
   --front, 1 worker, DNS from tests/support/dns_server.py) in front of two stub hosts (one
   nginx answering 200 on 127.0.0.2 and 127.0.0.3), wrk -c8 for --seconds on a 1 KiB chat
   body; against the same nginx.conf without the Lua routing (a plain two-server upstream,
   round robin, same keepalive). 16 conversations (OpenAI bodies of about 1 KiB: a system
   prompt and a question), each wrk connection cycling through them. The front's worker
   CPU (utime+stime from /proc) / requests; by_host counts the access log (warm-up included).

Writes <out>/front_tier.json and prints the tables for bench/front_tier.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

from bench.procs import delta, machine_busy_s, snapshot
from tests.support.checkout import REPO
from tests.support.dns_server import DnsServer
from tests.support.fp_nginx import MODULES, NGINX, WORDS, _free_port
from zccp.ops.front_conf import load_front, render_front
from zccp.config.paths import lua_vendor_dir

HOST_COUNTS = (2, 3, 4)

BENCH_CONF = r"""
{user}worker_processes 1;
pid {p}/nginx.pid;
error_log {p}/logs/error.log warn;
load_module {m0};
load_module {m1};
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {p}/tmp;
    client_max_body_size 16m;
    client_body_buffer_size 16m;
    lua_package_path "{lua}/?.lua;{vendor}/?.lua;;";
    lua_shared_dict zccp_front 1m;
    init_by_lua_block {{
        require("zccp.front.tier").init({{ name = "x", port = 8080, resolver = "127.0.0.1", resolver_port = 53,
            interval_s = 5, timeout_ms = 100, tries = 3, down_s = 10, max_body = 1, dict = "zccp_front" }})
    }}
    server {{
        listen 127.0.0.1:{port};
        # ?n=batches&hosts=H: CPU microseconds per call (median of batches of 100) of key_of,
        # first_pick and both, for the body POSTed
        location = /bench/decide {{
            content_by_lua_block {{
                local front = require "zccp.front.tier"
                local rendezvous = require "zccp.lib.rendezvous"
                local cjson = require "cjson"
                ngx.req.read_body()
                local body = ngx.req.get_body_data()
                local nb, h = tonumber(ngx.var.arg_n), tonumber(ngx.var.arg_hosts)
                local addrs = {{}}
                for i = 1, h do addrs[i] = "10.244." .. i .. ".17" end
                local ring = rendezvous.new(addrs)
                local clock = os.clock
                local function run(f)
                    for _ = 1, 200 do f() end
                    local ts = {{}}
                    for b = 1, nb do
                        local c0 = clock()
                        for _ = 1, 100 do f() end
                        ts[b] = (clock() - c0) * 1e4   -- microseconds per call
                    end
                    table.sort(ts)
                    return ts[math.floor(nb / 2) + 1]
                end
                local key, how = front.key_of("/v1/messages", body)
                local mask_apply = require "zccp.fp.mask_apply"
                local dec = cjson.new()
                ngx.print(cjson.encode({{
                    how = how,
                    decode_us = run(function() dec.decode(body) end),
                    decode_mask_us = run(function() mask_apply.apply_doc(dec.decode(body)) end),
                    key_us = run(function() front.key_of("/v1/messages", body) end),
                    pick_us = run(function() front.first_pick(ring, addrs, key) end),
                    both_us = run(function() front.first_pick(ring, addrs, front.key_of("/v1/messages", body)) end),
                }}))
            }}
        }}
        # records "<len>\n<body>": the host index each body's key picks among the first H of
        # the addresses, for H = 2, 3, 4 -> JSON {{ "2": [..], "3": [..], "4": [..], how = {{..}} }}
        location = /bench/spread {{
            content_by_lua_block {{
                local front = require "zccp.front.tier"
                local rendezvous = require "zccp.lib.rendezvous"
                local cjson = require "cjson"
                ngx.req.read_body()
                local data = ngx.req.get_body_data()
                local addrs = {{ "10.244.1.17", "10.244.2.9", "10.244.3.41", "10.244.4.5" }}
                local rings = {{}}
                for h = 2, 4 do
                    local names = {{}}
                    for i = 1, h do names[i] = addrs[i] end
                    rings[h] = rendezvous.new(names)
                end
                local out, how, pos = {{ ["2"] = {{}}, ["3"] = {{}}, ["4"] = {{}}, drop = {{}} }}, {{}}, 1
                -- "drop": four hosts, the second gone (its keys must move, the others stay)
                local without = rendezvous.new({{ addrs[1], addrs[3], addrs[4] }})
                local back = {{ 1, 3, 4 }}
                while pos <= #data do
                    local nl = data:find("\n", pos, true)
                    local len = tonumber(data:sub(pos, nl - 1))
                    local body = data:sub(nl + 1, nl + len)
                    pos = nl + 1 + len
                    local key, h = front.key_of("/v1/messages", body)
                    how[h] = (how[h] or 0) + 1
                    for n = 2, 4 do
                        local t = out[tostring(n)]
                        t[#t + 1] = rings[n]:pick(key)
                    end
                    out.drop[#out.drop + 1] = back[without:pick(key)]
                end
                out.how = how
                ngx.print(cjson.encode(out))
            }}
        }}
    }}
}}
"""

STUB_HOSTS = r"""
worker_processes 1;
pid {p}/stub.pid;
error_log {p}/logs/stub-error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    keepalive_requests 100000;
    client_body_temp_path {p}/tmp;
    server {{
        listen 127.0.0.2:{port};
        listen 127.0.0.3:{port};
        location / {{
            client_body_buffer_size 64k;
            default_type application/json;
            return 200 '{{"id":"chatcmpl-stub","object":"chat.completion","choices":[]}}';
        }}
    }}
}}
"""


def prose(r: random.Random, nbytes: int) -> str:
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < nbytes:
        words.append(r.choice(WORDS))
    return " ".join(words)[:nbytes]


def chat_body(nbytes: int, seed: int = 1) -> bytes:
    """An Anthropic conversation of about nbytes: system prompt, alternating turns, a question."""
    r = random.Random(seed)
    msgs: list[dict] = []
    while len(json.dumps(msgs)) < nbytes - 400:
        msgs.append({"role": "user" if len(msgs) % 2 == 0 else "assistant",
                     "content": prose(r, min(2000, max(100, nbytes // 6)))})
    if not msgs or msgs[-1]["role"] == "user":
        msgs.append({"role": "assistant", "content": "Sure."})
    msgs.append({"role": "user", "content": "And what follows from that?"})
    body = {"model": "claude-x", "max_tokens": 256, "system": "You are a careful assistant.", "messages": msgs}
    return json.dumps(body).encode()


def conversations(n: int) -> list[bytes]:
    r = random.Random(7)
    out = []
    for _ in range(n):
        out.append(json.dumps({"model": "claude-x", "max_tokens": 256,
                               "system": f"You are assistant {r.randint(0, 10**9)}. {prose(r, 200)}",
                               "messages": [{"role": "user", "content": prose(r, r.randint(80, 600))}]}).encode())
    return out


def start_nginx(conf: Path, prefix: Path) -> subprocess.Popen:
    log = open(prefix / "logs" / "stdout.log", "ab")
    p = subprocess.Popen([NGINX, "-e", "stderr", "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"],
                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    return p


def stop_nginx(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGQUIT)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)


def wait_http(url: str, timeout: float = 15) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} not up")


def post(url: str, data: bytes) -> dict:
    req = urllib.request.Request(url, data=data, method="POST")
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


# --------------------------------------------------------------------------- 1 and 2

def decision_and_spread(tmp: Path, batches: int) -> tuple[list[dict], dict]:
    prefix = tmp / "bench-nginx"
    for d in ("logs", "tmp"):
        (prefix / d).mkdir(parents=True, exist_ok=True)
    port = _free_port()
    conf = prefix / "nginx.conf"
    conf.write_text(BENCH_CONF.format(user="user root;\n" if os.geteuid() == 0 else "", p=prefix, m0=MODULES[0],
                                      m1=MODULES[1], lua=REPO / "lua", vendor=lua_vendor_dir(), port=port))
    proc = start_nginx(conf, prefix)
    try:
        time.sleep(0.5)
        base = f"http://127.0.0.1:{port}"
        decide = []
        for size in (512, 2048, 8192, 32768, 65000):
            body = chat_body(size)
            for hosts in ((2, 4, 16, 64) if size == 2048 else (4,)):
                r = post(f"{base}/bench/decide?n={batches}&hosts={hosts}", body)
                decide.append({"body_bytes": len(body), "hosts": hosts, **r})
        convs = conversations(1000)
        data = b"".join(str(len(b)).encode() + b"\n" + b for b in convs)
        picks = post(f"{base}/bench/spread", data)
    finally:
        stop_nginx(proc)
    spread: dict = {"how": picks["how"]}
    for n in HOST_COUNTS:
        counts = [picks[str(n)].count(i) for i in range(1, n + 1)]
        spread[str(n)] = {"counts": counts, "max_over_ideal": max(counts) / (1000 / n),
                          "min_over_ideal": min(counts) / (1000 / n)}
    moved_add = sum(1 for a, b in zip(picks["3"], picks["4"], strict=True) if a != b)
    to_new = sum(1 for a, b in zip(picks["3"], picks["4"], strict=True) if a != b and b == 4)
    moved_drop = sum(1 for a, b in zip(picks["4"], picks["drop"], strict=True) if a != b)
    had_2 = picks["4"].count(2)
    spread["join"] = {"moved": moved_add, "moved_to_new_host": to_new}
    spread["leave"] = {"moved": moved_drop, "keys_of_leaving_host": had_2}
    return decide, spread


# --------------------------------------------------------------------------- 3

def front_cpu(tmp: Path, seconds: float) -> dict:
    port = _free_port()
    stub_dir = tmp / "stub"
    for d in ("logs", "tmp"):
        (stub_dir / d).mkdir(parents=True, exist_ok=True)
    (stub_dir / "nginx.conf").write_text(STUB_HOSTS.format(p=stub_dir, port=port))
    stub = start_nginx(stub_dir / "nginx.conf", stub_dir)
    dns = DnsServer("zccp-hosts.bench.svc.cluster.local", ["127.0.0.2", "127.0.0.3"]).start()
    r = random.Random(3)
    lines = [json.dumps({"model": "zccp-tiny", "max_tokens": 64, "messages": [
        {"role": "system", "content": f"You are careful assistant {i}. " + prose(r, 600)},
        {"role": "user", "content": prose(r, 300)}]}) for i in range(16)]
    bodies = tmp / "bodies.txt"
    bodies.write_text("\n".join(lines) + "\n")
    out: dict = {"body_bytes": sum(map(len, lines)) // len(lines), "conversations": len(lines)}
    try:
        for variant in ("routed", "plain"):
            d = Path(tempfile.mkdtemp(prefix=f"zccp-bench-front-{variant}-"))
            d.chmod(0o755)
            listen = f"127.0.0.1:{_free_port()}"
            (d / "front.yaml").write_text(yaml.safe_dump({"front": {
                "hosts": dns.name, "port": port, "listen": listen, "resolver": dns.address, "workers": 1}}))
            conf = render_front(load_front(d / "front.yaml"), d / "nginx")
            if variant == "plain":
                text = conf.read_text()
                text = re.sub(r"upstream zccp_hosts \{.*?\n    \}", "upstream zccp_hosts {\n"
                              f"        server 127.0.0.2:{port};\n        server 127.0.0.3:{port};\n"
                              "        keepalive 64;\n    }", text, flags=re.S)
                text = text.replace('access_by_lua_block { require("zccp.front.tier").route() }', "")
                conf.write_text(text)
            proc = start_nginx(conf, conf.parent)
            try:
                wait_http(f"http://{listen}/health" if variant == "routed" else f"http://{listen}/v1/models")
                url = f"http://{listen}/v1/chat/completions"
                subprocess.run(["wrk", "-t1", "-c8", "-d1s", "-s", str(REPO / "bench/wrk/post.lua"), url, "--",
                                str(bodies)], capture_output=True, check=True)   # warm-up
                s0, m0 = snapshot(proc.pid), machine_busy_s()
                w = subprocess.run(["wrk", "-t1", "-c8", f"-d{int(seconds)}s", "-s", str(REPO / "bench/wrk/post.lua"),
                                    url, "--", str(bodies)], capture_output=True, text=True, check=True)
                s1, m1 = snapshot(proc.pid), machine_busy_s()
                (line,) = [ln for ln in w.stdout.splitlines() if ln.startswith("WRKJSON ")]
                stats = json.loads(line[8:])
                cpu = delta(s0, s1)["cpu_s"]
                out[variant] = {"requests": stats["requests"], "non_2xx": stats["statuses"],
                                "errors": stats["err_connect"] + stats["err_read"] + stats["err_timeout"],
                                "rps": stats["requests"] / (stats["duration_us"] / 1e6),
                                "p50_us": stats["p50_us"], "front_cpu_s": cpu,
                                "front_cpu_us_per_request": cpu / stats["requests"] * 1e6,
                                "machine_busy_s": m1 - m0}
                if variant == "routed":
                    log = (conf.parent / "logs" / "front-access.log").read_text()
                    out[variant]["by_host"] = {h: log.count(f'"host":"{h}:{port}"') for h in dns.addresses}
            finally:
                stop_nginx(proc)
                shutil.rmtree(d, ignore_errors=True)
    finally:
        dns.stop()
        stop_nginx(stub)
    out["routing_cpu_us_per_request"] = (out["routed"]["front_cpu_us_per_request"]
                                         - out["plain"]["front_cpu_us_per_request"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=40, help="batches of 100 calls per timing")
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--out", default="bench")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="zccp-bench-front-") as t:
        tmp = Path(t)
        os.chmod(tmp, 0o755)
        decide, spread = decision_and_spread(tmp, args.n)
        whole = front_cpu(tmp, args.seconds)
    result = {"decide": decide, "spread": spread, "front": whole, "cores": os.cpu_count(),
              "load_before": os.getloadavg()}
    Path(args.out, "front_tier.json").write_text(json.dumps(result, indent=1) + "\n")
    print("| body | hosts | route key from | JSON decode µs | decode + masks µs | key_of µs | first_pick µs "
          "| both µs |")
    print("|---|---|---|---|---|---|---|---|")
    for d in decide:
        print(f"| {d['body_bytes']:,} B | {d['hosts']} | {d['how']} | {d['decode_us']:.2f} "
              f"| {d['decode_mask_us']:.2f} | {d['key_us']:.2f} | {d['pick_us']:.3f} | {d['both_us']:.2f} |")
    print()
    print("| hosts | conversations per host | max / ideal | min / ideal |")
    print("|---|---|---|---|")
    for n in HOST_COUNTS:
        s = spread[str(n)]
        print(f"| {n} | {' / '.join(map(str, s['counts']))} | {s['max_over_ideal']:.3f} | {s['min_over_ideal']:.3f} |")
    print(f"\njoin 3->4: {spread['join']}; leave 4->3: {spread['leave']}; key sources: {spread['how']}")
    print(json.dumps(whole, indent=1))


if __name__ == "__main__":
    main()
