"""Nothing answers that was not meant to (issue 20): in the standalone server, an unknown
path is the API's own JSON 404, and no path is served from a document root."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("method, path", [
    ("POST", "/v1/nothing"),
    ("GET", "/"),
    ("GET", "/index.html"),
    ("GET", "/50x.html"),
    ("GET", "/config.yaml"),
    ("GET", "/../../etc/passwd"),
    ("PUT", "/v1/messages/batches"),
])
def test_an_unknown_path_is_the_apis_json_404(null_stack, method, path):
    with null_stack.client() as c:
        r = c.request(method, path, content=b"{}", headers={"Content-Type": "application/json"})
    assert r.status_code == 404, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    assert r.headers["x-request-id"]


def test_an_unknown_openai_path_is_openai_shaped(null_stack):
    with null_stack.client() as c:
        r = c.post("/v1/chat/nothing", json={})
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and "no such endpoint" in err["message"]


def test_the_known_paths_still_answer(null_stack):
    with null_stack.client() as c:
        assert c.get("/health").status_code == 200
        assert c.post("/v1/messages", json={"model": "zccp-tiny", "max_tokens": 4,
                                            "messages": [{"role": "user", "content": "hi"}]}).status_code == 200
        assert c.get("/v1/models").status_code == 200
