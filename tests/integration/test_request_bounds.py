"""Issue 28 (items 2, 4, request halves of 1, 3 and 5) through real nginx + engine (tiny model):
every hostile field is the API's 400 naming the field (on main several were 500s or a 429
that can never clear), the engine never restarts, and a well-behaved request beside them is
served. Ends with a generated corpus over every numeric and list field of both APIs."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest

from tests.support.harness import anthropic_body, dumps

JSON = {"content-type": "application/json"}
USER = [{"role": "user", "content": "Hello"}]


def nested_text(depth: int) -> bytes:
    """A JSON schema nested `depth` levels, as text (json.dumps would recurse)."""
    return b'{"a":' * (depth - 1) + b'{"type":"string"}' + b"}" * (depth - 1)


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "zccp-tiny", "max_tokens": 4, "messages": USER, **extra}


def post(s, path: str, body: bytes | dict[str, Any]):
    raw = body if isinstance(body, bytes) else dumps(body)
    with s.client() as c:
        return c.post(path, content=raw, headers=JSON)


def _deep_tool_anthropic(depth: int) -> bytes:
    return (b'{"model":"zccp-tiny","max_tokens":4,"messages":[{"role":"user","content":"Hi"}],'
            b'"tools":[{"name":"f","input_schema":' + nested_text(depth) + b'}],"tool_choice":{"type":"any"}}')


def _deep_format_openai(depth: int) -> bytes:
    return (b'{"model":"zccp-tiny","max_tokens":4,"messages":[{"role":"user","content":"Hi"}],'
            b'"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":' + nested_text(depth)
            + b"}}}")


HOSTILE = [
    pytest.param("/v1/chat/completions", chat(logit_bias={"\u00b2": 1}), "logit_bias", id="logit-bias-superscript"),
    pytest.param("/v1/chat/completions", chat(logit_bias={"1" * 4300: 1}), "logit_bias", id="logit-bias-4300-digits"),
    pytest.param("/v1/chat/completions", chat(logit_bias={str(i): 1 for i in range(301)}), "logit_bias",
                 id="logit-bias-301-entries"),
    pytest.param("/v1/messages", anthropic_body(max_tokens=4, stop_sequences=["x"] * 17), "stop_sequences",
                 id="stop-sequences-17"),
    pytest.param("/v1/messages", anthropic_body(max_tokens=4, stop_sequences=["x" * 300]), "stop_sequences.0",
                 id="stop-sequence-300-bytes"),
    pytest.param("/v1/chat/completions", chat(stop=["y" * 300]), "stop[0]", id="stop-300-bytes"),
    pytest.param("/v1/messages", _deep_tool_anthropic(300), "tools.0.input_schema", id="tool-schema-depth-300"),
    pytest.param("/v1/chat/completions", _deep_format_openai(300), "response_format.json_schema.schema",
                 id="json-schema-depth-300"),
    pytest.param("/v1/chat/completions",
                 chat(tools=[{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]), "tools",
                 id="tools-129"),
    pytest.param("/v1/chat/completions", chat(seed=2**70), "seed", id="seed-over-int64"),
]


def _error_names(r, field: str) -> None:
    assert r.status_code == 400, (r.status_code, r.text[:300])
    err = r.json()["error"]
    named = err.get("param") or err["message"]
    assert field in named, err


@pytest.mark.parametrize(("path", "body", "field"), HOSTILE)
def test_hostile_field_is_a_400_naming_it(stack, path, body, field) -> None:
    pid = stack.engine.proc.pid
    _error_names(post(stack, path, body), field)
    assert stack.engine.proc.poll() is None and stack.engine.proc.pid == pid
    assert post(stack, "/v1/messages", anthropic_body(max_tokens=4)).status_code == 200


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/chat/completions"])
def test_tiny_temperature_is_served(stack, path) -> None:
    """1e-300 reached the sampler as logits / 1e-300 (inf, NaN); it is served greedy now."""
    r = post(stack, path, chat(temperature=1e-300))
    assert r.status_code == 200, r.text
    greedy = post(stack, path, chat(temperature=0))
    assert r.json().get("content", r.json().get("choices")) is not None
    body, ref = r.json(), greedy.json()
    text = body["content"][0]["text"] if "content" in body else body["choices"][0]["message"]["content"]
    ref_text = ref["content"][0]["text"] if "content" in ref else ref["choices"][0]["message"]["content"]
    assert text == ref_text


def test_n_that_can_never_be_queued_is_a_400(make_stack) -> None:
    s = make_stack({"model": {"max_queue": 4}})
    r = post(s, "/v1/chat/completions", chat(n=5))
    assert r.status_code == 400, r.text        # main: 429 "queue full... retry shortly", forever
    assert r.json()["error"]["param"] == "n" and "max_queue" in r.json()["error"]["message"]
    r = post(s, "/v1/completions", {"model": "zccp-tiny", "max_tokens": 2, "prompt": ["a", "b", "c"], "n": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
    assert post(s, "/v1/chat/completions", chat(n=4)).status_code == 200


# --- a generated corpus over every numeric and list field of both APIs ---

_NUMBERS: list[Any] = [0, -1, 1, 2**31, 2**63, 2**70, -(2**70), 1e-300, -1e-300, 1e308, 0.5, 2.0000001, 100.5,
                       "1", None, True, [], {}]
_LISTS: list[Any] = [[], [""], ["x"] * 50, ["x" * 5000], [1], [None], "s", 3, {}, [[]]]

_ANTHROPIC_NUMERIC = ["max_tokens", "temperature", "top_p", "top_k"]
_ANTHROPIC_LISTS = ["stop_sequences", "tools", "messages", "system"]
_OPENAI_NUMERIC = ["max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "seed",
                   "presence_penalty", "frequency_penalty", "top_logprobs"]
_OPENAI_LISTS = ["stop", "tools", "messages"]


def _corpus() -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    for fields, values, path, base in (
            (_ANTHROPIC_NUMERIC, _NUMBERS, "/v1/messages", anthropic_body(max_tokens=4)),
            (_ANTHROPIC_LISTS, _LISTS, "/v1/messages", anthropic_body(max_tokens=4)),
            (_OPENAI_NUMERIC, _NUMBERS, "/v1/chat/completions", chat()),
            (_OPENAI_LISTS, _LISTS, "/v1/chat/completions", chat())):
        for f, v in itertools.product(fields, values):
            out.append((path, dumps({**base, f: v})))
    for v in _NUMBERS:     # logit_bias values and keys, and the logprobs pair
        out.append(("/v1/chat/completions", dumps(chat(logit_bias={"1": v}))))
        out.append(("/v1/chat/completions", dumps(chat(logprobs=True, top_logprobs=v))))
    for key in ["\u0663", "-0", "01", "9" * 12, "", " 7"]:
        out.append(("/v1/chat/completions", dumps(chat(logit_bias={key: 1}))))
    return out


def test_corpus_of_numeric_and_list_fields_no_500(stack) -> None:
    pid = stack.engine.proc.pid
    bystander: list[int] = []
    stop = threading.Event()

    def neighbour() -> None:       # a well-behaved client beside the corpus
        with stack.client() as c:
            while not stop.is_set():
                bystander.append(c.post("/v1/messages", content=dumps(anthropic_body(max_tokens=4)),
                                        headers=JSON).status_code)

    t = threading.Thread(target=neighbour)
    t.start()
    bad: list[tuple[str, int, str]] = []
    try:
        with stack.client() as c:
            for path, raw in _corpus():
                r = c.post(path, content=raw, headers=JSON)
                if r.status_code >= 500:
                    bad.append((raw[:120].decode(errors="replace"), r.status_code, r.text[:200]))
    finally:
        stop.set()
        t.join()
    assert not bad, bad
    assert stack.engine.proc.poll() is None and stack.engine.proc.pid == pid, "the engine restarted"
    assert bystander and set(bystander) == {200}, sorted(set(bystander))
