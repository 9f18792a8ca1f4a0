"""Faults: engine down, engine restarted or crashed, pool exhausted, stuck slots, load."""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import posix_ipc
import pytest

from tests.support.harness import anthropic_body, dumps
from zccp.transport.abi import PAGE_SIZE, State, ffi


def test_engine_not_running_is_503_not_a_hang(make_stack):
    s = make_stack({"model": {"backend": "null"}})
    s.stop_engine()
    with s.client(timeout=10) as c:  # the guard against a hang, not a timing assertion
        r = c.post("/v1/messages", json=anthropic_body())
        assert r.status_code == 503, r.text
        assert r.json()["error"]["type"] == "overloaded_error"
        assert r.headers["retry-after"] == "1"
        h = c.get("/health")
        assert h.status_code == 503 and h.json()["status"] == "unavailable"


def test_engine_restart_while_nginx_runs(make_stack):
    s = make_stack({"model": {"backend": "null"}})
    with s.client() as c:
        assert c.post("/v1/messages", json=anthropic_body("before")).status_code == 200
        old_epoch = s.arena().epoch
        s.stop_engine()
        s.start_engine()
        # The very next request works: nginx re-maps the new arena.
        r = c.post("/v1/messages", json=anthropic_body("after"))
        assert r.status_code == 200, r.text
        assert s.arena().epoch != old_epoch
    s.assert_no_leaks()


def test_engine_crash_and_restart(make_stack):
    s = make_stack({"model": {"backend": "null"}})
    with s.client() as c:
        assert c.post("/v1/messages", json=anthropic_body("before")).status_code == 200
        s.stop_engine(crash=True)  # SIGKILL: the old arena stays behind in /dev/shm
        r = c.post("/v1/messages", json=anthropic_body("while down"))
        assert r.status_code == 503
        s.start_engine()
        r = c.post("/v1/messages", json=anthropic_body("after"))
        assert r.status_code == 200, r.text
    s.assert_no_leaks()


# A null backend that takes 20 ms per token: a request that holds its slot for seconds.
SLOW = {"backend": "null", "null_token_delay_ms": 20, "null_reply": "slow " * 400}


def _hold_a_slot(s, started: threading.Event, release: threading.Event) -> None:
    body = anthropic_body("hold", max_tokens=2000, stream=True)
    with httpx.Client(base_url=s.base_url, timeout=60) as c, c.stream("POST", "/v1/messages", json=body) as r:
        assert r.status_code == 200, r.read()
        for _ in r.iter_bytes():
            started.set()
            if release.is_set():
                break


def _wait_started(started: threading.Event, holder: Future, timeout: float = 30) -> None:
    """Until the holder streams; a failure inside it is raised here, with its own message."""
    end = time.monotonic() + timeout
    while not started.wait(0.05):
        if holder.done():
            holder.result()   # raises the holder's assertion
            raise AssertionError("the holder ended before streaming")
        assert time.monotonic() < end, "the holder did not start streaming"


def test_no_free_slot_is_429_with_retry_after(make_stack):
    s = make_stack({"shared_memory": {"segment_count": 1}, "model": SLOW})
    started, release = threading.Event(), threading.Event()
    pool = ThreadPoolExecutor(1)
    holder = pool.submit(_hold_a_slot, s, started, release)
    try:
        _wait_started(started, holder)
        r = s.client().post("/v1/messages", json=anthropic_body("no room"))
        assert r.status_code == 429, r.text
        assert r.json()["error"]["type"] == "rate_limit_error"
        assert r.headers["retry-after"] == "1"
        # The SDKs see their own rate-limit exceptions (retries off so they surface).
        import anthropic
        import openai

        with pytest.raises(anthropic.RateLimitError):
            anthropic.Anthropic(base_url=s.base_url, api_key="x", max_retries=0).messages.create(
                model="zccp-tiny", max_tokens=5, messages=[{"role": "user", "content": "x"}])
        with pytest.raises(openai.RateLimitError) as exc:
            openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0).chat.completions.create(
                model="zccp-tiny", messages=[{"role": "user", "content": "x"}])
        assert exc.value.body["code"] == "rate_limit_exceeded"
    finally:
        release.set()
        pool.shutdown(wait=True)
    holder.result()
    s.assert_no_leaks()


