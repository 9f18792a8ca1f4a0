"""`zccp-stack` itself: start-up failures, supervision (the engine comes back by itself),
signals, where its files and logs go, reloading the masks, who nginx's workers run as."""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.support.harness import REPO, Stack, StackProcess, alive, anthropic_body
from zccp.cache.mask_store import load_masks
from zccp.config.paths import lua_file
from zccp.config.plugins import BUILTIN

NULL = {"model": {"backend": "null"}}


@pytest.fixture
def stack_process(tmp_path):
    made: list[StackProcess] = []

    def make(overrides: dict | None = None, with_redis: bool = False, wait: bool = True) -> StackProcess:
        sp = StackProcess(Stack(tmp_path / f"sp{len(made)}", overrides or {}, with_redis))
        made.append(sp)
        return sp.start(wait=wait)

    try:
        yield make
    finally:
        for sp in made:
            sp.stop()


def health(s: Stack) -> dict:
    return s.health()          # the admin listener's: the public /health has no details


# -- start-up -----------------------------------------------------------------------------


def test_a_second_stack_on_a_busy_port_fails_with_the_cause(make_stack, tmp_path):
    first = make_stack(NULL, with_redis=True)
    epoch = first.arena().epoch
    # The very same config: same ports, same arena name, same socket.
    second = StackProcess(Stack(tmp_path / "second", NULL, with_redis=True))
    second.stack.config_path.write_text(first.config_path.read_text())
    try:
        second.start(wait=False)
        assert second.wait(60) != 0
        out = second.text()
        listen = first.cfg.server.listen
        assert f"server.listen {listen}: Address already in use" in out, out
        assert "ZCCP is up" not in out
    finally:
        second.stop()
    # The first stack is untouched: same engine, same arena, still answering.
    assert first.arena().epoch == epoch
    assert first.client().post("/v1/messages", json=anthropic_body()).status_code == 200


def test_a_busy_redis_port_is_named(make_stack, tmp_path):
    s = Stack(tmp_path / "s", NULL, with_redis=True)
    sp = StackProcess(s)
    port = int(s.cfg.cache.redis_url.rsplit(":", 1)[1].split("/")[0])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        try:
            sp.start(wait=False)
            assert sp.wait(60) == 1
        finally:
            sp.stop()
    assert f"cache.redis_url 127.0.0.1:{port}: Address already in use" in sp.text()


def test_an_arena_that_does_not_fit_dev_shm_is_named_not_a_bus_error(tmp_path):
    if os.geteuid() != 0 or subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs a private mount namespace (root + unshare) to give /dev/shm 64 MiB")
    s = Stack(tmp_path / "s", {"model": {"backend": "null"},
                               "shared_memory": {"segment_count": 128, "segment_size_kb": 1024}})
    engine = (f"mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {sys.executable} -m zccp.ops.cli engine "
              f"--config {s.config_path} --run-dir {s.run_dir}")
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", engine],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(REPO / "engine")))
    assert out.returncode == 1, out.stderr       # not 135 (SIGBUS)
    assert "needs 128.0 MiB" in out.stderr and "64.0 MiB" in out.stderr, out.stderr
    assert "shared_memory.segment_count" in out.stderr and "shm_size" in out.stderr


# -- the engine comes back by itself ---------------------------------------------------------


