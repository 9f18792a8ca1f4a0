"""Issue 13, point 4: property-based tests (Hypothesis), bounded so the suite stays fast.

- Random JSON documents and random near-valid request bodies through the Lua fingerprint
  (in a real nginx with the test-only locations, tests/support/fp_nginx.py) and the Python one:
  byte-identical keys, bands and signatures, or both refuse.
- The same bodies through both APIs' request parsers (and, for what they accept, the
  chat-template conversion): a valid request or an API-shaped error, never another exception.
"""

from __future__ import annotations

import json

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.fp_nginx import compare
from zccp.api import anthropic, openai
from zccp.api.common import ParseLimits
from zccp.shared_types import ApiError, GenerationRequest

LIMITS = ParseLimits(served_models=frozenset({"zccp-tiny"}), max_tokens_cap=4096, default_max_tokens=256)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                            HealthCheck.too_slow])

# --- strategies ------------------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40))
json_values = st.recursive(scalars, lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(max_size=12), c,
                                                                                       max_size=5), max_leaves=25)

TEXTS = st.text(max_size=60) | st.sampled_from(["hello", "", " ", "a\u0000b", "é" * 5, "\ud7ff", "<tag>", "1e400"])
BLOCK_TYPES = st.sampled_from(["text", "text", "image", "tool_use", "tool_result", "document", "thinking",
                               "nonsense", "image_url", ""])
ROLES = st.sampled_from(["user", "user", "assistant", "system", "tool", "developer", "wizard", ""])


@st.composite
def blocks(draw):
    b = {"type": draw(BLOCK_TYPES)}
    if draw(st.booleans()):
        b["text"] = draw(TEXTS | json_values)
    if b["type"] == "tool_use" or draw(st.integers(0, 9)) == 0:
        b.update(id=draw(st.sampled_from(["toolu_1", "toolu_2", 3])), name="f", input=draw(st.just({}) | json_values))
    if b["type"] == "tool_result" or draw(st.integers(0, 9)) == 0:
        b.update(tool_use_id=draw(st.sampled_from(["toolu_1", "toolu_2", None])),
                 content=draw(TEXTS | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXTS}),
                                                max_size=2)))
    return b


@st.composite
def messages(draw):
    m = {"role": draw(ROLES)}
    if draw(st.integers(0, 19)):
        m["content"] = draw(TEXTS | st.lists(blocks(), max_size=4) | json_values)
    if draw(st.integers(0, 9)) == 0:
        m[draw(st.sampled_from(["name", "tool_call_id", "tool_calls", "extra"]))] = draw(json_values)
    return m


@st.composite
def near_valid(draw):
    """A Messages / Chat Completions body with a few fields wrong, missing or odd."""
    body = {"model": draw(st.sampled_from(["zccp-tiny", "zccp-tiny", "other", 7])),
            "messages": draw(st.lists(messages(), min_size=0, max_size=5))}
    for key, value in (("max_tokens", st.integers(-2, 5000) | json_values), ("stream", st.booleans() | json_values),
                       ("system", TEXTS | st.lists(blocks(), max_size=2)), ("temperature", st.floats(-1, 3) | scalars),
                       ("stop_sequences", st.lists(TEXTS, max_size=3)), ("stop", TEXTS | st.lists(TEXTS, max_size=5)),
                       ("tools", st.lists(json_values, max_size=2)), ("metadata", json_values)):
        if draw(st.integers(0, 3)) == 0:
            body[key] = draw(value)
    if draw(st.integers(0, 9)) == 0:
        del body[draw(st.sampled_from(["model", "messages"]))]
    return body


def encode(draw_value, ascii_only: bool, indent: bool) -> bytes:
    return json.dumps(draw_value, ensure_ascii=ascii_only, indent=2 if indent else None).encode()


@st.composite
def almost_right(draw):
    """A valid request of either API with at most one field changed (near misses)."""
    n = draw(st.integers(1, 4))
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": draw(st.text(min_size=1, max_size=30)
                                                                             .filter(lambda t: t.strip()))}
            for i in range(n)]
    if msgs[-1]["role"] == "assistant":
        msgs[-1]["content"] = msgs[-1]["content"].rstrip() or "x"
    body = {"model": "zccp-tiny", "max_tokens": draw(st.integers(1, 64)), "messages": msgs}
    if draw(st.booleans()):
        body["stream"] = True
    change = draw(st.integers(0, 3))
    if change == 1:
        body[draw(st.sampled_from(list(body) + ["temperature", "system", "stop", "top_p"]))] = draw(json_values)
    elif change == 2:
        msgs[draw(st.integers(0, n - 1))]["content"] = draw(st.lists(blocks(), min_size=1, max_size=3))
    elif change == 3:
        msgs[draw(st.integers(0, n - 1))]["role"] = draw(ROLES)
    return body


bodies = st.builds(encode, json_values | near_valid() | almost_right(), st.booleans(), st.booleans())
raw_bodies = bodies | st.binary(max_size=200) | bodies.flatmap(
    lambda b: st.integers(0, len(b)).map(lambda n: b[:n]))          # truncated JSON too
apis = st.sampled_from(["anthropic", "openai"])


# --- Lua and Python fingerprints ---------------------------------------------------------------

@SETTINGS
@given(api=apis, body=raw_bodies)
def test_fingerprint_identical_or_both_refused(ngx, masks, api, body):
    compare(ngx, masks, [(api, body)])


# --- the parsers ------------------------------------------------------------------------------

def _shaped(api: str, err: ApiError) -> None:
    """The error renders as the API's error object."""
    codec = anthropic if api == "anthropic" else openai
    doc = orjson.loads(codec.render_error(err))
    if api == "anthropic":
        assert doc["type"] == "error" and doc["error"]["type"] and isinstance(doc["error"]["message"], str)
    else:
        assert set(doc["error"]) >= {"message", "type", "param", "code"}
    assert 400 <= codec.http_status(err) < 600


@settings(max_examples=400, deadline=None)
@given(api=apis, body=raw_bodies)
def test_parsers_answer_a_request_or_an_api_error(api, body):
    codec = anthropic.CODEC if api == "anthropic" else openai.CODEC
    try:
        doc = codec.decode(body)
        req = codec.parse(doc, LIMITS)
        assert isinstance(req, GenerationRequest) and req.model == "zccp-tiny"
        codec.chat_input(doc)              # what a chat template sees (hf backend)
    except ApiError as err:
        _shaped(api, err)