def test_a_thread_failure_surfaces_with_its_message():
    """_wait_started re-raises what failed in the holder thread at once (not a timeout)."""
    def fails(*_):
        raise AssertionError("holder says: 503")

    with ThreadPoolExecutor(1) as pool:
        holder = pool.submit(fails)
        with pytest.raises(AssertionError, match="holder says: 503"):
            _wait_started(threading.Event(), holder, timeout=30)


def test_client_disconnect_frees_the_slot_and_stops_generation(make_stack):
    s = make_stack({"shared_memory": {"segment_count": 1}, "model": SLOW})
    started, release = threading.Event(), threading.Event()
    release.set()  # read one chunk, then hang up
    _hold_a_slot(s, started, release)
    assert started.is_set()
    s.assert_no_leaks(timeout=10)
    # The engine notices the close and stops generating (it would otherwise run for 8 s).
    end = time.monotonic() + 10
    while "request abandoned" not in s.engine_log() and time.monotonic() < end:
        time.sleep(0.05)
    assert "request abandoned" in s.engine_log()
    # The slot is usable again.
    assert s.client().post("/v1/messages", json=anthropic_body("next", max_tokens=4)).status_code == 200


def test_request_deadline_is_504(make_stack):
    s = make_stack({"limits": {"request_timeout_ms": 300}, "model": SLOW})
    r = s.client().post("/v1/messages", json=anthropic_body("slow", max_tokens=2000))
    assert r.status_code == 504, r.text
    assert r.json()["type"] == "error"
    s.assert_no_leaks(timeout=10)


def _sweeper_resets(s) -> float:
    text = s.admin_client().get("/metrics").text
    (line,) = [ln for ln in text.splitlines() if ln.startswith("zccp_engine_sweeper_resets_total")]
    return float(line.split()[-1])


def _dead_pid() -> int:
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_sweeper_resets_only_abandoned_slots(make_stack):
    s = make_stack({"shared_memory": {"segment_count": 3, "cleanup_interval_ms": 200}, "model": {"backend": "null"}})
    assert _sweeper_resets(s) == 0
    shm = posix_ipc.SharedMemory(s.cfg.shared_memory.name, 0)
    m = mmap.mmap(shm.fd, shm.size)
    shm.close_fd()
    buf = ffi.from_buffer(m)
    slot_size = ffi.cast("struct zccp_control *", buf).slot_size
    h = [ffi.cast("struct zccp_slot_header *", buf + PAGE_SIZE + i * slot_size) for i in range(3)]
    now = time.time_ns()
    # 0: a worker that died between claiming and ringing: READY, nobody rang, owner gone.
    h[0].owner_pid, h[0].timestamp_ns, h[0].deadline_ns = _dead_pid(), now - 10**9, now + 60 * 10**9
    h[0].state = State.READY
    # 1: a request whose deadline has passed (its worker, this process, is alive).
    h[1].owner_pid, h[1].timestamp_ns, h[1].deadline_ns = os.getpid(), now - 10**9, now - 1
    h[1].state = State.READY
    # 2: owned by a live process, deadline ahead: long, not abandoned; left alone.
    h[2].owner_pid, h[2].timestamp_ns, h[2].deadline_ns = os.getpid(), now - 10**9, now + 60 * 10**9
    h[2].state = State.READY
    try:
        deadline = time.monotonic() + 10
        while (h[0].state != State.FREE or h[1].state != State.FREE) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert h[0].state == State.FREE and h[1].state == State.FREE
        time.sleep(1.0)     # five more sweeps
        assert h[2].state == State.READY
        assert _sweeper_resets(s) == 2
    finally:
        h[2].state = State.FREE
        del h, buf
        m.close()


def test_a_request_longer_than_the_sweep_limit_runs_to_200(make_stack):
    # Sweeps every 0.25 s with a 1 s limit; each answer takes ~3 s (150 tokens x 20 ms).
    s = make_stack({"shared_memory": {"cleanup_interval_ms": 1000}, "limits": {"request_timeout_ms": 10000},
                    "model": {"backend": "null", "null_token_delay_ms": 20, "null_reply": "x" * 150}})
    with s.client() as c:
        r = c.post("/v1/messages", json=anthropic_body("long", max_tokens=150))
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["output_tokens"] == 150
        r = c.post("/v1/messages", json=anthropic_body("long stream", max_tokens=150, stream=True))
        assert r.status_code == 200 and "message_stop" in r.text and "event: error" not in r.text
    assert _sweeper_resets(s) == 0
    s.assert_no_leaks()