def test_the_stack_restarts_a_dead_engine_and_nginx_carries_on(stack_process):
    sp = stack_process({"model": {"backend": "null", "null_token_delay_ms": 20, "null_reply": "slow " * 100},
                        "shared_memory": {"segment_count": 4}})
    s = sp.stack
    before = health(s)
    nginx_master = int((s.run_dir / "nginx" / "nginx.pid").read_text())

    streaming = threading.Event()

    def in_flight(stream: bool) -> tuple[int, str, float]:
        body = anthropic_body("in flight", max_tokens=400, stream=stream)
        with httpx.Client(base_url=s.base_url, timeout=30) as c, c.stream("POST", "/v1/messages", json=body) as r:
            chunks = []
            for chunk in r.iter_text():
                chunks.append(chunk)
                streaming.set()
            return r.status_code, "".join(chunks), time.monotonic()

    with ThreadPoolExecutor(2) as pool:
        streamed = pool.submit(in_flight, True)
        assert streaming.wait(20), "the stream did not start"
        plain = pool.submit(in_flight, False)
        end = time.monotonic() + 20
        while health(s)["slots_busy"] < 2:      # the plain one is being answered too
            assert time.monotonic() < end
            time.sleep(0.05)
        # New requests at once: an API-shaped 503 with Retry-After, until the engine is back.
        # The supervisor is stopped meanwhile until one says "engine not running": its warm
        # standby takes over in ~0.1 s, which a loaded machine's first request could miss.
        # (A request that rang on a pooled doorbell connection of the dead engine says it
        # failed instead.)
        down: list[str] = []

        def down_answer() -> bool:
            r = httpx.post(s.url("/v1/messages"), json=anthropic_body("while down", max_tokens=4), timeout=30)
            if r.status_code == 200:
                return False
            assert r.status_code == 503, r.text
            assert r.json()["error"]["type"] == "overloaded_error" and r.headers["retry-after"] == "1"
            down.append(r.json()["error"]["message"])
            assert time.monotonic() < killed_at + 120, "the engine did not come back"
            return True

        os.kill(sp.proc.pid, signal.SIGSTOP)
        try:
            killed_at = time.monotonic()
            os.kill(before["engine_pid"], signal.SIGKILL)
            while not any(m.startswith("engine not running") for m in down):
                assert down_answer(), "served while the engine was dead and its supervisor stopped"
                time.sleep(0.05)
        finally:
            os.kill(sp.proc.pid, signal.SIGCONT)
        while down_answer():
            time.sleep(0.05)
        # Requests in flight ended with an API-shaped error, within a second (+ a margin).
        status, text, ended = plain.result(30)
        assert status == 503 and json.loads(text)["type"] == "error", text
        assert ended - killed_at < 1.0 + 4.0
        status, text, ended = streamed.result(30)
        assert status == 200 and text.rstrip().splitlines()[-1].startswith("data:")
        assert "event: error" in text and "overloaded_error" in text.split("event: error", 1)[1]
        assert ended - killed_at < 1.0 + 4.0
    after = health(s)
    assert after["engine_pid"] != before["engine_pid"] and after["epoch"] != before["epoch"]
    assert int((s.run_dir / "nginx" / "nginx.pid").read_text()) == nginx_master and alive(nginx_master)
    assert after["slots_claimed"] == 0 and after["slots_busy"] == 0
    assert "engine exited (killed by SIGKILL)" in sp.text() and "engine serving again" in sp.text()


def test_sigkill_of_zccp_stack_takes_its_children(stack_process):
    sp = stack_process(NULL, with_redis=True)
    children = sp.descendants()
    engine_pid = health(sp.stack)["engine_pid"]
    assert engine_pid in children and len(children) >= 4     # redis, engine, nginx master + workers
    os.kill(sp.proc.pid, signal.SIGKILL)
    sp.wait(10)
    end = time.monotonic() + 30
    while [p for p in children if alive(p)] and time.monotonic() < end:
        time.sleep(0.1)
    assert not [p for p in children if alive(p)]
    # The engine was told (SIGTERM), not killed: it removed its arena and socket.
    assert not Path("/dev/shm/" + sp.stack.cfg.shared_memory.name.lstrip("/")).exists()
    assert not Path(sp.stack.cfg.server.socket_path).exists()


def test_a_dead_redis_stops_the_stack_with_a_nonzero_status(stack_process):
    sp = stack_process(NULL, with_redis=True)
    redis_pids = [p for p in sp.descendants() if "redis-server" in Path(f"/proc/{p}/cmdline").read_text()]
    os.kill(redis_pids[0], signal.SIGKILL)
    assert sp.wait(60) == 1
    assert "redis exited (killed by SIGKILL); stopping the rest" in sp.text()


# -- files, logs, health ------------------------------------------------------------------------


