"""model.backend: upstream against real servers: a second ZCCP stack is the upstream
(its /v1/chat/completions and /v1/messages are the OpenAI- and Anthropic-compatible
servers), both official SDKs are the clients, each API in front of each API.

The upstream's model is the null backend replying with hermes tool-call markup, so its
answer is known: text without tools, two tool calls (one with tricky arguments) with.
The failure cases a real server cannot produce on demand (429 and 500 before the first
byte, a stream cut mid-way) use tests/support/scripted_upstream.py, a real HTTP server
answering from a script.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.support.harness import Stack
from tests.support.scripted_upstream import Scripted, ScriptedUpstream, openai_chunks

REPLY = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
         '"note": "caf\u00e9 </tool_call> \U0001f600"}}\n</tool_call>'
         '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
CALL_1 = {"city": "Paris", "note": "caf\u00e9 </tool_call> \U0001f600"}
UP_MODEL, GW_MODEL = "zccp-up", "zccp-gw"
TOOLS_OPENAI = [{"type": "function", "function": {"name": n, "description": n, "parameters": {"type": "object"}}}
                for n in ("get_weather", "get_time")]
TOOLS_ANTHROPIC = [{"name": n, "description": n, "input_schema": {"type": "object"}}
                   for n in ("get_weather", "get_time")]
PATH = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}


def front_config(urls: list[str], api: str, **upstream: Any) -> dict[str, Any]:
    return {"model": {"backend": "upstream", "name": GW_MODEL},
            "upstream": {"urls": urls, "api": api, "model": UP_MODEL, "connect_timeout_ms": 500,
                         "read_timeout_ms": 5000, **upstream}}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("up"), {"model": {"backend": "null", "name": UP_MODEL, "null_reply": REPLY},
                                           "limits": {"max_tokens_cap": 1024}})
    try:
        yield s.start()
    finally:
        s.stop()


@pytest.fixture(scope="module", params=["openai", "anthropic"])
def front(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, up: Stack) -> Iterator[Stack]:
    """A gateway whose engine forwards to `up` over the upstream API request.param (cache on)."""
    s = Stack(tmp_path_factory.mktemp(f"front_{request.param}"), front_config([up.base_url + "/v1"], request.param),
              with_redis=True)
    s.upstream_api = request.param   # type: ignore[attr-defined]
    try:
        yield s.start()
    finally:
        s.stop()


def sent(up: Stack, api: str) -> int:
    """Generation requests the upstream stack's nginx received (its access log)."""
    return sum(1 for line in up.log("nginx-access.log").splitlines() if PATH[api] in line)


def sent_once_logged(up: Stack, api: str, at_least: int) -> int:
    """sent(), once it reaches at_least: the upstream's nginx writes its access-log line in the
    log phase, after its Lua finished the request, which can be after our client has read the
    answer (seen under CI's two workers: 12 lines where 13 were due)."""
    deadline = time.monotonic() + 10
    while (n := sent(up, api)) < at_least and time.monotonic() < deadline:
        time.sleep(0.02)
    return n


def clients(s: Stack) -> tuple[anthropic.Anthropic, openai.OpenAI]:
    return (anthropic.Anthropic(base_url=s.base_url, api_key="k", max_retries=0, timeout=30),
            openai.OpenAI(base_url=s.base_url + "/v1", api_key="k", max_retries=0, timeout=30))


# -- text, both ways ------------------------------------------------------------------------

def test_text_non_streamed(front: Stack) -> None:
    a, o = clients(front)
    m = a.messages.create(model=GW_MODEL, max_tokens=400,
                          messages=[{"role": "user", "content": "text a"}])
    assert m.content[0].type == "text" and m.content[0].text == REPLY
    assert m.stop_reason == "end_turn" and m.model == GW_MODEL
    assert m.usage.output_tokens == len(REPLY.encode()) and m.usage.input_tokens > 0
    c = o.chat.completions.create(model=GW_MODEL, max_tokens=400, temperature=0,
                                  messages=[{"role": "user", "content": "text o"}])
    assert c.choices[0].message.content == REPLY and c.choices[0].finish_reason == "stop"
    assert c.usage is not None and c.usage.completion_tokens == len(REPLY.encode())


