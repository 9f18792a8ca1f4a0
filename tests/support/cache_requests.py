"""Requests through a live gateway and the cache verdict they get (the X-ZCCP-Cache header),
shared by the cache tests; and the conversations they send."""

from __future__ import annotations

import os
import time

from tests.support.checkout import REPO

# For a subprocess of this checkout's tools (python -m zccp.ops.cli ...): its engine/, not the venv's install.
ENGINE_ENV = {**os.environ, "PYTHONPATH": str(REPO / "engine")}

PATHS = {"anthropic": "/v1/messages", "openai": "/v1/chat/completions"}
MODEL = "zccp-tiny"
NULL = {"backend": "null", "max_context": 200000}


def post(s, api, body, **headers):
    r = s.client().post(PATHS[api], json=body, headers={k.replace("_", "-"): v for k, v in headers.items()})
    assert r.status_code == 200, r.text
    return r


def cache_of(s, api, body, **headers) -> str:
    return post(s, api, body, **headers).headers["x-zccp-cache"]


def stored(s, api, body, **headers) -> None:
    """Send a request that must MISS, then wait until it is stored (the store follows the answer)."""
    assert cache_of(s, api, body, **headers) == "MISS"
    assert eventually(s, api, body, **headers) == "HIT", "the answer was never stored"


def eventually(s, api, body, **headers) -> str:
    """The first answer other than MISS within 2 s (a store lands just after its answer), else MISS."""
    for _ in range(100):
        got = cache_of(s, api, body, **headers)
        if got != "MISS":
            return got
        time.sleep(0.02)
    return "MISS"


def metric_samples(s, line_prefix: str) -> list[float]:
    """The values of every /metrics sample whose line starts with line_prefix."""
    return [float(line.rsplit(" ", 1)[1]) for line in s.admin_client().get("/metrics").text.splitlines()
            if line.startswith(line_prefix)]


def metric(s, name: str, **labels) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in s.admin_client().get("/metrics").text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def req(api, msgs, max_tokens=24, **extra):
    return {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "messages": msgs, **extra}


Q = ("Which river flows through that city, how long is it from its source to the sea, which other large "
     "cities does it pass on the way, and what role did it play in the history and trade of the region over "
     "the last few centuries before the railways arrived?")
CHAT = [{"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris is the capital of France."},
        {"role": "user", "content": Q}]


def reworded(q: str) -> list:
    return CHAT[:2] + [{"role": "user", "content": q}]


# the same question, asked more politely and spelled otherwise: a NEAR (docs/cache.md, "What a NEAR means")
REWORDED = reworded("Please, " + Q.upper().replace(",", "") + " Thanks!")
