"""One request through the real nginx, shared memory and the real engine."""

from __future__ import annotations

import hashlib
import re
import socket

from tests.support.harness import anthropic_body, dumps
from zccp.transport.abi import NOTICE_SIZE, SLOT_MAGIC, ABI_VERSION, Op, State
from zccp.transport.doorbell import decode_notice, encode_ring


def test_round_trip_returns_an_anthropic_message(stack_any):
    stack = stack_any
    # Greedy: sampled, the model may legitimately answer with EOS at once (0 tokens).
    r = stack.client().post("/v1/messages", json=anthropic_body("Hello there", max_tokens=12, temperature=0))
    assert r.status_code == 200, r.text
    msg = r.json()
    assert msg["type"] == "message" and msg["role"] == "assistant"
    assert msg["model"] == "zccp-tiny"
    assert msg["id"].startswith("msg_")
    assert msg["content"][0]["type"] == "text"
    assert msg["stop_reason"] in ("end_turn", "max_tokens")
    assert 1 <= msg["usage"]["output_tokens"] <= 12
    assert msg["usage"]["input_tokens"] > len("Hello there")
    assert r.headers["content-type"].startswith("application/json")
    stack.assert_no_leaks()


def _find_slot(reader, context_id: str):
    matches = [s for s in reader.slots() if s.context_id == context_id]
    assert len(matches) == 1, f"context {context_id} in {len(matches)} slots"
    return matches[0]


