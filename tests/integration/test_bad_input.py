"""Bad input through nginx: a clear API-shaped error, never a 5xx, never a leaked slot."""

from __future__ import annotations

import pytest

from harness import anthropic_body, dumps

JSON = {"content-type": "application/json"}


def _assert_anthropic_error(r, status: int, kind: str, mentions: str | None = None) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == kind
    if mentions:
        assert mentions in body["error"]["message"], body["error"]["message"]


BAD_BODIES = [
    pytest.param(b"", 400, "invalid_request_error", "empty", id="empty"),
    pytest.param(b"{not json", 400, "invalid_request_error", None, id="not-json"),
    pytest.param(b"[1, 2]", 400, "invalid_request_error", None, id="array-top-level"),
    pytest.param(b'"text"', 400, "invalid_request_error", None, id="string-top-level"),
    pytest.param(dumps({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}), 400,
                 "invalid_request_error", "model", id="missing-model"),
    pytest.param(dumps({"model": 7, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}), 400,
                 "invalid_request_error", "model", id="model-not-string"),
    pytest.param(dumps({"model": "zccp-tiny", "messages": [{"role": "user", "content": "x"}]}), 400,
                 "invalid_request_error", "max_tokens", id="missing-max-tokens"),
    pytest.param(dumps({"model": "zccp-tiny", "max_tokens": "5", "messages": [{"role": "user", "content": "x"}]}),
                 400, "invalid_request_error", "max_tokens", id="max-tokens-string"),
    pytest.param(dumps({"model": "zccp-tiny", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}),
                 400, "invalid_request_error", "max_tokens", id="max-tokens-zero"),
    pytest.param(dumps({"model": "zccp-tiny", "max_tokens": 10**9, "messages": [{"role": "user", "content": "x"}]}),
                 400, "invalid_request_error", "max_tokens", id="max-tokens-over-cap"),
    pytest.param(dumps({"model": "zccp-tiny", "max_tokens": 5}), 400, "invalid_request_error", "messages",
                 id="missing-messages"),
    pytest.param(dumps({"model": "zccp-tiny", "max_tokens": 5, "messages": {"role": "user"}}), 400,
                 "invalid_request_error", "messages", id="messages-not-list"),
    pytest.param(dumps({"model": "zccp-tiny", "max_tokens": 5, "messages": []}), 400,
                 "invalid_request_error", "messages", id="messages-empty"),
    pytest.param(dumps({"model": "zccp-tiny", "max_tokens": 5, "messages": [{"role": "wizard", "content": "x"}]}),
                 400, "invalid_request_error", "role", id="unknown-role"),
    pytest.param(dumps({"model": "zccp-tiny", "max_tokens": 5, "messages": [{"role": "user", "content": 3}]}),
                 400, "invalid_request_error", "content", id="content-not-text"),
    pytest.param(dumps({"model": "no-such-model", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}),
                 404, "not_found_error", "no-such-model", id="unknown-model"),
]


@pytest.mark.parametrize("body,status,kind,mentions", BAD_BODIES)
def test_bad_body_gets_a_clear_error(null_stack, body, status, kind, mentions):
    r = null_stack.client().post("/v1/messages", content=body, headers=JSON)
    _assert_anthropic_error(r, status, kind, mentions)
    null_stack.assert_no_leaks()


def test_body_over_the_limit_is_413(null_stack):
    big = anthropic_body("x" * (null_stack.cfg.limits.max_body_kb * 1024))
    r = null_stack.client().post("/v1/messages", content=dumps(big), headers=JSON)
    _assert_anthropic_error(r, 413, "request_too_large")
    null_stack.assert_no_leaks()


def test_chunked_body_over_the_limit_is_413(null_stack):
    payload = dumps(anthropic_body("y" * (null_stack.cfg.limits.max_body_kb * 1024)))

    def chunks():
        for i in range(0, len(payload), 65536):
            yield payload[i : i + 65536]

    r = null_stack.client().post("/v1/messages", content=chunks(), headers=JSON)
    assert r.status_code == 413
    null_stack.assert_no_leaks()


def test_prompt_longer_than_the_model_context_is_400(stack):
    n = stack.cfg.model.max_context
    r = stack.client().post("/v1/messages", json=anthropic_body("z" * n, max_tokens=16))
    _assert_anthropic_error(r, 400, "invalid_request_error", "too long")
    stack.assert_no_leaks()


def test_prompt_larger_than_the_slot_token_array_is_413(null_stack):
    tokens_cap = null_stack.cfg.shared_memory.tokens_kb * 1024 // 4
    r = null_stack.client().post("/v1/messages", json=anthropic_body("t" * (tokens_cap + 10)))
    _assert_anthropic_error(r, 413, "request_too_large", "tokens")
    null_stack.assert_no_leaks()


def test_wrong_method_and_content_type(null_stack):
    c = null_stack.client()
    r = c.get("/v1/messages")
    _assert_anthropic_error(r, 405, "invalid_request_error", "POST")
    assert r.headers["allow"] == "POST"
    r = c.post("/v1/messages", content=b"a=b", headers={"content-type": "application/x-www-form-urlencoded"})
    _assert_anthropic_error(r, 415, "invalid_request_error", "content-type")
    null_stack.assert_no_leaks()


def test_openai_route_answers_in_openai_shape(null_stack):
    r = null_stack.client().post("/v1/chat/completions", content=b"{oops", headers=JSON)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    null_stack.assert_no_leaks()
