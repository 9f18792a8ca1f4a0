"""The official anthropic and openai SDKs, unmodified, against the real gateway."""

from __future__ import annotations

import anthropic
import openai
import pytest

MODEL = "zccp-tiny"


@pytest.fixture(scope="module", params=["http1", "h2tls"])
def sdk_stack(request):
    """The stack conftest's claude / oai fixtures talk to: over HTTP/1.1, and over HTTP/2 +
    TLS (each SDK with an http_client speaking HTTP/2: harness.sdk_clients)."""
    return request.getfixturevalue("stack_h2" if request.param == "h2tls" else "stack_http1")


@pytest.fixture
def stack(sdk_stack):
    return sdk_stack


def test_anthropic_create(claude, stack):
    msg = claude.messages.create(model=MODEL, max_tokens=20, system="Be brief.",
                                 messages=[{"role": "user", "content": "Hi"},
                                           {"role": "assistant", "content": "Hello."},
                                           {"role": "user", "content": [{"type": "text", "text": "Again"}]}])
    assert isinstance(msg, anthropic.types.Message)
    assert msg.role == "assistant" and msg.model == MODEL
    assert msg.content[0].type == "text"
    assert msg.stop_reason in ("end_turn", "max_tokens")
    assert msg.usage.output_tokens <= 20 and msg.usage.input_tokens > 0
    stack.assert_no_leaks()


def test_anthropic_stream_matches_non_streaming(claude, stack):
    kwargs = dict(model=MODEL, max_tokens=40, messages=[{"role": "user", "content": "Count"}],
                  extra_body={"temperature": 0})
    with claude.messages.stream(**kwargs) as s:
        pieces = list(s.text_stream)
        final = s.get_final_message()
    whole = claude.messages.create(**kwargs)
    assert "".join(pieces) == final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert len(pieces) >= 1
    stack.assert_no_leaks()


def test_anthropic_errors_are_sdk_exceptions(claude):
    with pytest.raises(anthropic.BadRequestError) as exc:
        claude.messages.create(model=MODEL, max_tokens=0, messages=[{"role": "user", "content": "x"}])
    assert "max_tokens" in str(exc.value)
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="nope", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "robot", "content": "x"}])


def test_anthropic_stream_error_before_first_byte(claude):
    with pytest.raises(anthropic.BadRequestError):
        with claude.messages.stream(model=MODEL, max_tokens=-1, messages=[{"role": "user", "content": "x"}]) as s:
            list(s.text_stream)


def test_openai_create(oai, stack):
    r = oai.chat.completions.create(model=MODEL, max_tokens=20,
                                    messages=[{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "Hi"}])
    assert r.object == "chat.completion"
    choice = r.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 20
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    stack.assert_no_leaks()


def test_openai_stream_with_usage(oai, stack):
    kwargs = dict(model=MODEL, max_completion_tokens=30, temperature=0,
                  messages=[{"role": "user", "content": "Stream please"}])
    chunks = list(oai.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    whole = oai.chat.completions.create(**kwargs)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    stack.assert_no_leaks()


def test_openai_errors_are_sdk_exceptions(oai):
    with pytest.raises(openai.BadRequestError) as exc:
        oai.chat.completions.create(model=MODEL, n=200, messages=[{"role": "user", "content": "x"}])
    assert exc.value.body["param"] == "n"
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="gpt-nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=MODEL, messages=[])


def test_both_sdks_speak_the_stacks_protocol(claude, oai, stack):
    hi = [{"role": "user", "content": "Hi"}]
    a = claude.messages.with_raw_response.create(model=MODEL, max_tokens=4, messages=hi)
    o = oai.chat.completions.with_raw_response.create(model=MODEL, max_tokens=4, messages=hi)
    assert a.http_response.http_version == o.http_response.http_version == stack.protocol
    assert a.parse().type == "message" and o.parse().object == "chat.completion"
