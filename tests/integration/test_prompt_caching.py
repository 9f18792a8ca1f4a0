"""Anthropic prompt caching on a self-hosted model, through the real nginx + engine + Redis
with both official SDKs: cache_control breakpoints write their prefix into the prefix KV
cache (usage.cache_creation_input_tokens, by TTL in cache_creation), a later call reads it
(cache_read_input_tokens), input_tokens are the rest; a pinned prefix outlives LRU traffic;
OpenAI's automatic prefix caching reports cached_tokens, and Anthropic's usage reports no
cache reads for a request without cache_control (the reuse is had, not billed as a read); a
response-cache HIT is no model call and reports no cache reads or writes. Tool definitions
count where the prompt holds them.

The tiny model's prompt is bytes (zccp.model.tokenizer): BOS [SYSTEM system] USER text ...
ASSISTANT, so every position below is exact arithmetic; blocks are 16 tokens."""

from __future__ import annotations

import uuid

import anthropic
import pytest
from transformers import AutoTokenizer

from tests.support.harness import Stack, sdk_clients
from tests.support.hf_checkpoint import HF_MODEL
from zccp.api.common import ParseLimits

BLOCK = 16
GREEDY = {"temperature": 0}
_LIMITS = ParseLimits(frozenset({HF_MODEL}), max_tokens_cap=4096, default_max_tokens=16)


def aligned(n: int) -> int:
    return n // BLOCK * BLOCK


def cc(ttl: str | None = None) -> dict:
    return {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}


def long_text(words: str, times: int) -> str:
    return f"[{uuid.uuid4().hex}] " + words * times      # unique: no test reads another's blocks


def byte_prompt(system: str, user: str) -> int:
    """The tiny model's prompt length: BOS SYSTEM <system> USER <user> ASSISTANT."""
    return 1 + (1 + len(system.encode()) if system else 0) + 1 + len(user.encode()) + 1


@pytest.fixture(scope="module")
def cached_stack(tmp_path_factory):
    """The tiny model with the Redis response cache in front."""
    s = Stack(tmp_path_factory.mktemp("pcache"), {"cache": {"ttl_s": 600}}, with_redis=True)
    try:
        yield s.start()
    finally:
        s.stop()


@pytest.fixture(scope="module")
def clients(cached_stack):
    return sdk_clients(cached_stack)


def test_a_system_breakpoint_writes_its_prefix_then_a_later_call_reads_it(clients):
    claude, _ = clients
    system = long_text("Follow the house style for every answer. ", 14)
    blocks = [{"type": "text", "text": system, "cache_control": cc()}]
    bp = 2 + len(system.encode())                                   # BOS SYSTEM <system>
    first = claude.messages.create(model="zccp-tiny", max_tokens=4, system=blocks, extra_body=GREEDY,
                                   messages=[{"role": "user", "content": "Alpha question"}])
    u = first.usage
    assert u.cache_read_input_tokens == 0
    assert u.cache_creation_input_tokens == aligned(bp) > 0
    assert u.cache_creation.ephemeral_5m_input_tokens == aligned(bp) and u.cache_creation.ephemeral_1h_input_tokens == 0
    assert u.input_tokens == byte_prompt(system, "Alpha question") - aligned(bp)
    # another question after the same system prompt: the shared prefix is read, nothing written
    second = claude.messages.create(model="zccp-tiny", max_tokens=4, system=blocks, extra_body=GREEDY,
                                    messages=[{"role": "user", "content": "Beta question"}])
    u2 = second.usage
    assert u2.cache_read_input_tokens == aligned(bp + 1)             # + the USER marker both share
    assert u2.cache_creation_input_tokens == 0
    assert u2.input_tokens + u2.cache_read_input_tokens == byte_prompt(system, "Beta question")
    assert u2.input_tokens == claude.messages.count_tokens(
        model="zccp-tiny", system=blocks, messages=[{"role": "user", "content": "Beta question"}]
    ).input_tokens - aligned(bp + 1)


def test_a_one_hour_block_breakpoint_streams_its_usage_as_anthropic_does(clients):
    claude, _ = clients
    doc = long_text("A paragraph of the shared document. ", 12)
    content = [{"type": "text", "text": doc, "cache_control": cc("1h")}, {"type": "text", "text": "Summarize."}]
    bp = 2 + len(doc.encode())                                      # BOS USER <doc>
    events = []
    with claude.messages.stream(model="zccp-tiny", max_tokens=6, extra_body=GREEDY,
                                messages=[{"role": "user", "content": content}]) as s:
        events.extend(s)
        final = s.get_final_message()
    start = next(e for e in events if e.type == "message_start").message.usage
    delta = next(e for e in events if e.type == "message_delta").usage
    for u in (start, delta, final.usage):
        assert u.cache_creation_input_tokens == aligned(bp) and u.cache_read_input_tokens == 0
        assert u.input_tokens == byte_prompt("", doc + "\n\nSummarize.") - aligned(bp)
    for u in (start, final.usage):                  # the TTL split rides on message_start (as Anthropic's)
        assert u.cache_creation.ephemeral_1h_input_tokens == aligned(bp)
        assert u.cache_creation.ephemeral_5m_input_tokens == 0


