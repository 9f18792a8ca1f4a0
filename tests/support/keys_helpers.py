"""Helpers of the key and limit tests: `zccp-keys` of this worktree, and a request with headers."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx

from tests.support.cache_requests import ENGINE_ENV, PATHS


def keys_cli(s, *args: str) -> dict | list:
    """`zccp-keys ARGS --config <the stack's> --json` (this worktree's code), parsed."""
    out = subprocess.run([sys.executable, "-m", "zccp.ops.keys_cli", *args, "--config", str(s.config_path), "--json"],
                         capture_output=True, text=True, timeout=60, env=ENGINE_ENV)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def status(s, api, body, **headers) -> httpx.Response:
    """POST without asserting the status (x_api_key= -> x-api-key: ...)."""
    return s.client().post(PATHS[api], json=body, headers={k.replace("_", "-"): v for k, v in headers.items()})
