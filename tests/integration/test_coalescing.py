"""Identical requests in flight are answered by one generation (zccp.cache.inflight):
the first misses and runs the model, the rest wait for its answer and replay it."""

from __future__ import annotations

import concurrent.futures as cf

import httpx

from tests.support.cache_requests import metric
from tests.support.harness import anthropic_body

N = 24


def _burst(stack, body: dict, n: int, **headers: str) -> list[httpx.Response]:
    with cf.ThreadPoolExecutor(n) as pool, stack.client(timeout=60) as c:
        return list(pool.map(lambda _: c.post("/v1/messages", json=body, headers=headers), range(n)))


def _slow_stack(make_stack, **cache):
    # 40 tokens x 10 ms: every request of the burst arrives while the first is generated
    return make_stack({"model": {"backend": "null", "null_token_delay_ms": 10},
                       "shared_memory": {"segment_count": 32},
                       "cache": {"ttl_s": 600, **cache}}, with_redis=True)


def test_identical_requests_in_flight_share_one_generation(make_stack):
    s = _slow_stack(make_stack)
    body = anthropic_body("coalesce me", max_tokens=40, temperature=1)
    rs = _burst(s, body, N)
    assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200]
    states = sorted(r.headers["x-zccp-cache"] for r in rs)
    assert states.count("MISS") == 1, states           # one generation
    assert states.count("HIT") == N - 1, states
    texts = {r.json()["content"][0]["text"] for r in rs}
    assert len(texts) == 1
    assert len({r.json()["id"] for r in rs}) == N      # each answer its own id
    assert metric(s, "zccp_engine_coalesced_total", outcome="answered") == N - 1
    s.assert_no_leaks()


def test_streams_wait_too_and_replay_the_event_sequence(make_stack):
    s = _slow_stack(make_stack)
    body = anthropic_body("coalesce my stream", max_tokens=40, temperature=1, stream=True)
    rs = _burst(s, body, 8)
    assert [r.status_code for r in rs] == [200] * 8
    assert sorted(r.headers["x-zccp-cache"] for r in rs).count("MISS") == 1
    events = [[ln for ln in r.text.splitlines() if ln.startswith("event: ")] for r in rs]
    assert all(e == events[0] for e in events) and "event: message_stop" in events[0]
    s.assert_no_leaks()


def test_no_cache_requests_never_wait(make_stack):
    s = _slow_stack(make_stack)
    body = anthropic_body("do not coalesce me", max_tokens=40, temperature=1)
    rs = _burst(s, body, 6, **{"cache-control": "no-cache"})
    assert [r.status_code for r in rs] == [200] * 6
    assert metric(s, "zccp_engine_coalesced_total", outcome="answered") == 0
    s.assert_no_leaks()


def test_coalescing_off_runs_every_request(make_stack):
    s = _slow_stack(make_stack, coalesce_wait_ms=0)
    body = anthropic_body("every one runs", max_tokens=40, temperature=1)
    rs = _burst(s, body, 6)
    # whoever arrives after the first answer is stored hits; the burst itself all missed
    assert sorted(r.headers["x-zccp-cache"] for r in rs).count("MISS") >= 2
    s.assert_no_leaks()



def test_fast_answers_are_coalesced_every_round(make_stack):
    # The null model answers at once: the first request can store and release its key
    # between a twin's lookup and that twin's claim; the twin must look again, not generate.
    s = make_stack({"model": {"backend": "null"}, "shared_memory": {"segment_count": 16},
                    "cache": {"ttl_s": 600}}, with_redis=True)
    wrong = []
    for round_no in range(20):
        body = anthropic_body(f"coalesce round {round_no}", max_tokens=8, temperature=1)
        rs = _burst(s, body, 8)
        assert [r.status_code for r in rs] == [200] * 8
        states = sorted(r.headers["x-zccp-cache"] for r in rs)
        if states != ["HIT"] * 7 + ["MISS"]:
            wrong.append((round_no, states))
    assert not wrong, wrong
    s.assert_no_leaks()