def test_shared_memory_garbage_is_rejected(make_stack):
    s = make_stack({"shared_memory": {"segment_count": 1}, "model": {"backend": "null"}})
    shm = posix_ipc.SharedMemory(s.cfg.shared_memory.name, 0)
    m = mmap.mmap(shm.fd, shm.size)
    shm.close_fd()
    buf = ffi.from_buffer(m)
    h = ffi.cast("struct zccp_slot_header *", buf + PAGE_SIZE)
    real_cap = h.payload_cap
    h.payload_cap = 0xFFFFFFFF  # a corrupted capacity must never be trusted
    try:
        r = s.client().post("/v1/messages", json=anthropic_body("x"))
        assert r.status_code == 503 and "corrupt" in r.json()["error"]["message"]
    finally:
        h.payload_cap = real_cap
    assert s.client().post("/v1/messages", json=anthropic_body("y")).status_code == 200
    del h, buf
    m.close()
    s.assert_no_leaks()


def test_two_workers_share_the_pool_without_handing_a_slot_out_twice(make_stack):
    # 2 ms per model step: each request holds its slot for ~10 ms, so 32 clients surely
    # contend for the 4 slots (an instant answer could free them faster than clients come).
    s = make_stack({"server": {"workers": 2}, "shared_memory": {"segment_count": 4},
                    "model": {"backend": "null", "null_token_delay_ms": 2}})
    # Every prompt has a different length, so the engine's input_tokens tells
    # whose body it read: a slot handed out twice would show up as a mismatch.
    texts = ["w" * (10 + i) for i in range(240)]

    def one(text: str):
        body = dumps(anthropic_body(text, max_tokens=4))
        with httpx.Client(base_url=s.base_url, timeout=30) as c:
            rejected = 0
            while True:   # 32 clients, 4 slots: a 429 is the pool saying "retry", as clients do
                r = c.post("/v1/messages", content=body, headers={"content-type": "application/json"})
                if r.status_code != 429 or rejected >= 200:
                    return text, body, r, rejected
                rejected += 1
                time.sleep(0.01)

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(one, texts))
    input_tokens = {}
    for text, body, r, _ in results:
        assert r.status_code == 200, r.text
        assert r.headers["x-zccp-context-id"] == hashlib.sha256(body).digest()[:8].hex()
        input_tokens[text] = json.loads(r.text)["usage"]["input_tokens"]
    assert len(input_tokens) == len(texts)          # every request got its own answer
    assert sum(rej for *_, rej in results) > 0      # and the pool really was contended
    # input_tokens = len(text) + a constant number of markers, for every answer.
    offsets = {n - len(t) for t, n in input_tokens.items()}
    assert len(offsets) == 1, offsets
    s.assert_no_leaks()


def test_arena_and_socket_are_private_and_removed_on_shutdown(make_stack):
    import os
    import stat

    s = make_stack({"model": {"backend": "null"}})
    shm_path = "/dev/shm/" + s.cfg.shared_memory.name.lstrip("/")
    sock = s.cfg.server.socket_path
    # Only the engine's user, and as root also the workers' group (they run unprivileged).
    mode = 0o660 if os.geteuid() == 0 else 0o600
    for p in (shm_path, sock, sock + ".metrics"):
        assert stat.S_IMODE(os.stat(p).st_mode) == mode, p
    s.stop_engine()
    assert not os.path.exists(shm_path)
    assert not os.path.exists(sock) and not os.path.exists(sock + ".metrics")


def test_a_group_makes_them_0660(make_stack):
    import grp
    import os
    import stat

    group = grp.getgrgid(os.getgid()).gr_name
    s = make_stack({"model": {"backend": "null"}, "shared_memory": {"group": group}})
    shm_path = "/dev/shm/" + s.cfg.shared_memory.name.lstrip("/")
    for p in (shm_path, s.cfg.server.socket_path):
        st = os.stat(p)
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == os.getgid()
    assert s.client().post("/v1/messages", json=anthropic_body()).status_code == 200
