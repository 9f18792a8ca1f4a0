"""A conversation keeps its replica (docs/engines.md, "What keeps a conversation on one
replica"): Anthropic's recommended prompt caching (the breakpoint on the last block of the
last message, so it moves every turn), cached and no-store turns mixed, an OpenAI
conversation mixing streamed and whole turns under Cache-Control no-cache + no-store, and
/v1/responses. Real nginx, three real
engine replicas (the null backend, each with its own reply)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from tests.support.harness import Stack

REPLIES = {"r1": "one", "r2": "two", "r3": "three"}
NO_STORE = {"cache-control": "no-cache, no-store"}


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    cfg = {
        "model": {"backend": "null", "name": "zccp-null", "null_token_delay_ms": 1},
        "shared_memory": {"segment_count": 8},
        "engines": [{"name": n, "model": {"null_reply": t}} for n, t in REPLIES.items()],
    }
    s = Stack(tmp_path_factory.mktemp("affinity"), cfg)
    try:
        yield s.start()
    finally:
        s.stop()


def _engine(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return r.headers["x-zccp-engine"]


def _cached_turns(conv: int, n: int) -> list[dict]:
    """Anthropic's recommended pattern: system and tools cached, and the breakpoint on the last
    block of the last message (earlier turns lose theirs)."""
    bodies, msgs = [], []
    for t in range(n):
        if t:
            msgs = [*msgs, {"role": "assistant", "content": [{"type": "text", "text": f"answer {t}"}]}]
        msgs = [*msgs, {"role": "user", "content": [{"type": "text", "text": f"conv {conv} question {t}"}]}]
        last = [dict(m, content=[dict(b) for b in m["content"]]) for m in msgs]
        last[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
        bodies.append({"model": "zccp-null", "max_tokens": 8,
                       "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
                       "tools": [{"name": "get_time", "description": "time", "input_schema": {"type": "object"},
                                  "cache_control": {"type": "ephemeral"}}],
                       "messages": last})
    return bodies


def test_a_prompt_caching_conversation_keeps_its_replica(replicas: Stack) -> None:
    used: Counter[str] = Counter()
    with replicas.client() as c:
        for conv in range(16):
            seen = {_engine(c.post("/v1/messages", json=b)) for b in _cached_turns(conv, 4)}
            assert len(seen) == 1, (conv, seen)      # on main: the moving breakpoint moves it
            used.update(seen)
    assert len(used) >= 2                             # conversations still spread


def test_cached_and_no_store_turns_of_one_conversation_share_a_replica(replicas: Stack) -> None:
    """A no-store turn (nginx computes no keys) gets the same route key as a cached one."""
    with replicas.client() as c:
        for conv in range(12):
            seen = {_engine(c.post("/v1/messages", json=b, headers=NO_STORE if t % 2 else {}))
                    for t, b in enumerate(_cached_turns(100 + conv, 4))}
            assert len(seen) == 1, (conv, seen)


def test_a_mixed_streamed_and_whole_no_store_conversation_keeps_its_replica(replicas: Stack) -> None:
    with replicas.client() as c:
        for conv in range(12):
            msgs: list[dict] = [{"role": "system", "content": "You are terse."}]
            seen = set()
            for t in range(4):
                msgs = [*msgs, {"role": "user", "content": f"conv {conv} q {t}"}]
                stream = t % 2 == 1
                # the OpenAI SDK's order: "stream" early, before the messages
                body = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
                body |= {"messages": msgs, "model": "zccp-null", "max_tokens": 8}
                r = c.post("/v1/chat/completions", json=body, headers=NO_STORE)
                seen.add(_engine(r))
                msgs = [*msgs, {"role": "assistant", "content": f"answer {t}"}]
            assert len(seen) == 1, (conv, seen)


def test_a_responses_conversation_keeps_its_replica(replicas: Stack) -> None:
    used: Counter[str] = Counter()
    with replicas.client() as c:
        for conv in range(12):
            items: list[dict] = []
            seen = set()
            for t in range(3):
                items = [*items, {"role": "user", "content": f"conv {conv} q {t}"}]
                body = {"model": "zccp-null", "instructions": "Be terse.", "input": items,
                        "max_output_tokens": 16, "stream": t == 1}
                seen.add(_engine(c.post("/v1/responses", json=body)))
                items = [*items, {"role": "assistant", "content": f"answer {t}"}]
            assert len(seen) == 1, (conv, seen)
            used.update(seen)
    assert len(used) >= 2
    replicas.assert_no_leaks()