def test_logs_are_in_one_place(stack_process):
    sp = stack_process(NULL, with_redis=True)
    s = sp.stack
    r = httpx.post(s.url("/v1/messages"), json=anthropic_body("log me"), headers={"X-Request-ID": "log-me-1"},
                   timeout=30)
    assert r.status_code == 200
    sp.stop()
    logs = s.run_dir / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["engine.log", "nginx-access.log", "nginx-error.log",
                                                       "redis.log"]
    assert "log-me-1" in (logs / "nginx-access.log").read_text()
    assert "log-me-1" in (logs / "engine.log").read_text()
    assert not (s.run_dir / "nginx" / "logs").exists()
    assert "logs in " + str(logs) in sp.text()


def test_a_stopped_stack_leaves_no_socket_directory(make_stack):
    s = make_stack(NULL)
    assert s.socket_dir.is_dir()
    s.stop()
    assert not s.socket_dir.exists()


def test_health_says_when_the_engine_is_not_running(make_stack):
    s = make_stack(NULL)
    s.stop_engine()                                  # stopped: no arena at all
    h = s.admin_client().get("/health")
    assert h.status_code == 503 and h.json()["reason"].startswith("engine not running"), h.text
    s.start_engine()
    s.wait_healthy()
    s.stop_engine(crash=True)                        # killed: a stale arena, nobody on the doorbell
    h = s.admin_client().get("/health")
    assert h.status_code == 503 and h.json()["reason"].startswith("engine not running"), h.text


@pytest.mark.skipif(os.geteuid() != 0, reason="nginx drops privileges only when started as root")
def test_as_root_nginx_workers_run_unprivileged(make_stack):
    s = make_stack(NULL)
    master = int((s.run_dir / "nginx" / "nginx.pid").read_text())
    workers = [int(p) for p in Path(f"/proc/{master}/task/{master}/children").read_text().split()]
    user = pwd.getpwnam("www-data")
    group = s.cfg.shared_memory.group
    import grp

    gid = grp.getgrnam(group).gr_gid
    assert workers
    for pid in workers:
        status = Path(f"/proc/{pid}/status").read_text()
        uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
        gids = next(line for line in status.splitlines() if line.startswith("Gid:")).split()[1:]
        assert {int(u) for u in uids} == {user.pw_uid} and {int(g) for g in gids} == {gid}
    for p in ("/dev/shm/" + s.cfg.shared_memory.name.lstrip("/"), s.cfg.server.socket_path):
        st = os.stat(p)
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == gid, p
    assert s.client().post("/v1/messages", json=anthropic_body()).status_code == 200


# -- reloading the masks ---------------------------------------------------------------------------

TICKET_MASK = '''    { name = "ticket", pattern = [[TCK-\\d+]], replacement = "TCK-#" },
'''


def test_reload_switches_nginx_and_the_engine_together(make_stack, tmp_path):
    masks = tmp_path / "mask_patterns.lua"
    masks.write_text(lua_file("mask_patterns.lua").read_text())
    s = make_stack({"model": {"backend": "null", "max_context": 200000},
                    "shared_memory": {"tokens_kb": 512},
                    "cache": {"mask_patterns": str(masks)}}, with_redis=True)
    filler = " ".join(f"word{i}" for i in range(12000))        # > 64 KiB: the engine fingerprints it
    assert len(filler) > 64 * 1024

    def cache(ticket: str, large: bool) -> str:
        text = f"Close ticket TCK-{ticket} please. " + (filler if large else "")
        r = httpx.post(s.url("/v1/messages"), json=anthropic_body(text, max_tokens=8), timeout=30)
        assert r.status_code == 200, r.text
        return r.headers["x-zccp-cache"]

    def pair(a: str, b: str, large: bool) -> str:
        assert cache(a, large) == "MISS"
        return cache(b, large)

    assert pair("1001", "1002", large=False) == "MISS" and pair("1001", "1002", large=True) == "MISS"
    # Edit the file: nothing changes until the reload, on either side (before this fix the
    # engine picked the file up by itself and disagreed with nginx for large bodies).
    src = masks.read_text()
    masks.write_text(src.replace("return {\n", "return {\n" + TICKET_MASK, 1))
    time.sleep(1.5)
    assert pair("2001", "2002", large=False) == "MISS" and pair("2001", "2002", large=True) == "MISS"

    out = subprocess.run([sys.executable, "-m", "zccp.ops.cli", "stack", "reload", "--config", str(s.config_path),
                          "--run-dir", str(s.run_dir)], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(REPO / "engine")))
    assert out.returncode == 0, out.stdout + out.stderr
    expected = load_masks(masks)
    assert "ticket" in expected.names
    assert f"{len(expected)} mask pattern(s) in force, digest {expected.digest[:16]}" in out.stdout
    # Lua's digest == Python's. An old worker may still answer a request or two while it
    # winds down after the reload (graceful), so read until a new one answers, bounded.
    end = time.monotonic() + 10
    while health(s)["masks"]["digest"] != expected.digest and time.monotonic() < end:
        time.sleep(0.1)
    assert health(s)["masks"]["digest"] == expected.digest
    assert pair("3001", "3002", large=False) == "HIT" and pair("3001", "3002", large=True) == "HIT"
    assert "now in force: nginx (re)loaded" in s.engine_log()


