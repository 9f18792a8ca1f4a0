"""model.backend: hf through the real nginx + engine, with both official SDKs unmodified:
create, stream, count_tokens, the models list, prefix reuse and warm-up, content the
model cannot take. The checkpoint is made on the fly (tests/support/hf_checkpoint.py)."""

from __future__ import annotations

import json
import socket
import threading

import anthropic
import httpx
import openai
import pytest
from transformers import AutoTokenizer

from tests.support.hf_checkpoint import HF_MODEL
from zccp.ops.stack import free_port

SYSTEM = "You are a careful assistant for the shared memory pipeline. " * 12   # ~ 130 tokens
GREEDY = {"temperature": 0}      # the anthropic SDK takes sampling parameters through extra_body
TOOLS = [{"name": "get_weather", "description": "The weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


@pytest.fixture(scope="module")
def sdk_stack(hf_stack):
    return hf_stack                    # the stack conftest's claude / oai fixtures talk to


@pytest.fixture(scope="module")
def tok(hf_checkpoint):
    return AutoTokenizer.from_pretrained(hf_checkpoint, local_files_only=True)


def _template_len(tok, messages, tools=None) -> int:
    """The prompt length transformers itself makes for this conversation."""
    ids = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False)
    return len(ids)


def _usage_prompt(u) -> int:
    return u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)


def test_anthropic_create_counts_exactly(claude, tok, hf_stack):
    msgs = [{"role": "user", "content": "Hello there, how are you?"}]
    msg = claude.messages.create(model=HF_MODEL, max_tokens=12, system="Be brief.", messages=msgs, extra_body=GREEDY)
    assert msg.model == HF_MODEL and msg.content[0].type == "text"
    assert msg.stop_reason in ("end_turn", "max_tokens")
    expected = _template_len(tok, [{"role": "system", "content": "Be brief."}, *msgs])
    assert _usage_prompt(msg.usage) == expected
    assert 1 <= msg.usage.output_tokens <= 12 or msg.stop_reason == "end_turn"
    counted = claude.messages.count_tokens(model=HF_MODEL, system="Be brief.", messages=msgs)
    assert counted.input_tokens == expected
    hf_stack.assert_no_leaks()


def test_count_tokens_includes_tools_exactly(claude, tok):
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    plain = claude.messages.count_tokens(model=HF_MODEL, messages=msgs).input_tokens
    with_tools = claude.messages.count_tokens(model=HF_MODEL, messages=msgs, tools=TOOLS).input_tokens
    oai_tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                   "parameters": t["input_schema"]}} for t in TOOLS]
    assert plain == _template_len(tok, msgs)
    assert with_tools == _template_len(tok, msgs, oai_tools) > plain


