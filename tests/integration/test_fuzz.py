"""Issue 13, point 3: a hostile local writer (tests/support/hostile_writer.py) against the real engine,
bounded: random and edge values in slot headers, meta, signature and request blocks,
lengths and offsets, random/truncated/stale/out-of-range doorbell frames. The engine never
crashes, refuses with a counter, and serves normal traffic afterwards.
`python -m bench.faults.fuzz --seconds 300` runs the same for longer."""

from __future__ import annotations

import re

import pytest

from tests.support.harness import anthropic_body
from tests.support.hostile_writer import Fuzzer


def _rejects(stack) -> dict[str, int]:
    text = stack.admin_client().get("/metrics").text
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r'^zccp_engine_rejects_total\{status="(\d+)"\} (\d+)', text, re.M)}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_engine_survives_a_hostile_writer(make_stack, seed):
    s = make_stack({"model": {"backend": "null"}}, with_redis=True)
    pid = s.engine.proc.pid
    fz = Fuzzer(s.cfg.shared_memory.name, s.cfg.server.socket_path, seed)
    try:
        stats = fz.run(iterations=3000)
        assert s.engine.proc.poll() is None and s.engine.proc.pid == pid, "the engine died"
        assert fz.ping(), "the engine does not answer PING"
        fz.settle()
    finally:
        fz.close()
    assert stats.rings > 1000 and sum(stats.notices.values()) > 0
    rejects = _rejects(s)
    assert rejects.get("400", 0) > 0 and rejects.get("409", 0) > 0, rejects
    # normal traffic, both APIs, streamed and not, after the fuzzer has gone
    c = s.client()
    for k in range(5):
        r = c.post("/v1/messages", json=anthropic_body(f"after {k}", stream=bool(k % 2)))
        assert r.status_code == 200, r.text
        r = c.post("/v1/chat/completions", json={"model": "zccp-tiny", "max_tokens": 4,
                                                 "messages": [{"role": "user", "content": f"after {k}"}]})
        assert r.status_code == 200, r.text
    assert s.engine.proc.pid == pid and "Traceback" not in s.engine_log()
    s.assert_no_leaks()
