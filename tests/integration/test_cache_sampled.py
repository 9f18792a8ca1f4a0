"""Sampled requests and the cache (cache.sampled, X-ZCCP-Cache-Sampled; docs/cache.md
"Sampled requests") through the real nginx + engine + Redis. Both APIs default to
temperature 1: a call that names no temperature and no seed asks for a fresh sample."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.support.cache_requests import NULL, cache_of, post, stored
from tests.support.harness import Stack
from zccp.config import CacheConfig

PATHS = {"anthropic": "/v1/messages", "openai": "/v1/chat/completions"}


def body(api: str, text: str, **extra) -> dict:
    """The API's defaults: no temperature (1), no seed."""
    return {"model": "zccp-tiny", "max_tokens": 12, "messages": [{"role": "user", "content": text}], **extra}


@pytest.fixture(scope="module")
def off(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # the product's default, restored over the harness's "on"
    overrides = {"model": NULL, "cache": {"sampled": CacheConfig().sampled}}
    s = Stack(tmp_path_factory.mktemp("sampled_off"), overrides, True)
    try:
        yield s.start()
    finally:
        s.stop()


def test_the_default_is_off():
    assert CacheConfig().sampled == "off"


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_a_default_sampled_request_is_never_answered_from_the_cache(off, api):
    b = body(api, f"Write a haiku about the sea ({api})")
    for _ in range(3):
        r = post(off, api, b)
        assert r.headers["x-zccp-cache"] == "BYPASS"
        assert r.headers["x-zccp-cache-reason"] == "sampled"
    # temperature 1 written out is the same request
    assert cache_of(off, api, dict(b, temperature=1)) == "BYPASS"


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_deterministic_requests_are_cached(off, api):
    stored(off, api, body(api, f"Name the capital of Peru ({api})", temperature=0))
    if api == "openai":   # a seed fixes the sample: cached at any temperature
        stored(off, api, body(api, "Name the capital of Chile", temperature=0.8, seed=7))
        assert cache_of(off, api, body(api, "Name the capital of Chile", temperature=0.8, seed=8)) == "MISS"
    else:                 # top_k 1: one candidate token, deterministic
        stored(off, api, body(api, "Name the capital of Chile", top_k=1))


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_a_request_may_ask_for_its_sample_to_be_cached(off, api):
    b = body(api, f"Write a limerick about a cat ({api})")
    stored(off, api, b, x_zccp_cache_sampled="on")
    for _ in range(3):   # served by the engine only: under "off", nginx's L1 keeps no sample
        r = post(off, api, b, x_zccp_cache_sampled="ON")
        assert r.headers["x-zccp-cache"] == "HIT" and r.headers["x-zccp-cache-layer"] == "L2"
    # a request that does not ask still gets its own sample
    assert cache_of(off, api, b) == "BYPASS"
    assert cache_of(off, api, b, x_zccp_cache_sampled="off") == "BYPASS"


def test_store_keeps_samples_for_the_requests_that_ask(make_stack):
    s = make_stack({"model": NULL, "cache": {"sampled": "store"}}, with_redis=True)
    for api in ("anthropic", "openai"):
        b = body(api, f"Invent a name for a boat ({api})")
        r = post(s, api, b)
        assert r.headers["x-zccp-cache"] == "BYPASS" and r.headers["x-zccp-cache-reason"] == "sampled"
        got = "MISS"
        for _ in range(100):              # stored after the answer
            got = cache_of(s, api, b, x_zccp_cache_sampled="on")
            if got == "HIT":
                break
        assert got == "HIT"
        assert cache_of(s, api, b) == "BYPASS"
        assert cache_of(s, api, b, x_zccp_cache_sampled="off") == "BYPASS"


def test_on_caches_samples_everywhere_but_for_a_request_that_says_off(make_stack):
    s = make_stack({"model": NULL, "cache": {"sampled": "on"}}, with_redis=True)
    b = body("anthropic", "Tell me a story about a lighthouse")
    stored(s, "anthropic", b)
    r = post(s, "anthropic", b)
    assert r.headers["x-zccp-cache"] == "HIT" and r.headers["x-zccp-cache-layer"] == "L1"
    r = post(s, "anthropic", b, x_zccp_cache_sampled="off")      # nginx skips its L1, the engine the cache
    assert r.headers["x-zccp-cache"] == "BYPASS" and r.headers["x-zccp-cache-reason"] == "sampled"