def test_reload_reports_a_broken_pattern_and_keeps_the_rest(make_stack, tmp_path):
    masks = tmp_path / "mask_patterns.lua"
    masks.write_text(lua_file("mask_patterns.lua").read_text())
    s = make_stack({"model": {"backend": "null"}, "cache": {"mask_patterns": str(masks)}}, with_redis=True)
    digest = health(s)["masks"]["digest"]
    masks.write_text(masks.read_text().replace("return {\n", 'return {\n    { name = "bad", pattern = "([" },\n', 1))
    out = subprocess.run([sys.executable, "-m", "zccp.ops.cli", "stack", "reload", "--config", str(s.config_path),
                          "--run-dir", str(s.run_dir)], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(REPO / "engine")))
    # refused by file and line before the reload (zccp-nginx check): nginx not reloaded
    line = masks.read_text().splitlines().index('    { name = "bad", pattern = "([" },') + 1
    assert out.returncode == 1 and f'{masks}:{line}: pattern "bad": pcre_compile() failed' in out.stderr, \
        out.stdout + out.stderr
    assert "not reloaded" in out.stderr
    assert health(s)["masks"]["digest"] == digest                  # the set in force is unchanged
    assert s.client().post("/v1/messages", json=anthropic_body()).status_code == 200


def test_reload_refuses_a_plugin_that_does_not_load(make_stack, tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    good = 'local _M = { name = "mine" }\nfunction _M.prepare(r)\n    return nil\nend\nreturn _M\n'
    (plugins / "mine.lua").write_text(good)
    chain = [*BUILTIN, "mine"]
    s = make_stack({"model": {"backend": "null"}, "plugins": {"dir": str(plugins), "chain": chain}})
    # broken after the start (a plugin that never loaded refuses the start itself: docs/plugins.md)
    (plugins / "mine.lua").write_text(good.replace("return nil\n", "return nil nil\n"))
    out = subprocess.run([sys.executable, "-m", "zccp.ops.cli", "stack", "reload", "--config", str(s.config_path),
                          "--run-dir", str(s.run_dir)], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(REPO / "engine")))
    assert out.returncode == 1 and f"{plugins / 'mine.lua'}:3: 'end' expected" in out.stderr, out.stdout + out.stderr
    assert "not reloaded" in out.stderr
    assert s.client().post("/v1/messages", json=anthropic_body()).status_code == 200


def test_reload_without_a_running_stack_says_so(tmp_path):
    s = Stack(tmp_path / "none", NULL)
    out = subprocess.run([sys.executable, "-m", "zccp.ops.cli", "stack", "reload", "--config", str(s.config_path),
                          "--run-dir", str(s.run_dir)], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(REPO / "engine")))
    assert out.returncode == 1 and "no running stack in" in out.stderr


# -- the request id ------------------------------------------------------------------------------