def test_text_streamed(front: Stack) -> None:
    a, o = clients(front)
    with a.messages.stream(model=GW_MODEL, max_tokens=400,
                           messages=[{"role": "user", "content": "stream a"}]) as st:
        pieces = list(st.text_stream)
        m = st.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == REPLY and m.stop_reason == "end_turn"
    chunks = list(o.chat.completions.create(model=GW_MODEL, max_tokens=400, temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": "stream o"}]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == REPLY
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(REPLY.encode())


def test_max_tokens_stop_reason(front: Stack) -> None:
    a, o = clients(front)
    m = a.messages.create(model=GW_MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert m.stop_reason == "max_tokens" and m.content[0].text == REPLY[:5]
    c = o.chat.completions.create(model=GW_MODEL, max_tokens=5, temperature=0,
                                  messages=[{"role": "user", "content": "y"}])
    assert c.choices[0].finish_reason == "length"


# -- tool calls, both ways --------------------------------------------------------------------

def test_tool_calls_anthropic_client(front: Stack) -> None:
    a, _ = clients(front)
    kw: dict[str, Any] = dict(model=GW_MODEL, max_tokens=400, tools=TOOLS_ANTHROPIC,
                              messages=[{"role": "user", "content": "weather?"}])
    m = a.messages.create(**kw)
    with a.messages.stream(**kw) as st:
        streamed = st.get_final_message()
    for msg in (m, streamed):
        uses = [b for b in msg.content if b.type == "tool_use"]
        assert [(u.name, u.input) for u in uses] == [("get_weather", CALL_1), ("get_time", {})]
        assert msg.stop_reason == "tool_use" and all(u.id for u in uses)
        assert [b.text for b in msg.content if b.type == "text"] == ["Let me check. "]


def test_tool_calls_openai_client(front: Stack) -> None:
    _, o = clients(front)
    kw: dict[str, Any] = dict(model=GW_MODEL, max_tokens=400, temperature=0, tools=TOOLS_OPENAI,
                              messages=[{"role": "user", "content": "weather?"}])
    c = o.chat.completions.create(**kw)
    calls = c.choices[0].message.tool_calls or []
    assert [(t.function.name, json.loads(t.function.arguments)) for t in calls] == \
        [("get_weather", CALL_1), ("get_time", {})]
    assert c.choices[0].finish_reason == "tool_calls"
    # streamed: the fragments of each call under its own index, arguments whole once joined
    got: dict[int, dict[str, str]] = {}
    for ch in o.chat.completions.create(stream=True, **kw):
        for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
            d = got.setdefault(tc.index, {"name": "", "args": "", "id": ""})
            d["name"] += tc.function.name or "" if tc.function else ""
            d["args"] += tc.function.arguments or "" if tc.function else ""
            d["id"] += tc.id or ""
    assert sorted(got) == [0, 1]
    assert [(got[i]["name"], json.loads(got[i]["args"])) for i in (0, 1)] == \
        [("get_weather", CALL_1), ("get_time", {})]
    assert all(got[i]["id"] for i in (0, 1))


def test_tool_results_round_trip(front: Stack) -> None:
    """The next turn (the assistant's tool calls, the tool's results) is accepted by the
    upstream in its own API: the conversation translated, not only the answer."""
    a, o = clients(front)
    m = a.messages.create(model=GW_MODEL, max_tokens=400, tools=TOOLS_ANTHROPIC, messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me check."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": CALL_1}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                                     {"type": "text", "text": "and?"}]}])
    assert m.stop_reason == "tool_use"
    c = o.chat.completions.create(model=GW_MODEL, max_tokens=400, temperature=0, tools=TOOLS_OPENAI, messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps(CALL_1)}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])
    assert c.choices[0].finish_reason == "tool_calls"


# -- what is in front still applies -------------------------------------------------------------

def test_repeated_prompt_answered_without_the_upstream(front: Stack, up: Stack) -> None:
    api = front.upstream_api   # type: ignore[attr-defined]
    body = {"model": GW_MODEL, "max_tokens": 400, "temperature": 0,
            "messages": [{"role": "user", "content": f"repeat me {api}"}]}
    with front.client() as h:
        before = sent(up, api)
        first = h.post("/v1/messages", json=body)
        assert first.status_code == 200 and first.headers["x-zccp-cache"] == "MISS"
        assert sent_once_logged(up, api, before + 1) == before + 1
        for _ in range(3):
            again = h.post("/v1/messages", json=body)
            assert again.status_code == 200 and again.headers["x-zccp-cache"] == "HIT"
            assert again.json()["content"] == first.json()["content"]
        # One more miss after the hits: once its line is in, a forwarded hit's would be too.
        other = h.post("/v1/messages", json={**body, "messages": [{"role": "user", "content": f"other {api}"}]})
        assert other.status_code == 200 and other.headers["x-zccp-cache"] == "MISS"
        assert sent_once_logged(up, api, before + 2) == before + 2   # the hits never reached the upstream


