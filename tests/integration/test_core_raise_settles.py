"""A raise in the gateway's core after limits admitted the request is that request's 500 in the
API's shape, and the reservation is still settled. nginx's error_page used to answer it: its
redirect to @zccp_error_* starts over with an empty ngx.ctx, so the location's log phase never
saw the request and its concurrency slot stayed held until the lease ran out.

The raise is real: an operator's plugin that leaves r broken (its own phase succeeds; the
core trips over r.body_len later, outside any plugin's pcall)."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.cache_requests import NULL
from tests.support.harness import anthropic_body
from tests.support.keys_helpers import keys_cli
from zccp.config.plugins import BUILTIN

# route runs after limits (keys phase) admitted the request; the core compares body_len next
BREAKS_R = '''local _M = { name = "breaks_r" }
function _M.wants_body() return true end
function _M.route(r)
    if r.body and r.body:find("BREAK", 1, true) then
        r.body_len = "not a number"
    end
end
return _M
'''


def test_a_core_raise_after_admission_is_a_500_and_frees_the_concurrency_slot(make_stack, tmp_path: Path):
    d = tmp_path / "plugins"
    d.mkdir()
    (d / "breaks_r.lua").write_text(BREAKS_R)
    s = make_stack({"model": NULL, "auth": {"mode": "keys", "cache_ttl_s": 1, "negative_ttl_s": 1},
                    "plugins": {"chain": [*BUILTIN, "breaks_r"], "dir": str(d)}}, with_redis=True)
    key = keys_cli(s, "create", "--tenant", "broken", "--concurrency", "1")["key"]
    headers = {"x-api-key": key, "cache-control": "no-store"}
    with s.client() as c:
        for i in range(3):   # each would hold the one slot for good if it were not settled
            r = c.post("/v1/messages", json=anthropic_body("BREAK please"), headers=headers)
            assert r.status_code == 500, (i, r.text)
            assert r.json() == {"type": "error", "error": {"type": "api_error",
                                                           "message": "internal error in the gateway"}}
            assert r.headers["x-request-id"]
            assert admitted_again(c, headers), f"round {i}: the slot was never given back"
    assert "failed in the gateway" in s.error_log()


def admitted_again(c, headers: dict) -> bool:
    """A fine request is admitted once the concurrency count is given back: the limits plugin
    gives it back in its flush (within a second or two); a slot never settled stays held."""
    for _ in range(100):
        r = c.post("/v1/messages", json=anthropic_body("a fine request"), headers=headers)
        if r.status_code == 200:
            return True
        assert r.status_code == 429, r.text
        time.sleep(0.1)
    return False
