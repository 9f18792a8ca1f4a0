"""An engine of several processes (server.engine_processes; zccp.process.group), through the
real nginx, engine and Redis: prep processes accept on the engine's doorbell beside the
model's process, answer rings on the one arena, show in one /metrics page, are started again
when one dies (its in-flight requests fail alone, no slot is left behind), and never outlive
the engine, stopped or killed."""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.cache_requests import NULL
from tests.support.engine_group import engine_pid as _engine_pid
from tests.support.engine_group import kill_prep_mid_streams
from tests.support.engine_group import page_value as _engine_value
from tests.support.engine_group import prep_pids as _prep_pids
from tests.support.engine_group import rings as _rings
from tests.support.engine_group import wait_for as _wait
from tests.support.harness import Stack, alive, anthropic_body
from tests.support.scripted_upstream import Scripted, ScriptedUpstream, openai_chunks

PROCESSES = 3


def _send(stack: Stack, n: int, tag: str, conc: int = 6) -> list[int]:
    def one(i: int) -> int:
        with stack.client() as c:
            return c.post("/v1/messages", json=anthropic_body(f"{tag} {i}")).status_code

    with cf.ThreadPoolExecutor(conc) as ex:
        return list(ex.map(one, range(n)))


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("prep"), {"model": NULL, "server": {"engine_processes": PROCESSES},
                                                 "shared_memory": {"segment_count": 16}}, with_redis=True).start()
    try:
        yield s
    finally:
        s.stop()


def test_prep_processes_answer_rings_and_show_in_one_metrics_page(stack: Stack) -> None:
    # rank 0 accepted nothing before its prep processes did: the first connections spread too
    before = _engine_value(stack, "zccp_engine_rings_total")
    statuses = _send(stack, 120, "spread")
    assert statuses == [200] * 120
    socket_path = stack.cfg.server.socket_path
    assert socket_path is not None
    per_prep = [_rings(socket_path, rank) for rank in range(1, PROCESSES)]
    # rank 0's page sums every process's counters: all 120 rings, wherever they landed
    assert _engine_value(stack, "zccp_engine_rings_total") - before == 120
    assert _engine_value(stack, "zccp_engine_processes") == PROCESSES
    # nginx rings each process's own doorbell in turn (the control page's doorbell_count):
    # every prep process takes its share (a third each), whatever connections nginx pooled
    assert all(n >= 20 for n in per_prep), per_prep
    stack.assert_no_leaks()


def test_a_killed_prep_process_is_started_again_and_leaves_nothing(stack: Stack) -> None:
    engine = _engine_pid(stack)
    _wait(lambda: len(_prep_pids(engine)) == PROCESSES - 1, "the prep processes are not all up")
    victim = min(_prep_pids(engine))
    os.kill(victim, signal.SIGKILL)
    _wait(lambda: not alive(victim), "the killed prep process is still there")
    _wait(lambda: len(_prep_pids(engine)) == PROCESSES - 1 and victim not in _prep_pids(engine),
          "the prep process was not started again")
    # nginx's pooled connections to the dead process are gone: new rings reach the others
    statuses = _send(stack, 60, "after kill")
    assert statuses == [200] * 60
    stack.assert_no_leaks()
    assert "exited with -9; starting it again" in stack.engine_log()


@pytest.mark.parametrize("crash", [False, True], ids=["stopped", "killed"])
def test_prep_processes_stop_with_the_engine(tmp_path: Path, crash: bool) -> None:
    s = Stack(tmp_path, {"model": NULL, "server": {"engine_processes": 2}}).start()
    try:
        engine = _engine_pid(s)
        preps = _prep_pids(engine)
        assert len(preps) == 1    # running before the engine answered its first PING
        with httpx.Client(base_url=s.base_url, timeout=30) as c:
            assert c.post("/v1/messages", json=anthropic_body("hi")).status_code == 200
        s.stop_engine(crash=crash)
        # stopped: rank 0 SIGTERMs it; SIGKILLed: the kernel's parent-death signal
        _wait(lambda: not any(alive(p) for p in preps), "a prep process outlived the engine")
    finally:
        s.stop()


def test_a_prep_process_killed_mid_stream_fails_only_its_own(tmp_path: Path) -> None:
    s = Stack(tmp_path, {"model": dict(NULL, null_token_delay_ms=20, null_reply="tick " * 1000),
                         "server": {"engine_processes": 2}, "shared_memory": {"segment_count": 16}}).start()
    try:
        (victim,) = _prep_pids(_engine_pid(s))

        def stream(i: int) -> str:
            body = anthropic_body(f"stream {i}", max_tokens=150, stream=True)
            try:
                with httpx.Client(base_url=s.base_url, timeout=30) as c, \
                        c.stream("POST", "/v1/messages", json=body) as r:
                    text = "".join(r.iter_text())
            except httpx.HTTPError:
                return "cut"
            return "whole" if r.status_code == 200 and "message_stop" in text else "cut"

        # nginx reuses its doorbell connections: a burst may all land on rank 0; try again until
        # the prep process holds some of the streams when it is killed
        on_victim, ends = kill_prep_mid_streams(s, victim, stream, 8, 0.8)
        assert on_victim, "no stream reached the prep process"
        # the victim's streams were cut, and only those: rank 0's went on to their end
        assert ends.count("cut") == on_victim and ends.count("whole") == 8 - on_victim
        _wait(lambda: len(_prep_pids(_engine_pid(s))) == 1, "the prep process was not started again")
        assert _send(s, 20, "after") == [200] * 20
        s.assert_no_leaks()
    finally:
        s.stop()


def test_an_upstream_engine_forwards_from_its_prep_processes(tmp_path: Path) -> None:
    upstream = ScriptedUpstream([Scripted(200, body=openai_chunks(["fine"]))])
    s = Stack(tmp_path, {"model": {"backend": "upstream", "name": "zccp-gw"},
                         "upstream": {"urls": [upstream.url], "api": "openai", "retries": 0},
                         "server": {"engine_processes": 2}}).start()
    try:
        socket_path = s.cfg.server.socket_path
        assert socket_path is not None
        body = {"model": "zccp-gw", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}

        def one(i: int) -> str:
            with s.client() as c:
                r = c.post("/v1/messages", json=dict(body, stream=bool(i % 2)))
            return r.text if r.status_code == 200 else f"{r.status_code} {r.text}"

        for _ in range(10):    # until a prep process has taken some (nginx reuses its connections)
            with cf.ThreadPoolExecutor(6) as ex:
                texts = list(ex.map(one, range(24)))
            assert all("fine" in t for t in texts), texts
            if _rings(socket_path, 1):
                break
        assert _rings(socket_path, 1), "no request reached the prep process"
        s.assert_no_leaks()
    finally:
        s.stop()
        upstream.close()
