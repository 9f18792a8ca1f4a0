"""usage.jsonl under load (docs/keys.md, "Usage"): both nginx workers append to one file
(O_APPEND, unbuffered); each flush is one write(2), so no worker's line lands between
another's line and its newline: every line is one JSON object, one per request."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.support.cache_requests import NULL, req
from tests.support.keys_helpers import keys_cli, status

AUTH = {"mode": "keys", "cache_ttl_s": 1, "negative_ttl_s": 1}


def test_every_usage_line_is_one_record_when_both_workers_write_at_once(make_stack):
    # slots for every request in flight (the harness's 8 would answer some 429)
    s = make_stack({"model": NULL, "auth": AUTH, "shared_memory": {"segment_count": 32}}, with_redis=True)
    k = keys_cli(s, "create", "--tenant", "lines", "--rpm", "100000")["key"]
    n = 400

    def one(i: int) -> int:
        body = req("anthropic", [{"role": "user", "content": f"question {i}"}], max_tokens=2)
        return status(s, "anthropic", body, x_api_key=k, cache_control="no-store").status_code

    with ThreadPoolExecutor(16) as ex:
        codes = list(ex.map(one, range(n)))
    assert codes == [200] * n
    path = Path(s.cfg.auth.usage_log)
    lines: list[str] = []
    for _ in range(200):   # the workers flush every 50 ms
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= n:
            break
        time.sleep(0.05)
    records = [json.loads(v) for v in lines]   # a line holding two records does not parse
    assert len(records) == n and all(r["tenant"] == "lines" for r in records), len(records)
    assert len({r["request_id"] for r in records}) == n