def test_one_hour_then_five_minutes_split_the_write(clients):
    claude, _ = clients
    system = long_text("Standing rules. ", 10)
    doc = long_text("Reference text. ", 12)
    sys_bp = 2 + len(system.encode())
    doc_bp = sys_bp + 1 + len(doc.encode())
    msg = claude.messages.create(
        model="zccp-tiny", max_tokens=2, extra_body=GREEDY,
        system=[{"type": "text", "text": system, "cache_control": cc("1h")}],
        messages=[{"role": "user", "content": [{"type": "text", "text": doc, "cache_control": cc("5m")},
                                               {"type": "text", "text": "Question?"}]}])
    c = msg.usage.cache_creation
    assert c.ephemeral_1h_input_tokens == aligned(sys_bp)
    assert c.ephemeral_5m_input_tokens == aligned(doc_bp) - aligned(sys_bp)
    assert msg.usage.cache_creation_input_tokens == aligned(doc_bp)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_without_cache_control_no_cache_read_is_reported(clients, stream):
    """A request without breakpoints asked for no prompt caching: as Anthropic's, its usage
    reports no cache read or write and the whole prompt as input_tokens, though its prefix
    was reused (issue 31 item 4: 16 reused tokens came back as cache_read_input_tokens).
    The reuse is still had: the OpenAI API, which reports automatic caching, sees the
    blocks the Anthropic calls left."""
    claude, oai = clients
    system = long_text("Plain instructions, no cache_control. ", 12)

    def usages(user: str) -> list[anthropic.types.Usage]:
        kw = dict(model="zccp-tiny", max_tokens=4, system=system, extra_body=GREEDY,
                  messages=[{"role": "user", "content": user}])
        if not stream:
            return [claude.messages.create(**kw).usage]
        with claude.messages.stream(**kw) as s:
            events = list(s)
            final = s.get_final_message()
        return [next(e for e in events if e.type == "message_start").message.usage,
                next(e for e in events if e.type == "message_delta").usage, final.usage]

    for user in ("First question", "Second question"):       # the second shares the system prompt
        for u in usages(user):
            assert (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens) == (
                byte_prompt(system, user), 0, 0)
    r = oai.chat.completions.create(model="zccp-tiny", max_tokens=2, temperature=0, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": "Third question"}])
    assert r.usage.prompt_tokens_details.cached_tokens == aligned(2 + len(system.encode()) + 1)
    assert r.usage.prompt_tokens == byte_prompt(system, "Third question")


def test_with_a_breakpoint_the_three_add_up_to_the_prompt(clients):
    """A conversation with its breakpoint on the last block (Anthropic's recommendation):
    every turn's input + cache_read + cache_creation is the whole prompt, turn 2 reads what
    turn 1 wrote."""
    claude, _ = clients
    doc = long_text("Conversation context line. ", 10)
    turns: list[dict] = []
    seen = []
    for q in ("Question one", "Question two"):
        turns.append({"role": "user", "content": [{"type": "text", "text": f"{doc} {q}", "cache_control": cc()}]})
        msg = claude.messages.create(model="zccp-tiny", max_tokens=3, messages=turns, extra_body=GREEDY)
        u = msg.usage
        total = claude.messages.count_tokens(model="zccp-tiny", messages=turns).input_tokens
        assert u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens == total
        seen.append(u)
        turns[-1]["content"][0].pop("cache_control")          # the breakpoint moves to the next turn
        turns.append({"role": "assistant", "content": msg.content[0].text or "ok"})
    assert seen[0].cache_read_input_tokens == 0 and seen[0].cache_creation_input_tokens > 0
    assert seen[1].cache_read_input_tokens >= seen[0].cache_creation_input_tokens


def test_breakpoints_are_refused_where_anthropic_refuses_them(clients):
    claude, _ = clients
    five = [{"type": "text", "text": f"part {i}", "cache_control": cc()} for i in range(5)]
    bad = (
        {"system": five},                                                       # more than 4
        {"system": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "10m"}}]},
        {"system": [{"type": "text", "text": "x", "cache_control": {"type": "persistent"}}]},
        {"system": [{"type": "text", "text": "x", "cache_control": cc("5m")},  # 1h after 5m
                    {"type": "text", "text": "y", "cache_control": cc("1h")}]},
    )
    for kw in bad:
        with pytest.raises(anthropic.BadRequestError) as info:
            claude.messages.create(model="zccp-tiny", max_tokens=2, messages=[{"role": "user", "content": "hi"}], **kw)
        assert info.value.body["error"]["type"] == "invalid_request_error"


