"""OpenAI Chat Completions `n` > 1 with `stream: true`, through the real stack (nginx + Lua,
the slot, the engine's batch scheduler, the tiny model): the choices stream interleaved,
each chunk with its choice's `index`, a role chunk and a finish chunk per choice, then one
usage chunk for the whole answer (stream_options.include_usage) and [DONE]; with the
official openai SDK and as raw SSE; a stream the client leaves frees its slot and is settled
with the tokens of every choice that nginx sent."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.support.cache_requests import NULL
from tests.support.harness import sdk_clients
from tests.support.keys_helpers import keys_cli

MODEL = "zccp-tiny"
USER = [{"role": "user", "content": "Tell me a story about a lighthouse"}]
# sampled, seeded: choice j samples with seed + j, so the streamed and whole answers agree
KW: dict[str, Any] = dict(model=MODEL, messages=USER, max_tokens=24, temperature=1.0, seed=21, n=3)


def _sse(text: str) -> list[Any]:
    """The data: payloads of an SSE body, JSON decoded ([DONE] as the string)."""
    out: list[Any] = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_n_choices_stream_interleaved_and_assemble_to_the_whole_answer(stack_any):
    stack = stack_any                                      # over HTTP/1.1 and over HTTP/2 + TLS
    _, oai = sdk_clients(stack)
    whole = oai.chat.completions.create(**KW)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert len({c.message.content for c in whole.choices}) > 1        # their own seeds: not one text thrice
    chunks = list(oai.chat.completions.create(stream=True, stream_options={"include_usage": True}, **KW))
    texts, reasons, roles = ["", "", ""], [[], [], []], [[], [], []]
    order: list[int] = []                                  # the choice of each text chunk, as they came
    for x in chunks:
        assert len(x.choices) <= 1
        for c in x.choices:
            if c.delta.role:
                roles[c.index].append(c.delta.role)
            if c.delta.content:
                texts[c.index] += c.delta.content
                order.append(c.index)
            if c.finish_reason:
                reasons[c.index].append(c.finish_reason)
    assert texts == [c.message.content for c in whole.choices]
    assert reasons == [[c.finish_reason] for c in whole.choices]
    assert roles == [["assistant"]] * 3
    assert order != sorted(order)                          # interleaved, not one choice after another
    assert len({x.id for x in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    (usage,) = [x.usage for x in chunks if x.usage]
    assert chunks[-1].choices == [] and chunks[-1].usage == usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        whole.usage.prompt_tokens, whole.usage.completion_tokens, whole.usage.total_tokens)
    # the prompt once; its full blocks were left by the whole answer's prefill and are read now
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens // 16 * 16
    assert whole.usage.completion_tokens == sum(len(t) for t in texts)   # the tiny model: a byte a token
    stack.assert_no_leaks()


def test_n_choices_stream_as_raw_sse(stack_any):
    """The bytes as OpenAI sends them: one choice per chunk, `usage: null` on every chunk when
    include_usage (and no usage member without it), a role chunk first and a finish chunk
    last per choice, the usage chunk with no choices, then [DONE]."""
    stack = stack_any
    body = {**KW, "n": 2, "stream": True, "stream_options": {"include_usage": True}}
    with stack.client() as c:
        r = c.post("/v1/chat/completions", json=body)
        plain = c.post("/v1/chat/completions", json={**KW, "n": 2, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
    events = _sse(r.text)
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == (
        usage["usage"]["prompt_tokens"] + usage["usage"]["completion_tokens"])
    seen: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    for ch in chunks:
        assert ch["object"] == "chat.completion.chunk" and ch["usage"] is None and ch["id"] == usage["id"]
        (choice,) = ch["choices"]
        seen[choice["index"]].append(choice)
    completion = 0
    for items in seen.values():
        assert items[0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
        assert [i["finish_reason"] for i in items[:-1]] == [None] * (len(items) - 1)
        assert items[-1]["finish_reason"] in ("stop", "length") and items[-1]["delta"] == {}
        completion += sum(len(i["delta"].get("content") or "") for i in items)
    assert usage["usage"]["completion_tokens"] == completion
    assert usage["usage"]["prompt_tokens"] == 1 + 1 + len(USER[0]["content"].encode()) + 1   # BOS USER .. ASSISTANT
    assert plain.status_code == 200
    assert all("usage" not in ch for ch in _sse(plain.text)[:-1])
    stack.assert_no_leaks()


def test_a_client_that_leaves_an_n_stream_frees_everything(stack):
    body = {**KW, "max_tokens": 400, "stream": True}
    with stack.client() as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                break                                      # the first text: leave
    stack.assert_no_leaks()


def test_a_cut_n_stream_is_settled_with_the_tokens_it_was_sent(make_stack):
    """Each choice's writes carry the output tokens of all choices so far (the committed
    mark): a key's usage for a stream left part way is what nginx sent, not 0 (before) nor
    the 2 x 300 the engine was allowed."""
    s = make_stack({"model": dict(NULL, null_token_delay_ms=20),
                    "auth": {"mode": "keys", "cache_ttl_s": 1, "negative_ttl_s": 1}}, with_redis=True)
    if time.time() % 60 > 45:                       # the minute's window: not across its end
        time.sleep(61 - time.time() % 60)
    k = keys_cli(s, "create", "--tenant", "ncut", "--otpm", "100000")["key"]
    body = {"model": MODEL, "messages": USER, "max_tokens": 300, "n": 2, "stream": True}
    read = 0
    with s.client() as c, c.stream("POST", "/v1/chat/completions", json=body,
                                   headers={"authorization": f"Bearer {k}"}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                read += 1
                if read == 30:
                    break
    log = Path(s.cfg.auth.usage_log)
    for _ in range(100):
        lines = [x for x in map(json.loads, log.read_text().splitlines()) if x["tenant"] == "ncut"] \
            if log.exists() else []
        if lines:
            break
        time.sleep(0.05)
    (line,) = lines
    # at least what the client read (a token a chunk, the null model), a socket buffer more at most
    assert read <= line["output_tokens"] <= read + 20, (read, line)
    s.assert_no_leaks()
