"""The zccp_json log's context id on answers no engine gave (issue 31, item 11): a 503 once
the engine is gone still names the request's context (the first 8 bytes of the body's
SHA-256, what the engine would have given it), in X-ZCCP-Context-ID and so in the log's
context_id. Real nginx, a real engine (null backend), stopped mid-test."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

import pytest

from tests.support.harness import Stack


@pytest.fixture
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("logfields"), {"model": {"backend": "null", "name": "zccp-null"}})
    try:
        yield s.start()
    finally:
        s.stop()


def test_a_503_without_an_engine_carries_the_context_id(stack: Stack) -> None:
    body = json.dumps({"model": "zccp-null", "max_tokens": 8,
                       "messages": [{"role": "user", "content": "hello"}]}).encode()
    with stack.client() as c:
        ok = c.post("/v1/messages", content=body, headers={"content-type": "application/json"})
        assert ok.status_code == 200
        stack.stop_engine(crash=True)
        r = c.post("/v1/messages", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 503, r.text
    want = hashlib.sha256(body).hexdigest()[:16]
    assert ok.headers["x-zccp-context-id"] == want          # the engine's own rule
    assert r.headers.get("x-zccp-context-id") == want, r.headers
