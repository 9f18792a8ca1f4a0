"""model.backend: upstream in front of `transformers serve --continuous-batching` (Hugging
Face's own OpenAI-compatible server, transformers[serving]) on a checkpoint made at test
time: both SDKs through the gateway get what the server answers directly (greedy)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.support.harness import Stack
from zccp.ops.stack import free_port

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

GW_MODEL = "zccp-gw"


@pytest.fixture(scope="module")
def hf_serve(hf_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("hf_serve") / "serve.log"
    cli = Path(sys.executable).with_name("transformers")
    with log.open("wb") as out:
        proc = subprocess.Popen([str(cli), "serve", "--continuous-batching", "--host", "127.0.0.1", "--port",
                                 str(port), "--device", "cpu", str(hf_checkpoint)], stdout=out, stderr=out,
                                env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}/v1"
    try:
        end = time.monotonic() + 180
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise AssertionError(f"transformers serve exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(url + "/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise AssertionError(f"transformers serve did not start: {log.read_text()[-2000:]}")
        # the first generation pays the server's warm-up (minutes on a loaded CPU)
        httpx.post(url + "/chat/completions", timeout=300, json={
            "model": str(hf_checkpoint), "max_tokens": 2, "messages": [{"role": "user", "content": "warm"}]})
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def gateway(hf_serve: str, hf_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("gw_hf"), {
        "model": {"backend": "upstream", "name": GW_MODEL},
        "upstream": {"urls": [hf_serve], "api": "openai", "model": str(hf_checkpoint), "read_timeout_ms": 120000},
        "limits": {"request_timeout_ms": 180000}})
    try:
        yield s.start()
    finally:
        s.stop()


def direct(hf_serve: str, model: str, text: str) -> dict:
    r = httpx.post(hf_serve + "/chat/completions", timeout=120, json={
        "model": model, "max_tokens": 12, "temperature": 0, "messages": [{"role": "user", "content": text}]})
    assert r.status_code == 200, r.text
    return r.json()


def test_both_sdks_through_the_gateway(gateway: Stack, hf_serve: str, hf_checkpoint: Path) -> None:
    want = direct(hf_serve, str(hf_checkpoint), "Tell me about caches")
    want_text = want["choices"][0]["message"]["content"]
    assert want_text
    o = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="k", max_retries=0, timeout=120)
    c = o.chat.completions.create(model=GW_MODEL, max_tokens=12, temperature=0,
                                  messages=[{"role": "user", "content": "Tell me about caches"}])
    assert c.choices[0].message.content == want_text and c.model == GW_MODEL
    assert c.choices[0].finish_reason == want["choices"][0]["finish_reason"]
    assert c.usage is not None and c.usage.prompt_tokens == want["usage"]["prompt_tokens"]
    chunks = list(o.chat.completions.create(model=GW_MODEL, max_tokens=12, temperature=0, stream=True,
                                            messages=[{"role": "user", "content": "Tell me about caches"}]))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == want_text
    a = anthropic.Anthropic(base_url=gateway.base_url, api_key="k", max_retries=0, timeout=120)
    with a.messages.stream(model=GW_MODEL, max_tokens=12, extra_body={"temperature": 0},
                           messages=[{"role": "user", "content": "Tell me about caches"}]) as st:
        m = st.get_final_message()
    assert m.content[0].type == "text" and m.content[0].text == want_text
    assert m.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[want["choices"][0]["finish_reason"]]
    assert m.usage.output_tokens == want["usage"]["completion_tokens"]
