"""One request cannot hurt another (issue 28), through real nginx and the engine with the
tiny model: a hostile temperature or an unsatisfiable schema fails nobody else (and ends
its own request at once), a large schema compiles while others are served, and another
tenant is not queued behind one tenant's n choices."""

from __future__ import annotations

import json
import re
import threading
import time

import httpx

MSG = [{"role": "user", "content": "Hello there"}]


def _gauge(stack, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", stack.admin_client().get("/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def _wait_for(cond, what: str, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.02)


def _in_background(fn) -> tuple[threading.Thread, list]:
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


def test_hostile_numbers_and_grammars_fail_nobody_else(make_stack):
    s = make_stack({"model": {"max_batch": 8}})
    oai = {"model": "zccp-tiny", "max_tokens": 16, "messages": MSG}
    hostile = [
        ("/v1/chat/completions", {**oai, "temperature": 1e-300}),
        ("/v1/messages", {**oai, "temperature": 1e-300}),
        ("/v1/chat/completions", {**oai, "temperature": 0.8, "max_tokens": 30, "response_format": {
            "type": "json_schema", "json_schema": {"name": "e", "schema": {"const": "\u00e9"}}}}),
    ]
    good = [("/v1/chat/completions", {**oai, "temperature": 0, "messages": [{"role": "user", "content": f"q{i}"}]})
            for i in range(4)]
    with httpx.Client(base_url=s.base_url, timeout=30) as c:
        alone = [c.post(p, json=b).json()["choices"][0]["message"]["content"] for p, b in good]
        jobs = [_in_background(lambda p=p, b=b: c.post(p, json=b)) for p, b in hostile + good]
        for t, _ in jobs:
            t.join(60)
    got = [out[0] for _, out in jobs]
    t1, t2, grammar = got[:3]
    assert t1.status_code == 200 and t2.status_code == 200, (t1.text, t2.text)     # 1e-300 is greedy
    assert grammar.status_code == 400, grammar.text
    assert "cannot be completed with this model's vocabulary" in grammar.json()["error"]["message"]
    assert [r.status_code for r in got[3:]] == [200] * 4
    assert [r.json()["choices"][0]["message"]["content"] for r in got[3:]] == alone
    s.assert_no_leaks(10)


def test_another_tenant_is_not_queued_behind_n_choices(make_stack):
    s = make_stack({"model": {"max_batch": 1, "max_queue": 64}})
    backlog = {"model": "zccp-tiny", "max_tokens": 40, "temperature": 0, "n": 16, "messages": MSG}
    short = {"model": "zccp-tiny", "max_tokens": 2, "temperature": 0, "messages": MSG}
    done: list[str] = []
    a = httpx.Client(base_url=s.base_url, timeout=120, headers={"authorization": "Bearer sk-tenant-a"})
    b = httpx.Client(base_url=s.base_url, timeout=120, headers={"authorization": "Bearer sk-tenant-b"})
    with a, b:
        t, out = _in_background(lambda: (a.post("/v1/chat/completions", json=backlog), done.append("A"))[0])
        _wait_for(lambda: _gauge(s, "zccp_engine_queue_waiting") >= 10, "tenant A's choices never queued")
        r = b.post("/v1/chat/completions", json=short)
        done.append("B")
        t.join(120)
    assert r.status_code == 200 and out[0].status_code == 200, (r.text, out[0].text)
    assert done == ["B", "A"]                  # B was admitted before A's backlog drained
    assert len(out[0].json()["choices"]) == 16
    s.assert_no_leaks(10)


def test_n_larger_than_the_queue_is_a_400_not_a_retryable_429(make_stack):
    s = make_stack({"model": {"max_queue": 8}})
    r = s.client().post("/v1/chat/completions", json={"model": "zccp-tiny", "max_tokens": 2, "n": 9,
                                                      "messages": MSG})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "n" and "model.max_queue" in err["message"]
    assert json.loads(r.text)["error"]["type"] == "invalid_request_error"