def test_openai_reports_automatic_prefix_caching(clients):
    _, oai = clients
    system = long_text("Shared instructions for every chat. ", 12)
    first = oai.chat.completions.create(model="zccp-tiny", max_tokens=2, temperature=0, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": "One"}])
    second = oai.chat.completions.create(model="zccp-tiny", max_tokens=2, temperature=0, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": "Two"}])
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == aligned(2 + len(system.encode()) + 1)
    assert second.usage.prompt_tokens == byte_prompt(system, "Two")


def test_a_response_cache_hit_is_no_model_call(clients):
    """A HIT replays the stored answer: no KV state read or written, the whole prompt is
    input_tokens (as nginx's L1, which keeps only such replays, reports it too)."""
    claude, _ = clients
    system = long_text("Cached answer system prompt. ", 10)
    kw = dict(model="zccp-tiny", max_tokens=4, extra_body=GREEDY,
              system=[{"type": "text", "text": system, "cache_control": cc()}],
              messages=[{"role": "user", "content": "Same question"}])
    miss = claude.messages.with_raw_response.create(**kw)
    hit = claude.messages.with_raw_response.create(**kw)
    assert miss.headers["x-zccp-cache"] == "MISS" and hit.headers["x-zccp-cache"] == "HIT"
    total = byte_prompt(system, "Same question")
    assert miss.parse().usage.cache_creation_input_tokens > 0
    u = hit.parse().usage
    assert (u.input_tokens, u.cache_creation_input_tokens, u.cache_read_input_tokens) == (total, 0, 0)
    assert hit.parse().content[0].text == miss.parse().content[0].text


def test_tools_are_not_in_the_tiny_prompt_and_are_not_counted(clients):
    """The built-in models' byte prompt has no tools (zccp.model.prompt.ByteFormat): usage and
    count_tokens count the prompt the model saw, which is the same with or without them."""
    claude, _ = clients
    tools = [{"name": "lookup", "description": "Look a word up", "input_schema": {"type": "object"}}]
    msgs = [{"role": "user", "content": "Define cache"}]
    plain = claude.messages.count_tokens(model="zccp-tiny", messages=msgs).input_tokens
    assert claude.messages.count_tokens(model="zccp-tiny", messages=msgs, tools=tools).input_tokens == plain
    msg = claude.messages.create(model="zccp-tiny", max_tokens=2, messages=msgs, tools=tools, extra_body=GREEDY)
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == plain == byte_prompt("", "Define cache")


def test_a_pinned_prefix_outlives_lru_traffic(make_stack):
    """prefix_cache_mb: 1 holds 512 tiny-model tokens (2 KiB each), pins at most half: a
    192-token pinned prefix survives traffic that evicts an unpinned one of the same size."""
    s = make_stack({"model": {"prefix_cache_mb": 1}})
    claude, _ = sdk_clients(s)
    pinned = long_text("Pinned rules. ", 12)[:190]
    plain = long_text("Unpinned rules. ", 12)[:190]

    def ask(system: str, user: str, mark: bool) -> anthropic.types.Usage:
        block = {"type": "text", "text": system, **({"cache_control": cc()} if mark else {})}
        return claude.messages.create(model="zccp-tiny", max_tokens=1, system=[block], extra_body=GREEDY,
                                      messages=[{"role": "user", "content": user}]).usage

    bp = 2 + len(pinned.encode())
    assert ask(pinned, "first", True).cache_creation_input_tokens == aligned(bp)
    ask(plain, "first", False)
    for i in range(4):                                  # 4 x ~700 tokens through 512 tokens of room
        ask(long_text(f"Traffic {i}. ", 60), "go", False)
    assert ask(pinned, "again", True).cache_read_input_tokens == aligned(bp + 1)
    # the unpinned prefix was evicted: OpenAI's automatic caching, which reports any reuse, reads none
    again = sdk_clients(s)[1].chat.completions.create(model="zccp-tiny", max_tokens=1, temperature=0, messages=[
        {"role": "system", "content": plain}, {"role": "user", "content": "again"}])
    assert again.usage.prompt_tokens_details.cached_tokens == 0
    metrics = s.admin_client().get("/metrics").text
    pinned_bytes = aligned(bp) * 2048                   # tiny: 2 layers x (K + V) x 128 floats a token
    assert f"zccp_engine_prefix_pinned_bytes {pinned_bytes}" in metrics
    assert "zccp_engine_prefix_pins_refused_total 0" in metrics


# -- the hf backend: its chat template decides where a breakpoint falls ------------------------

@pytest.fixture(scope="module")
def hf_clients(hf_stack):
    return sdk_clients(hf_stack)


@pytest.fixture(scope="module")
def tok(hf_checkpoint):
    return AutoTokenizer.from_pretrained(hf_checkpoint, local_files_only=True)


def _ids(tok, messages, tools=None, generation=True) -> list[int]:
    return tok.apply_chat_template(messages, tools=tools, add_generation_prompt=generation, tokenize=True,
                                   return_dict=False)


def test_hf_breakpoint_is_where_the_template_puts_the_block(hf_clients, tok):
    claude, oai = hf_clients
    system = long_text("You answer questions about shared memory pipelines. ", 8)
    blocks = [{"type": "text", "text": system, "cache_control": cc()}]
    full = _ids(tok, [{"role": "system", "content": system}, {"role": "user", "content": "First?"}])
    cut = _ids(tok, [{"role": "system", "content": system}], generation=False)
    shared = next((i for i, (a, b) in enumerate(zip(full, cut, strict=False)) if a != b), min(len(full), len(cut)))
    assert shared > 3 * BLOCK
    first = claude.messages.create(model=HF_MODEL, max_tokens=3, system=blocks, extra_body=GREEDY,
                                   messages=[{"role": "user", "content": "First?"}]).usage
    assert first.cache_creation_input_tokens == aligned(shared) and first.cache_read_input_tokens == 0
    assert first.input_tokens + first.cache_creation_input_tokens == len(full)
    second = claude.messages.create(model=HF_MODEL, max_tokens=3, system=blocks, extra_body=GREEDY,
                                    messages=[{"role": "user", "content": "Second?"}]).usage
    assert second.cache_read_input_tokens >= aligned(shared) and second.cache_creation_input_tokens == 0
    r = oai.chat.completions.create(model=HF_MODEL, max_tokens=2, temperature=0, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": "Third?"}])
    assert r.usage.prompt_tokens_details.cached_tokens >= aligned(shared)


def test_hf_usage_counts_tool_definitions(hf_clients, tok):
    """The hf prompt holds the tools (the chat template renders them): usage and count_tokens
    count them, on both APIs, as the prompt transformers itself makes."""
    claude, oai = hf_clients
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    msgs = [{"role": "user", "content": f"Weather in Oslo? {uuid.uuid4().hex}"}]
    hf_tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather",
                                                  "parameters": schema}}]
    with_tools = len(_ids(tok, msgs, hf_tools))
    without = len(_ids(tok, msgs))
    assert with_tools > without
    a = claude.messages.create(model=HF_MODEL, max_tokens=2, messages=msgs, extra_body=GREEDY,
                               tools=[{"name": "get_weather", "description": "The weather", "input_schema": schema}])
    assert a.usage.input_tokens + a.usage.cache_read_input_tokens == with_tools
    o = oai.chat.completions.create(model=HF_MODEL, max_tokens=2, temperature=0, messages=msgs, tools=hf_tools)
    assert o.usage.prompt_tokens == with_tools
    plain = oai.chat.completions.create(model=HF_MODEL, max_tokens=2, temperature=0, messages=msgs)
    assert plain.usage.prompt_tokens == without


