"""The SDK tests' gateway stand-in: one API codec (our parser and renderers) behind an
httpx mock transport, so the official SDKs talk to exactly the bytes the engine makes."""

from __future__ import annotations

import anthropic
import httpx2
import openai

from zccp.api import ApiCodec
from zccp.api.common import ParseLimits
from zccp.shared_types import ApiError, GenerationRequest, GenerationResult, TextDelta

MODEL = "zccp-test"
LIMITS = ParseLimits(served_models=frozenset({MODEL}), max_tokens_cap=4096, default_max_tokens=512)
PATHS = {"anthropic": "/v1/messages", "openai": "/v1/chat/completions"}
RESPONSE_IDS = {"anthropic": "msg_e2e", "openai": "chatcmpl-e2e"}
CREATED = 1700000002


class FakeServer:
    """Answers every request with `pieces` (a stream delivers them as deltas, then either
    finishes with `stop` or ends with the `fail_mid_stream` error event)."""

    def __init__(self, codec: ApiCodec, pieces: list[str], stop: str = "end_turn",
                 fail_mid_stream: ApiError | None = None) -> None:
        self.codec = codec
        self.pieces = pieces
        self.stop = stop
        self.fail = fail_mid_stream
        self.requests: list[GenerationRequest] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        codec = self.codec
        assert request.url.path == PATHS[codec.name]
        try:
            req = codec.parse_body(request.content, LIMITS)
        except ApiError as err:
            return httpx2.Response(codec.http_status(err), content=codec.render_error(err),
                                   headers={"content-type": "application/json"})
        self.requests.append(req)
        res = GenerationResult("".join(self.pieces), self.stop, None, 11, 7)  # type: ignore[arg-type]
        rid = RESPONSE_IDS[codec.name]
        if not req.stream:
            return httpx2.Response(200, content=codec.render(req, res, rid, CREATED),
                                   headers={"content-type": "application/json"})
        enc = codec.stream(req, rid, CREATED, 11)
        raw = enc.start() + b"".join(enc.delta(TextDelta(p)) for p in self.pieces)
        raw += enc.error(self.fail) if self.fail else enc.finish(res)
        # deliver in awkward 5-byte chunks to exercise the SDK's SSE framing
        chunks = [raw[i:i + 5] for i in range(0, len(raw), 5)]
        return httpx2.Response(200, content=iter(chunks), headers={"content-type": "text/event-stream"})


def sdk_client(server: FakeServer):
    """The official SDK of the server's API, wired to it."""
    http = httpx2.Client(transport=httpx2.MockTransport(server))
    if server.codec.name == "anthropic":
        return anthropic.Anthropic(api_key="test", base_url="http://gateway", max_retries=0, http_client=http)
    return openai.OpenAI(api_key="test", base_url="http://gateway/v1", max_retries=0, http_client=http)