def test_request_ids_are_unique_carried_and_returned(make_stack):
    s = make_stack(NULL)
    with s.client() as c:
        body = anthropic_body("same body")
        a, b = c.post("/v1/messages", json=body), c.post("/v1/messages", json=body)
        assert a.headers["x-zccp-context-id"] == b.headers["x-zccp-context-id"]      # a digest of the body
        assert a.headers["x-request-id"] != b.headers["x-request-id"]                # one per request
        mine = c.post("/v1/messages", json=body, headers={"X-Request-ID": "caller-42"})
        assert mine.headers["x-request-id"] == "caller-42"
        for bad in ("x" * 65, "has space", "tab\there"):
            r = c.post("/v1/messages", json=body, headers={"X-Request-ID": bad})
            assert r.status_code == 200 and r.headers["x-request-id"] not in (bad, "")
            assert len(r.headers["x-request-id"]) == 32
        too_large = c.post("/v1/messages", content=b"x" * (s.cfg.limits.max_body_kb * 1024 + 1),
                           headers={"content-type": "application/json", "X-Request-ID": "big-1"})
        assert too_large.status_code == 413 and too_large.headers["x-request-id"] == "big-1"
    time.sleep(0.3)
    engine = [json.loads(line) for line in s.engine_log().splitlines() if '"request done"' in line]
    by_id = {e["request_id"]: e for e in engine}
    for r in (a, b, mine):
        e = by_id[r.headers["x-request-id"]]
        assert e["context_id"] == r.headers["x-zccp-context-id"] and e["status"] == 200
    access = [json.loads(line) for line in s.log("nginx-access.log").splitlines()]
    ids = {e["request_id"] for e in access}
    assert {"caller-42", "big-1", a.headers["x-request-id"], b.headers["x-request-id"]} <= ids


def test_made_request_ids_are_random_hex_and_the_logs_say_the_answered_one(make_stack):
    # Ids made for callers without one come from a per-worker pool of CSPRNG bytes
    # (zccp.core.request_id, 128 per draw): across several draws every id is 32 lowercase hex
    # digits, none repeats, and the access log and the engine log name the id answered.
    s = make_stack(NULL)
    with s.client() as c:
        answers = [c.post("/v1/messages", json=anthropic_body(f"id {i}")) for i in range(300)]
    ids = [r.headers["x-request-id"] for r in answers]
    assert all(r.status_code == 200 for r in answers)
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids), [i for i in ids if not re.fullmatch(r"[0-9a-f]{32}", i)]
    assert len(set(ids)) == len(ids)
    time.sleep(0.3)
    access = {json.loads(line)["request_id"] for line in s.log("nginx-access.log").splitlines()}
    engine = {json.loads(line)["request_id"] for line in s.engine_log().splitlines() if '"request done"' in line}
    assert set(ids) <= access and set(ids) <= engine


def test_access_log_duration_is_in_milliseconds(make_stack):
    s = make_stack({"model": {"backend": "null", "null_token_delay_ms": 20, "null_reply": "y" * 60}})
    r = s.client().post("/v1/messages", json=anthropic_body("slow", max_tokens=60),
                        headers={"X-Request-ID": "timed-1"})
    assert r.status_code == 200
    time.sleep(0.3)
    (line,) = [json.loads(x) for x in s.log("nginx-access.log").splitlines() if "timed-1" in x]
    assert isinstance(line["duration_ms"], int)
    assert line["duration_ms"] >= 60 * 20 * 0.9       # 60 tokens x 20 ms: over a second, in ms


# -- metrics ---------------------------------------------------------------------------------------


def test_nginx_own_413_is_counted_and_zero_counters_have_samples(make_stack):
    s = make_stack(NULL)
    text = s.admin_client().get("/metrics").text
    for sample in ('zccp_nginx_requests_total{api="anthropic",status="200"} 0',
                   "zccp_engine_cache_errors_total 0", "zccp_engine_sweeper_resets_total 0",
                   "zccp_engine_abandoned_total 0", 'zccp_engine_requests_total{api="openai",status="200"} 0'):
        assert sample in text, sample
    big = b"x" * (s.cfg.limits.max_body_kb * 1024 + 1)
    for path in ("/v1/messages", "/v1/chat/completions"):
        r = httpx.post(s.url(path), content=big, headers={"content-type": "application/json"}, timeout=30)
        assert r.status_code == 413
    text = s.admin_client().get("/metrics").text
    assert 'zccp_nginx_requests_total{api="anthropic",status="413"} 1' in text
    assert 'zccp_nginx_requests_total{api="openai",status="413"} 1' in text