def test_slot_holds_exactly_the_bytes_sent(null_stack_any):
    null_stack = null_stack_any
    body = dumps(anthropic_body("bytes check \u00e9\u4e2d", max_tokens=5)) + b"   "
    r = null_stack.client().post("/v1/messages", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.http_version == null_stack.protocol
    digest = hashlib.sha256(body).digest()
    assert r.headers["x-zccp-context-id"] == digest[:8].hex()
    reader = null_stack.arena()
    try:
        slot = _find_slot(reader, digest[:8].hex())
        assert slot.magic == SLOT_MAGIC and slot.version == ABI_VERSION
        assert slot.payload_len == len(body)
        assert reader.payload(slot.index) == body
        assert slot.sha256 == digest
        assert slot.state == State.FREE          # released after the response
        assert slot.status == 200
        assert slot.response_acked == slot.response_len > 0
    finally:
        reader.close()
    null_stack.assert_no_leaks()


def test_a_request_that_uses_no_cache_is_not_hashed(null_stack):
    # no-cache + no-store: no cache key needs the body's SHA-256, so nginx leaves the slot's
    # sha256 zero and gives the request a random context id: unique per request (the same
    # bytes twice get two ids), and still the one the engine saw.
    body = dumps(anthropic_body("no hash " * 64, max_tokens=5))
    headers = {"content-type": "application/json", "cache-control": "no-cache, no-store"}
    ids = []
    for _ in range(2):
        r = null_stack.client().post("/v1/messages", content=body, headers=headers)
        assert r.status_code == 200, r.text
        ids.append(r.headers["x-zccp-context-id"])
        reader = null_stack.arena()
        try:
            slot = _find_slot(reader, ids[-1])
            assert slot.sha256 == bytes(32)
            assert reader.payload(slot.index) == body
        finally:
            reader.close()
    digest = hashlib.sha256(body).digest()[:8].hex()
    assert ids[0] != ids[1] and digest not in ids
    assert all(re.fullmatch("[0-9a-f]{16}", i) for i in ids)
    # either header alone still uses a cache: the digest, as before
    r = null_stack.client().post("/v1/messages", content=body, headers=headers | {"cache-control": "no-store"})
    assert r.headers["x-zccp-context-id"] == digest
    null_stack.assert_no_leaks()


def test_the_random_context_ids_stay_unique_across_the_pool_refills(null_stack):
    # nginx cuts them from a pool of 128 ids per RAND_bytes in each worker: 300 requests
    # refill at least one worker's pool; not one id may come back
    headers = {"content-type": "application/json", "cache-control": "no-cache, no-store"}
    body = dumps(anthropic_body("pooled ids", max_tokens=2))
    ids = []
    with null_stack.client() as c:
        for _ in range(300):
            r = c.post("/v1/messages", content=body, headers=headers)
            assert r.status_code == 200, r.text
            ids.append(r.headers["x-zccp-context-id"])
    assert all(re.fullmatch("[0-9a-f]{16}", i) for i in ids)
    assert len(set(ids)) == len(ids)
    null_stack.assert_no_leaks()


def test_generation_bumps_on_every_claim(make_stack):
    s = make_stack({"shared_memory": {"segment_count": 1}, "model": {"backend": "null"}})
    reader = s.arena()
    try:
        before = reader.slot(0).generation
        with s.client() as c:
            for i in range(3):
                assert c.post("/v1/messages", json=anthropic_body(f"n{i}")).status_code == 200
        assert reader.slot(0).generation == before + 3
    finally:
        reader.close()
    s.assert_no_leaks()


def _raw_ring(socket_path: str, frame: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(socket_path)
        sock.sendall(frame)
        data = b""
        while len(data) < NOTICE_SIZE:
            chunk = sock.recv(NOTICE_SIZE - len(data))
            if not chunk:
                break
            data += chunk
        return data


def _notice(data: bytes):
    assert len(data) == NOTICE_SIZE
    return decode_notice(data)


def test_stale_ring_is_rejected_and_touches_nothing(null_stack):
    null_stack.client().post("/v1/messages", json=anthropic_body("warm"))
    reader = null_stack.arena()
    try:
        before = reader.slots()
        target = before[0]
        n = _notice(_raw_ring(null_stack.cfg.server.socket_path, encode_ring(Op.RING, 0, target.generation + 7)))
        assert n.op == Op.REJECT and n.status == 409 and n.final == 1
        # The current generation but a FREE slot (not READY) is refused too.
        n = _notice(_raw_ring(null_stack.cfg.server.socket_path, encode_ring(Op.RING, 0, target.generation)))
        assert n.op == Op.REJECT and n.status == 409
        # A slot index past the arena.
        n = _notice(_raw_ring(null_stack.cfg.server.socket_path, encode_ring(Op.RING, 10_000, 1)))
        assert n.op == Op.REJECT and n.status == 400
        assert reader.slots() == before
    finally:
        reader.close()
    # The engine is still serving after rejecting garbage.
    assert null_stack.client().post("/v1/messages", json=anthropic_body("after")).status_code == 200


def test_unknown_opcode_closes_only_that_connection(null_stack):
    data = _raw_ring(null_stack.cfg.server.socket_path, encode_ring(99, 0, 0))
    assert data == b""  # closed without a reply
    assert null_stack.client().post("/v1/messages", json=anthropic_body("still up")).status_code == 200


def test_health_reports_the_engine(stack):
    h = stack.health()
    assert h["status"] == "ok"
    assert h["slots"] == stack.cfg.shared_memory.segment_count
    assert h["engine_pid"] == stack.engine.proc.pid


def test_metrics_show_both_sides(null_stack):
    c = null_stack.client()
    before = null_stack.admin_client().get("/metrics").text
    assert c.post("/v1/messages", json=anthropic_body("count me")).status_code == 200
    assert c.post("/v1/messages", content=b"{", headers={"content-type": "application/json"}).status_code == 400
    text = null_stack.admin_client().get("/metrics").text
    assert "zccp_engine_up 1" in text

    def value(body: str, line_prefix: str) -> float:
        for line in body.splitlines():
            if line.startswith(line_prefix + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    ok = 'zccp_nginx_requests_total{api="anthropic",status="200"}'
    bad = 'zccp_nginx_requests_total{api="anthropic",status="400"}'
    assert value(text, ok) == value(before, ok) + 1
    assert value(text, bad) == value(before, bad) + 1
    eng = 'zccp_engine_requests_total{api="anthropic",status="200"}'
    assert value(text, eng) == value(before, eng) + 1
    assert value(text, "zccp_engine_rings_total") >= 2


def test_a_request_that_bypasses_the_cache_is_not_fingerprinted(null_stack):
    # no-cache + no-store: neither lookup nor store, so nginx computes no keys (less work);
    # either header alone still needs them.
    from zccp.transport.abi import Flag

    def flags_for(body: bytes, cc: str | None) -> int:
        headers = {"content-type": "application/json"} | ({"cache-control": cc} if cc else {})
        r = null_stack.client().post("/v1/messages", content=body, headers=headers)
        assert r.status_code == 200, r.text
        reader = null_stack.arena()
        try:
            return _find_slot(reader, r.headers["x-zccp-context-id"]).flags
        finally:
            reader.close()

    assert not flags_for(dumps(anthropic_body("bypass a")), "no-cache, no-store") & Flag.FP_VALID
    assert flags_for(dumps(anthropic_body("bypass b")), "no-cache") & Flag.FP_VALID
    assert flags_for(dumps(anthropic_body("bypass c")), None) & Flag.FP_VALID


def test_the_models_endpoints(null_stack_any):
    s = null_stack_any
    c = s.client()
    name = s.cfg.model.name
    listed = c.get("/v1/models")
    assert listed.status_code == 200 and [m["id"] for m in listed.json()["data"]] == [name], listed.text
    one = c.get(f"/v1/models/{name}")        # the includes' exact location
    assert one.status_code == 200 and one.json()["id"] == name, one.text
    for other in ("/v1/models/no-such-model", "/v1/models/bad!id"):   # the standalone's prefix location
        r = c.get(other)
        err = r.json()["error"]
        assert r.status_code == 404 and err["type"] in ("not_found_error", "invalid_request_error"), r.text
    s.assert_no_leaks()


def test_the_engine_runs_on_either_event_loop(make_stack, null_stack, monkeypatch):
    # the default stack's engine runs uvloop; ZCCP_EVENT_LOOP=asyncio the standard library's,
    # and both answer a whole and a streamed request
    assert "event loop: uvloop" in null_stack.engine_log()
    monkeypatch.setenv("ZCCP_EVENT_LOOP", "asyncio")
    s = make_stack({"model": {"backend": "null"}})
    assert "event loop: asyncio" in s.engine_log()
    c = s.client()
    r = c.post("/v1/messages", json=anthropic_body("which loop", max_tokens=5))
    assert r.status_code == 200 and r.json()["content"][0]["type"] == "text", r.text
    with c.stream("POST", "/v1/messages", json=anthropic_body("which loop", max_tokens=5, stream=True)) as sr:
        events = "".join(sr.iter_text())
    assert sr.status_code == 200 and "event: message_stop" in events
    s.assert_no_leaks()
