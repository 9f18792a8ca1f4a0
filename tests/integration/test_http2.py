"""HTTP/2 specifics that HTTP/1.1 has no counterpart for: many streams on one connection.
(Uploads that stop and streams reset mid-upload: test_body_stream; 413 and oversized
headers: test_bad_input; everything else runs over both protocols in its own module.)"""

from __future__ import annotations

import json

from tests.support.harness import H2Conn, anthropic_body, dumps

REPLY = "".join(f"{i:05d} " for i in range(20000))   # 120 KB: more than a stream's 64 KiB window


def test_a_stream_that_stops_reading_does_not_hold_up_its_connection(make_stack):
    s = make_stack({"model": {"backend": "null", "null_reply": REPLY, "max_context": 200000},
                    "limits": {"max_tokens_cap": 200000}}, tls=True)
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
    s.assert_no_leaks(timeout=30)   # the stalled stream's slot comes back once its connection is gone