def test_hf_breakpoint_inside_a_tool_result(hf_clients, tok):
    """cache_control on a tool_result's inner text block: the prefix ends after that block,
    where the template puts it, before the tool_result's later blocks (Anthropic's rule)."""
    from zccp.api import anthropic as codec

    claude, _ = hf_clients
    first = long_text("Station log line of the weather service. ", 6)
    ask = f"Weather in Oslo? {uuid.uuid4().hex}"

    def doc(second: str) -> dict:
        return {"model": HF_MODEL, "max_tokens": 3, "messages": [
            {"role": "user", "content": ask},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "tu_1", "name": "w", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": [
                {"type": "text", "text": first, "cache_control": cc()}, {"type": "text", "text": second}]}]}]}

    d = doc(long_text("Later readings. ", 6))
    full = _ids(tok, codec.chat_input(d).messages)
    cut = _ids(tok, codec.chat_input(codec.cut_at(d, codec.parse_document(d, _LIMITS).cache_marks[0])).messages,
               generation=False)
    shared = next((i for i, (a, b) in enumerate(zip(full, cut, strict=False)) if a != b), min(len(full), len(cut)))
    assert 3 * BLOCK < shared < len(full) - 3 * BLOCK       # the breakpoint is inside the tool_result
    u = claude.messages.create(**d, extra_body=GREEDY).usage
    # the template's opening blocks (no system: its default one) may be cached by earlier tests
    assert u.cache_creation_input_tokens > 0
    assert u.cache_read_input_tokens + u.cache_creation_input_tokens == aligned(shared)
    assert u.input_tokens + aligned(shared) == len(full)
    again = claude.messages.create(**doc("Other readings."), extra_body=GREEDY).usage
    assert again.cache_read_input_tokens >= aligned(shared) and again.cache_creation_input_tokens == 0