def test_upstream_refusal_is_the_clients_error(front: Stack) -> None:
    """The upstream's 400 (its max_tokens cap is 1024, the gateway's 4096) is the client's
    400 invalid_request_error, in the client's API."""
    with front.client() as h:
        r = h.post("/v1/chat/completions", json={"model": GW_MODEL, "max_tokens": 2000,
                                                  "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        r = h.post("/v1/messages", json={"model": GW_MODEL, "max_tokens": 2000,
                                         "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        assert "upstream refused" in r.json()["error"]["message"]
    front.assert_no_leaks()


# -- failures -----------------------------------------------------------------------------------

def _gateway(tmp: Path, cfg: dict[str, Any]) -> Stack:
    return Stack(tmp, cfg).start()


def test_dead_upstream_falls_back(tmp_path: Path, up: Stack) -> None:
    from zccp.ops.stack import free_port

    dead = f"http://127.0.0.1:{free_port()}/v1"
    s = _gateway(tmp_path, front_config([dead, up.base_url + "/v1"], "openai", retries=1))
    try:
        _, o = clients(s)
        for i in range(3):   # the first pays a refused connect; later ones skip the dead URL
            c = o.chat.completions.create(model=GW_MODEL, max_tokens=400, temperature=0,
                                          messages=[{"role": "user", "content": f"fb {i}"}])
            assert c.choices[0].message.content == REPLY
        # every URL down: the client's API-shaped 502, not a hang
        s2 = _gateway(tmp_path / "b", front_config([dead], "anthropic", retries=1))
        try:
            with s2.client() as h:
                r = h.post("/v1/messages", json={"model": GW_MODEL, "max_tokens": 8,
                                                 "messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 502 and r.json()["error"]["type"] == "api_error"
        finally:
            s2.stop()
    finally:
        s.stop()


@pytest.mark.parametrize("status", [429, 500, 503])
def test_retry_before_first_byte(tmp_path: Path, status: int) -> None:
    good = ScriptedUpstream([Scripted(200, body=openai_chunks(["fine", "!"]))])
    bad = ScriptedUpstream([Scripted(status, {"retry-after": "7"},
                                     b'{"error":{"message":"slow down","type":"x"}}')])
    s = _gateway(tmp_path, front_config([bad.url, good.url], "openai", retries=1))
    try:
        with s.client() as h:
            r = h.post("/v1/chat/completions", json={"model": GW_MODEL, "max_tokens": 8,
                                                      "messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "fine!"
            assert (bad.requests, good.requests) == (1, 1)
        # no fallback left: the upstream's status in the client's shape
        only = _gateway(tmp_path / "only", front_config([bad.url], "openai", retries=0))
        try:
            with only.client() as h:
                r = h.post("/v1/chat/completions", json={"model": GW_MODEL, "max_tokens": 8,
                                                          "messages": [{"role": "user", "content": "x"}]})
                ra = h.post("/v1/messages", json={"model": GW_MODEL, "max_tokens": 8,
                                                  "messages": [{"role": "user", "content": "x"}]})
        finally:
            only.stop()
        want = {429: (429, "rate_limit_error"), 500: (502, "api_error"), 503: (529, "overloaded_error")}[status]
        assert ra.status_code == want[0] and ra.json()["error"]["type"] == want[1]
        assert r.status_code == (503 if status == 503 else want[0]) and "error" in r.json()
        if status == 429:
            assert r.headers.get("retry-after") == "7"
    finally:
        s.stop()
        good.close()
        bad.close()


def test_upstream_key_refused_is_a_gateway_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = ScriptedUpstream([Scripted(401, body=b'{"error":{"message":"bad key sk-SECRET","type":"auth"}}')])
    monkeypatch.setenv("ZCCP_TEST_UPSTREAM_KEY", "sk-SECRET")
    s = _gateway(tmp_path, front_config([bad.url], "openai", api_key_env="ZCCP_TEST_UPSTREAM_KEY"))
    try:
        with s.client() as h:
            r = h.post("/v1/chat/completions", json={"model": GW_MODEL, "max_tokens": 8,
                                                      "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 502 and "SECRET" not in r.text
        assert r.json()["error"]["type"] == "server_error"
        assert bad.requests == 1        # not retried: another attempt gets the same answer
    finally:
        s.stop()
        bad.close()


@pytest.mark.parametrize("client_api", ["openai", "anthropic"])
def test_cut_mid_stream_ends_with_an_api_error(tmp_path: Path, client_api: str) -> None:
    cut = ScriptedUpstream([Scripted(200, body=openai_chunks(["half", " an"], finish=False), cut=True)])
    s = _gateway(tmp_path, front_config([cut.url], "openai", retries=2))
    try:
        with s.client() as h:
            body = {"model": GW_MODEL, "max_tokens": 8, "stream": True,
                    "messages": [{"role": "user", "content": "x"}]}
            with h.stream("POST", PATH[client_api], json=body) as r:
                raw = r.read().decode()
            assert r.status_code == 200
            assert "half" in raw and ("event: error" in raw if client_api == "anthropic" else '"error"' in raw)
            assert "[DONE]" not in raw and "message_stop" not in raw
            assert cut.requests == 1        # after the first byte: never retried
            # not streamed: nothing was written yet, so a status of its own
            body["stream"] = False
            r2 = h.post(PATH[client_api], json=body)
            assert r2.status_code == 502 and "error" in r2.json()
        s.assert_no_leaks()
    finally:
        s.stop()
        cut.close()


def test_failed_url_is_skipped_until_it_answers_again(tmp_path: Path) -> None:
    """A URL that failed (500) is skipped during its cool-down while the fallback answers;
    once its probe succeeds it is the first choice again."""
    first = ScriptedUpstream([Scripted(500, body=b'{"error":{"message":"down"}}')])
    second = ScriptedUpstream([Scripted(200, body=openai_chunks(["second"]))])
    s = _gateway(tmp_path, front_config([first.url, second.url], "openai", retries=1, cooldown_ms=3000,
                                        health_interval_ms=200))
    try:
        def ask(i: int) -> str:
            with s.client() as h:
                r = h.post("/v1/chat/completions", json={"model": GW_MODEL, "max_tokens": 8,
                                                          "messages": [{"role": "user", "content": f"q{i}"}]})
            assert r.status_code == 200
            return r.json()["choices"][0]["message"]["content"]

        assert ask(0) == "second" and first.requests == 1
        for i in range(3):                    # cooling down: not asked
            assert ask(1 + i) == "second"
        assert first.requests == 1
        first.script = [Scripted(200, body=openai_chunks(["first"]))]    # it recovers
        deadline = time.monotonic() + 30
        while ask(9) != "first":              # probed (GET /models) after the cool-down, then used
            assert time.monotonic() < deadline, "the recovered URL was never used again"
            time.sleep(0.1)
    finally:
        s.stop()
        first.close()
        second.close()


def test_identical_misses_reach_the_upstream_once(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Coalescing sits in front of the upstream as of a model: 6 identical requests at once,
    the upstream (slowed to ~0.5 s an answer) sees one."""
    slow = Stack(tmp_path_factory.mktemp("slow_up"), {"model": {"backend": "null", "name": UP_MODEL,
                                                                "null_token_delay_ms": 15}}).start()
    gw = Stack(tmp_path, front_config([slow.base_url + "/v1"], "openai"), with_redis=True).start()
    try:
        body = {"model": GW_MODEL, "max_tokens": 40, "temperature": 0,
                "messages": [{"role": "user", "content": "the same question, six times"}]}
        with ThreadPoolExecutor(6) as pool, gw.client() as h:
            answers = list(pool.map(lambda _: h.post("/v1/chat/completions", json=body), range(6)))
        assert [r.status_code for r in answers] == [200] * 6
        assert len({r.json()["choices"][0]["message"]["content"] for r in answers}) == 1
        assert sent_once_logged(slow, "openai", 1) == 1
    finally:
        gw.stop()
        slow.stop()
