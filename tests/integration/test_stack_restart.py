"""`zccp-stack`'s restarts (and `zccp-engine --warm-standby`'s): an engine that had served
comes back at once (its warm standby takes over), however often; one that dies before it
serves waits longer each time; a standby is there again after each takeover."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from tests.support.harness import REPO, Stack, StackProcess, alive, anthropic_body
from zccp.ops.stack import nginx_service


def _wait_for(cond, what: str, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.1)


def _engines(sp: StackProcess) -> tuple[int, int | None]:
    """(the serving engine: the admin /health's, a standby: zccp-stack's other engine child)."""
    serving = sp.stack.health()["engine_pid"]
    kids = Path(f"/proc/{sp.proc.pid}/task/{sp.proc.pid}/children").read_text().split()
    spare = [int(p) for p in kids if int(p) != serving and b"--standby" in Path(f"/proc/{p}/cmdline").read_bytes()]
    return serving, spare[0] if spare else None


def _standby_ready(sp: StackProcess) -> bool:
    """A standby whose imports are done (it says so in the engine's log)."""
    spare = _engines(sp)[1]
    return spare is not None and f"standby ready (pid {spare})" in sp.stack.engine_log()


def _answers(sp: StackProcess) -> bool:
    try:
        r = httpx.post(sp.stack.url("/v1/messages"), json=anthropic_body("back?", max_tokens=4), timeout=10)
    except httpx.HTTPError:
        return False
    return r.status_code == 200


def test_an_engine_that_served_restarts_at_once_and_one_that_cannot_start_backs_off(tmp_path):
    sp = StackProcess(Stack(tmp_path / "s", {"model": {"backend": "null"}}))
    try:
        sp.start()
        for round_ in range(2):     # twice: the delay does not grow after an engine that served
            _wait_for(lambda: _standby_ready(sp), "no standby engine ready")
            serving, spare = _engines(sp)
            os.kill(serving, signal.SIGKILL)
            _wait_for(lambda: _answers(sp), "the engine did not come back")
            assert _engines(sp)[0] == spare                 # the standby took over
            assert sp.text().count("its standby takes over in 0.0 s") == round_ + 1, sp.text()
        # A config the engine refuses: each restart dies before it serves, and waits longer.
        _wait_for(lambda: _standby_ready(sp), "no standby engine ready")   # it read the good config
        good = sp.stack.config_path.read_text()
        raw = yaml.safe_load(good)
        raw["model"]["backend"] = "nonesuch"
        sp.stack.config_path.write_text(yaml.safe_dump(raw))
        os.kill(_engines(sp)[0], signal.SIGKILL)
        _wait_for(lambda: "restarting it in 1.0 s" in sp.text(), "the backoff did not grow")
        assert sp.text().count("its standby takes over in 0.0 s") == 3   # it had served: at once
        assert "exited (exit status 2)" in sp.text() and "restarting it in 0.5 s" in sp.text()
        sp.stack.config_path.write_text(good)
        _wait_for(lambda: _answers(sp), "the engine did not come back with a good config")
        # served again: the next crash restarts at once again
        serving = _engines(sp)[0]
        _wait_for(lambda: _standby_ready(sp), "no standby engine ready")
        os.kill(serving, signal.SIGKILL)
        _wait_for(lambda: _answers(sp) and _engines(sp)[0] != serving, "the engine did not come back")
        assert sp.text().count("its standby takes over in 0.0 s") == 4, sp.text()
    finally:
        sp.stop()


def test_zccp_engine_warm_standby_keeps_the_engine_up_with_its_output_inherited(tmp_path):
    """`zccp-engine --warm-standby` (systemd's and compose's command, no zccp-stack): the
    engine and its standby are its children, their output is its own (here one file, as a
    journal would take it), a kill -9 of the serving engine is answered by the standby, the
    parent stays, and SIGTERM stops all three."""
    s = Stack(tmp_path / "s", {"model": {"backend": "null"}})
    out = open(tmp_path / "engine-and-children.out", "wb")
    parent = subprocess.Popen([sys.executable, "-m", "zccp.ops.cli", "engine", "--config", str(s.config_path),
                               "--run-dir", str(s.run_dir), "--warm-standby"], stdout=out, stderr=subprocess.STDOUT,
                              env=dict(os.environ, PYTHONPATH=str(REPO / "engine")))
    text = (tmp_path / "engine-and-children.out").read_text
    try:
        s.nginx, _ = nginx_service(s.cfg, s.run_dir)

        def kids() -> list[int]:
            return [int(p) for p in Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()]

        for _ in range(2):
            _wait_for(lambda: len(kids()) == 2 and any(f"standby ready (pid {k})" in text() for k in kids()),
                      "no standby beside the engine")
            serving = s.health()["engine_pid"]
            spare = next(k for k in kids() if k != serving)
            os.kill(serving, signal.SIGKILL)
            _wait_for(lambda spare=spare: s.health().get("engine_pid") == spare, "the standby did not take over")
            assert httpx.post(s.url("/v1/messages"), json=anthropic_body("back?", max_tokens=4),
                              timeout=10).status_code == 200
            assert parent.poll() is None
        assert text().count("its standby takes over in 0.0 s") == 2
        assert '"engine serving' in text()     # the children's own log lines, through the parent's output
        children = kids()
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(30) == 0
        assert not any(alive(k) for k in children)
    finally:
        if parent.poll() is None:
            parent.kill()
        out.close()
        s.stop()
