"""Fair share among any number of tenants (docs/isolation.md, "Fair share across tenants"),
through real nginx and the engine: tenants that fill the batch between them leave the spare
rows to a tenant holding none, so a victim's request is answered while every hog's answers
still run and their backlog still waits; tenants compiling slow schemas do not hold every
grammar worker, and a schema one tenant compiled is a lookup for another; a request that
runs out of time is charged the tokens it generated. Facts of order and state (the engine's
/metrics, which answers ended first), not of time."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.cache_requests import NULL, req
from tests.support.keys_helpers import keys_cli

MSG = [{"role": "user", "content": "Hello there"}]
AUTH = {"mode": "keys", "cache_ttl_s": 1, "negative_ttl_s": 1}


def _gauge(stack, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", stack.admin_client().get("/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def _wait_for(cond, what: str, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.05)


def _in_background(fn) -> tuple[threading.Thread, list]:
    """fn() in a thread; its answer (or the HTTP error of a stack stopped under it) in the list."""
    out: list = []

    def run() -> None:
        try:
            out.append(fn())
        except httpx.HTTPError as exc:
            out.append(exc)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _usage_lines(s, tenant: str) -> list[dict]:
    path = Path(s.cfg.auth.usage_log)
    lines = path.read_text().splitlines() if path.exists() else []
    return [x for x in map(json.loads, lines) if x["tenant"] == tenant]


def _client(s, tenant: str) -> httpx.Client:
    return httpx.Client(base_url=s.base_url, timeout=120, headers={"authorization": f"Bearer sk-{tenant}"})


@pytest.mark.parametrize("hogs, rows", [(2, 16), (3, 32)])
def test_a_victim_is_answered_while_hostile_tenants_fill_the_batch(make_stack, hogs, rows):
    """Each hog asks for `rows` choices of 4,000 tokens (5 ms a step: 20 s each), one hog after
    the other has taken its rows; the victim's 2-token request is answered while no hog's
    answer has ended and the hogs' choices still wait in the queue (without the spare rows,
    two hogs held all 16 rows and the victim waited for one of their answers)."""
    spare = -(-rows // 8)
    s = make_stack({"model": {**NULL, "null_reply": "x" * 5000, "null_token_delay_ms": 5,
                              "max_batch": rows, "max_queue": 128},
                    "limits": {"max_tokens_cap": 8000, "request_timeout_ms": 120000}})
    victim = _client(s, "victim")
    short = {"model": "zccp-tiny", "max_tokens": 2, "messages": MSG}
    hog_body = {"model": "zccp-tiny", "max_tokens": 4000, "n": rows, "messages": MSG}
    answers: list[list] = []
    try:
        assert victim.post("/v1/chat/completions", json=short).status_code == 200    # the victim was here before
        for i in range(hogs):
            c = _client(s, f"hog{i}")
            _, out = _in_background(lambda c=c: c.post("/v1/chat/completions", json=hog_body))
            answers.append(out)
            held = rows - spare + i      # the first hog all but the spare rows, each later one a spare row
            _wait_for(lambda held=held: _gauge(s, "zccp_engine_batch_rows") >= held, f"hog{i} never held its rows")
        r = victim.post("/v1/chat/completions", json=short)
        waiting = _gauge(s, "zccp_engine_queue_waiting")
        ended = [out for out in answers if out]
    finally:
        victim.close()
    assert r.status_code == 200, r.text
    assert ended == []                                 # no hog's answer ended before the victim's
    assert waiting >= hogs * rows - (rows - spare + hogs - 1)       # the hogs' backlog still waited


def schema_costing_a_cpu_second(seed: int) -> dict:
    """A new schema each seed: an allOf of two anyOfs of 60 objects (3,600 merged objects),
    ~1 CPU-second for llguidance (docs/isolation.md)."""
    return {"type": "object", "allOf": [{"anyOf": [{"properties": {f"a{j}_{q}": {"const": seed * 10**6 + i * 100 + q}
                                                                   for q in range(3)}} for i in range(60)]}
                                        for j in range(2)]}


def test_a_third_tenants_schema_compiles_while_two_tenants_compile_slow_ones(make_stack):
    s = make_stack({"model": {"max_batch": 8}})
    small = {"model": "zccp-tiny", "max_tokens": 24, "temperature": 0, "messages": MSG, "response_format": {
        "type": "json_schema", "json_schema": {"name": "small", "schema": {
            "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}}}}
    hogs = [_client(s, "hog0"), _client(s, "hog1")]
    threads = []
    for seed, c in enumerate(hogs):
        body = {"model": "zccp-tiny", "max_tokens": 4, "messages": MSG, "response_format": {
            "type": "json_schema", "json_schema": {"name": "big", "schema": schema_costing_a_cpu_second(seed)}}}
        threads.append(_in_background(lambda c=c, body=body: c.post("/v1/chat/completions", json=body))[0])
    with _client(s, "victim") as victim, _client(s, "another") as another:
        _wait_for(lambda: _gauge(s, "zccp_engine_grammar_compiling") == 2, "the hogs' schemas never compiled")
        r = victim.post("/v1/chat/completions", json=small)
        still = _gauge(s, "zccp_engine_grammar_compiling")
        compiles = _gauge(s, "zccp_engine_grammar_compiles_total")
        again = another.post("/v1/chat/completions", json=small)     # the victim's schema, compiled once
        compiles_after = _gauge(s, "zccp_engine_grammar_compiles_total")
    for t in threads:
        t.join(120)
    for c in hogs:
        c.close()
    assert r.status_code == 200, r.text              # not the 400 "too complex" of waiting for a worker
    assert still == 2                                # both hogs' compiles still ran when it was answered
    assert again.status_code == 200, again.text
    assert compiles == compiles_after == 3           # two hogs' schemas and the victim's, not a fourth


def test_a_request_that_times_out_is_charged_what_it_generated(make_stack):
    """A whole (not streamed) answer of 400 tokens at 20 ms each ends at the 1.5 s deadline
    with nginx's 504; its usage line counts the tokens the engine generated until then
    (it counted 0), never more than the 400 allowed."""
    s = make_stack({"model": dict(NULL, null_token_delay_ms=20, null_reply="slow " * 200), "auth": AUTH,
                    "limits": {"request_timeout_ms": 1500}}, with_redis=True)
    k = keys_cli(s, "create", "--tenant", "late", "--otpm", "100000")["key"]
    body = req("anthropic", [{"role": "user", "content": "tell me a long story"}], max_tokens=400)
    with httpx.Client(base_url=s.base_url, timeout=30) as c:
        r = c.post("/v1/messages", json=body, headers={"x-api-key": k, "cache-control": "no-store"})
    assert r.status_code == 504, r.text
    _wait_for(lambda: _usage_lines(s, "late"), "no usage line", 10)     # the workers flush every 50 ms
    (line,) = _usage_lines(s, "late")
    assert 0 < line["output_tokens"] < 400, line
