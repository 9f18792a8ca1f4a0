"""Images the real APIs refuse are refused, 400 naming the field, through nginx and the
engine: base64 that does not decode, a media type the API does not take, an image over
its size (Anthropic: 5 MB; OpenAI: 20 MB, checked beside it in tests/unit). What the real
APIs accept still is: the model sees a marker."""

from __future__ import annotations

import base64

import anthropic
import openai
import pytest

from tests.support.cache_requests import NULL

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(64)).decode()
MODEL = "zccp-tiny"


@pytest.fixture(scope="module")
def img_stack(tmp_path_factory):
    from tests.support.harness import Stack

    # bodies up to 8 MiB: room for an image past Anthropic's 5 MB
    s = Stack(tmp_path_factory.mktemp("images"), {"model": NULL, "limits": {"max_body_kb": 8192},
                                                  "shared_memory": {"segment_count": 2, "segment_size_kb": 8720}})
    try:
        yield s.start()
    finally:
        s.stop()


@pytest.fixture(scope="module")
def sdk_stack(img_stack):
    return img_stack


def _image(media_type: str = "image/png", data: str = PNG) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "What is it?"}, {
        "type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}]}]


@pytest.mark.parametrize("media_type,data,field", [
    ("image/png", "!!!notbase64", "messages.0.content.1.source.data"),
    ("image/png", PNG[:-1], "messages.0.content.1.source.data"),          # padding cut
    ("image/bmp", PNG, "messages.0.content.1.source.media_type"),
    ("application/pdf", PNG, "messages.0.content.1.source.media_type"),
    ("image/png", base64.b64encode(bytes(5 * 1024 * 1024 + 1)).decode(), "messages.0.content.1.source.data"),
])
def test_anthropic_refuses_images_the_real_api_refuses(claude, media_type, data, field):
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=MODEL, max_tokens=5, messages=_image(media_type, data))
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert e.value.body["error"]["message"].startswith(field + ": "), e.value.body


def test_anthropic_accepts_the_images_the_real_api_accepts(claude):
    for media_type in ("image/jpeg", "image/png", "image/gif", "image/webp"):
        assert claude.messages.create(model=MODEL, max_tokens=3, messages=_image(media_type)).usage.output_tokens == 3
    at_limit = base64.b64encode(bytes(5 * 1024 * 1024)).decode()
    assert claude.messages.create(model=MODEL, max_tokens=3, messages=_image(data=at_limit)).stop_reason
    url = [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}}]}]
    assert claude.messages.create(model=MODEL, max_tokens=3, messages=url).usage.output_tokens == 3
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=MODEL, max_tokens=3, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png"}}]}])
    assert "messages.0.content.0.source.data: Field required" in str(e.value)


@pytest.mark.parametrize("url,code", [
    ("data:image/png;base64,!!!notbase64", "invalid_image_url"),
    ("data:image/bmp;base64," + PNG, "invalid_image_format"),
    ("data:image/png," + PNG, "invalid_image_url"),                         # not base64
    ("ftp://x.test/a.png", "invalid_image_url"),
])
def test_openai_refuses_image_urls_the_real_api_refuses(oai, url, code):
    part = {"type": "image_url", "image_url": {"url": url}}
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, max_tokens=3, messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is it?"}, part]}])
    assert e.value.body["param"] == "messages[0].content[1].image_url.url" and e.value.body["code"] == code
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model=MODEL, max_output_tokens=3, input=[{"role": "user", "content": [
            {"type": "input_text", "text": "What is it?"}, {"type": "input_image", "image_url": url}]}])
    assert e.value.body["param"] == "input[0].content[1].image_url" and e.value.body["code"] == code


def test_openai_accepts_the_images_the_real_api_accepts(oai):
    for url in ("https://x.test/a.png", "data:image/jpeg;base64," + PNG, "data:image/webp;base64," + PNG,
                "data:image/gif;base64," + PNG, "data:image/png;base64," + PNG):
        r = oai.chat.completions.create(model=MODEL, max_tokens=3, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}]}])
        assert r.usage.completion_tokens == 3
        r = oai.responses.create(model=MODEL, max_output_tokens=3, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": url}]}])
        assert r.usage.output_tokens == 3