def test_count_tokens_with_tool_history(claude, tok):
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                              {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                               "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}]
    n = claude.messages.count_tokens(model=HF_MODEL, messages=msgs, tools=TOOLS).input_tokens
    hf_msgs = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "Checking.", "tool_calls": [
                   {"id": "toolu_1", "type": "function", "function": {"name": "get_weather",
                                                                      "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}]
    oai_tools = [{"type": "function", "function": {"name": "get_weather", "description": TOOLS[0]["description"],
                                                   "parameters": TOOLS[0]["input_schema"]}}]
    assert n == _template_len(tok, hf_msgs, oai_tools)


def test_streams_match_the_plain_answers(claude, oai):
    kw = dict(model=HF_MODEL, max_tokens=24, messages=[{"role": "user", "content": "Tell me a story 😀 日本"}])
    with claude.messages.stream(**kw, extra_body=GREEDY) as s:
        pieces = list(s.text_stream)
        final = s.get_final_message()
    whole = claude.messages.create(**kw, extra_body=GREEDY)
    assert "".join(pieces) == final.content[0].text == whole.content[0].text
    assert final.usage.output_tokens == whole.usage.output_tokens
    chunks = list(oai.chat.completions.create(**kw, temperature=0, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    plain = oai.chat.completions.create(**kw, temperature=0)
    assert text == plain.choices[0].message.content == whole.content[0].text
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_sampling_parameters_are_applied(oai, claude):
    kw = dict(model=HF_MODEL, max_tokens=16, messages=[{"role": "user", "content": "Say something"}])
    seeded = {oai.chat.completions.create(**kw, temperature=1.0, seed=7).choices[0].message.content for _ in range(2)}
    assert len(seeded) == 1                                        # a seed fixes the draw
    others = {oai.chat.completions.create(**kw, temperature=1.0, seed=s).choices[0].message.content
              for s in range(8, 14)}
    assert len(others | seeded) > 1                                # and different seeds differ
    greedy = claude.messages.create(**kw, extra_body=GREEDY).content[0].text
    assert claude.messages.create(**kw, extra_body={"temperature": 1.0, "top_k": 1}).content[0].text == greedy
    assert claude.messages.create(**kw, extra_body={"temperature": 1.0, "top_p": 1e-9}).content[0].text == greedy
    if len(greedy) >= 6:
        stop = greedy[2:5]
        cut = claude.messages.create(**kw, extra_body=GREEDY, stop_sequences=[stop])
        assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
        assert cut.content[0].text == greedy[: greedy.index(stop)]


def test_models_list_in_both_shapes(claude, oai):
    assert [m.id for m in oai.models.list()] == [HF_MODEL]
    assert oai.models.retrieve(HF_MODEL).id == HF_MODEL
    page = claude.models.list()
    assert [m.id for m in page.data] == [HF_MODEL] and page.data[0].type == "model"
    assert claude.models.retrieve(HF_MODEL).id == HF_MODEL
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("no-such-model")


def test_images_are_refused_in_each_api_shape(claude, oai):
    img = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as a:
        claude.messages.create(model=HF_MODEL, max_tokens=5,
                               messages=[{"role": "user", "content": [{"type": "text", "text": "What is it?"}, img]}])
    assert "messages.0.content.1" in str(a.value) and "text-only" in str(a.value)
    assert a.value.body["type"] == "error"
    with pytest.raises(openai.BadRequestError) as o:
        oai.chat.completions.create(model=HF_MODEL, max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is it?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}])
    assert "messages[0].content[1]" in str(o.value) and o.value.body["param"] == "messages[0].content[1]"


def test_prefix_reuse_is_reported_and_changes_nothing(claude, oai, hf_stack):
    # Anthropic reports cache reads only to a request that asks for prompt caching (cache_control)
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    kw = dict(model=HF_MODEL, max_tokens=20, extra_body=GREEDY, system=system,
              messages=[{"role": "user", "content": "First question about slots"}])
    cold = claude.messages.create(**kw)
    warm = claude.messages.create(**kw)
    assert warm.usage.cache_read_input_tokens > 100
    assert warm.usage.cache_read_input_tokens % 16 == 0
    assert _usage_prompt(warm.usage) == _usage_prompt(cold.usage)
    assert warm.content[0].text == cold.content[0].text            # greedy: identical with reuse
    other = claude.messages.create(**{**kw, "messages": [{"role": "user", "content": "Another one"}]})
    assert other.usage.cache_read_input_tokens >= 100              # the shared system prompt
    r = oai.chat.completions.create(model=HF_MODEL, max_tokens=4, messages=[
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "First question about slots"}])
    assert r.usage.prompt_tokens_details.cached_tokens >= 100
    assert r.usage.prompt_tokens == _usage_prompt(cold.usage)


def test_warmup_preloads_a_prefix(hf_stack, oai):
    system = "Warm-up system prompt for the pipeline tests. " * 10
    r = hf_stack.admin_client().post("/v1/zccp/warmup", json={"model": HF_MODEL, "system": system, "messages": []})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["type"] == "warmup" and body["reused_tokens"] == 0
    assert body["cached_tokens"] == body["prompt_tokens"] // 16 * 16 > 64
    # OpenAI reports the automatic reuse (Anthropic's usage only reads at cache_control breakpoints)
    r = oai.chat.completions.create(model=HF_MODEL, max_tokens=4, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": "hi"}])
    assert r.usage.prompt_tokens_details.cached_tokens == body["cached_tokens"]
    again = hf_stack.admin_client().post("/v1/zccp/warmup", json={"model": HF_MODEL, "system": system, "messages": []})
    assert again.json()["reused_tokens"] == (body["prompt_tokens"] - 1) // 16 * 16
    bad = hf_stack.admin_client().post("/v1/zccp/warmup", json={"model": "nope", "messages": []})
    assert bad.status_code == 404 and bad.json()["type"] == "error"
    hf_stack.assert_no_leaks()


def _outside_address() -> str | None:
    """An address of this host that is not loopback (to be a non-loopback client)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))          # no packet is sent: this only picks a route
            addr = s.getsockname()[0]
    except OSError:
        return None
    return None if addr.startswith("127.") else addr


def test_warmup_is_on_the_admin_listener_only(make_stack, hf_checkpoint):
    """The public listener never serves it, from any address (loopback included); the admin
    listener does."""
    addr = _outside_address()
    s = make_stack({"server": {"listen": f"0.0.0.0:{free_port()}"},
                    "model": {"backend": "hf", "path": str(hf_checkpoint), "name": HF_MODEL}})
    port = s.cfg.server.listen.rsplit(":", 1)[1]
    for host in ["127.0.0.1"] + ([addr] if addr else []):
        r = httpx.post(f"http://{host}:{port}/v1/zccp/warmup", json={"model": HF_MODEL, "messages": []}, timeout=30)
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", host
    ok = s.admin_client().post("/v1/zccp/warmup", json={"model": HF_MODEL, "system": "x" * 80, "messages": []})
    assert ok.status_code == 200


def test_long_prompt_is_planned_in_chunks(hf_stack):
    body = {"model": HF_MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "chunk me " * 200}]}
    r = hf_stack.client().post("/v1/messages", json=body)
    assert r.status_code == 200
    assert r.headers["x-zccp-plan"].startswith("chunked:") and int(r.headers["x-zccp-plan"][8:]) > 1


def test_concurrent_streams_decode_together(hf_stack):
    """Eight streams at once all complete, each equal to its own greedy answer alone."""
    prompts = [f"Question number {i}: what is {i} times {i + 3}?" for i in range(8)]
    alone = {}
    with hf_stack.client() as c:
        for p in prompts:
            alone[p] = c.post("/v1/messages", json={"model": HF_MODEL, "max_tokens": 24, "temperature": 0,
                                                    "messages": [{"role": "user", "content": p}]}).json()
    results: dict[str, str] = {}
    errors: list[BaseException] = []

    def one(p: str) -> None:
        try:
            with hf_stack.client() as c, c.stream("POST", "/v1/messages", json={
                    "model": HF_MODEL, "max_tokens": 24, "temperature": 0, "stream": True,
                    "messages": [{"role": "user", "content": p}]}) as r:
                text = []
                for line in r.iter_lines():
                    if line.startswith("data: ") and '"text_delta"' in line:
                        text.append(json.loads(line[6:])["delta"]["text"])
                results[p] = "".join(text)
        except BaseException as exc:      # surfaces in the main thread, not as a timeout
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert results == {p: alone[p]["content"][0]["text"] for p in prompts}
    hf_stack.assert_no_leaks()
