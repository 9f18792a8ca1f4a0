"""auth.keys_file (one host's keys in a file, hashes only) through the real nginx: a key
`zccp-keys create --keys-file` listed is accepted with its tenant and limits, the file holds
no secret, `zccp-keys hash` makes the hash it lists, and an unlisted key is refused."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

from tests.support.cache_requests import ENGINE_ENV, NULL, req
from tests.support.keys_helpers import status


def cli(*args: str, stdin: str | None = None) -> str:
    out = subprocess.run([sys.executable, "-m", "zccp.ops.keys_cli", *args], capture_output=True, text=True,
                         timeout=60, env=ENGINE_ENV, input=stdin)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_keys_file_lists_hashes_and_its_keys_work_with_their_limits(make_stack, tmp_path: Path):
    path = tmp_path / "keys.json"
    made = json.loads(cli("create", "--keys-file", str(path), "--tenant", "solo", "--rpm", "2", "--json"))
    other = json.loads(cli("create", "--keys-file", str(path), "--tenant", "solo", "--json"))
    text = path.read_text()
    assert made["key"] not in text and other["key"] not in text          # hashes only
    digest = cli("hash", stdin=made["key"] + "\n").strip()
    assert digest == hashlib.sha256(made["key"].encode()).hexdigest()
    assert {k["sha256"] for k in json.loads(text)["keys"]} >= {digest}
    if time.time() % 60 > 45:
        time.sleep(61 - time.time() % 60)
    s = make_stack({"model": NULL, "auth": {"mode": "keys", "keys_file": str(path)}}, with_redis=True)
    body = req("anthropic", [{"role": "user", "content": "hi"}])
    codes = [status(s, "anthropic", body, x_api_key=made["key"], cache_control="no-store").status_code
             for _ in range(3)]
    assert codes == [200, 200, 429], codes                              # its limits, counted in Redis
    assert status(s, "anthropic", body, x_api_key=other["key"]).status_code == 200
    r = status(s, "anthropic", body, x_api_key="zk_not_listed_anywhere")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
