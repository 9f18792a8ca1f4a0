"""HTTP/2 specifics that HTTP/1.1 has no counterpart for: many streams on one connection.
(Uploads that stop and streams reset mid-upload: test_body_stream; 413 and oversized
headers: test_bad_input; everything else runs over both protocols in its own module.)"""

from __future__ import annotations

import json

from tests.support.h2conn import H2Conn
from tests.support.harness import anthropic_body, dumps

REPLY = "".join(f"{i:05d} " for i in range(20000))   # 120 KB: more than a stream's 64 KiB window


def test_a_stream_that_stops_reading_does_not_hold_up_its_connection(make_stack):
    s = make_stack({"model": {"backend": "null", "null_reply": REPLY, "max_context": 200000},
                    "limits": {"max_tokens_cap": 200000, "request_timeout_ms": 5000,
                               "stream_stall_timeout_ms": 2000}}, tls=True)
    conn = H2Conn(s)
    try:
        stalled = conn.request("/v1/messages", dumps(anthropic_body("big", max_tokens=len(REPLY), stream=True)))
        # its first bytes arrive, then its window is spent and never given back
        while len(conn.streams[stalled]["body"]) < 32 * 1024:
            assert conn.pump(stalled=frozenset({stalled}))
        others = [conn.request("/v1/messages", dumps(anthropic_body(f"small {i}", max_tokens=8))) for i in range(3)]
        for sid in others:
            st = conn.streams[sid]
            while not st["ended"]:
                assert conn.pump(stalled=frozenset({stalled}))
            assert st["status"] == 200 and json.loads(st["body"])["type"] == "message", st
        assert not conn.streams[stalled]["ended"]          # still waiting for its window
        assert len(conn.streams[stalled]["body"]) < len(REPLY)
    finally:
        conn.close()
    # The stalled stream's slot comes back once its relay gives up on it: nginx does not wake
    # a relay blocked on that stream's window when the connection goes, but the wait is bounded
    # by limits.stream_stall_timeout_ms (send_timeout; issue 20). Its claim never lapses before.
    s.assert_no_leaks(timeout=15)


def test_a_stream_reset_mid_answer_frees_its_slot_and_spares_the_connection(make_stack):
    slow = {"backend": "null", "null_token_delay_ms": 20, "null_reply": "tick " * 200}
    s = make_stack({"model": slow}, tls=True)
    conn = H2Conn(s)
    try:
        sid = conn.request("/v1/messages", dumps(anthropic_body("long", max_tokens=1000, stream=True)))
        while b"content_block_delta" not in conn.streams[sid]["body"]:
            assert conn.pump()
        assert int(s.health()["slots_claimed"]) == 1
        conn.reset(sid)                                     # the client aborts this answer only
        s.assert_no_leaks(timeout=10)
        other = conn.request("/v1/messages", dumps(anthropic_body("after the reset", max_tokens=4)))
        st = conn.response(other)
        assert st["status"] == 200 and json.loads(st["body"])["type"] == "message", st
    finally:
        conn.close()
