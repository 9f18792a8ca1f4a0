"""What a request may send: every bound on a client's lists, maps, strings and numbers, in
one place (docs/isolation.md "What a request may send" tables them). Both APIs' parsers
check them at parse time and refuse with their API's 400 naming the field; nginx may render
what it needs from here (as ops/nginx_conf renders MAX_CHOICES).

The checks here are API-neutral: each returns a short reason (None when within bounds) and
the caller words it in its API's error shape.
"""

from __future__ import annotations

import re
from typing import Any, Final

# --- sampling numbers ---
# A positive temperature below this is served greedy (temperature 0): logits / 1e-300 is
# inf and softmax NaN; at 1e-3 the distribution is already one-hot to float32 precision.
MIN_TEMPERATURE: Final = 1e-3
# top_p below this keeps only the most likely token: served greedy too (top_p 0 kept no
# token at all in the sampler and the request hung to the 504).
MIN_TOP_P: Final = 1e-3
ANTHROPIC_MAX_TEMPERATURE: Final = 1.0      # Messages API: 0..1
OPENAI_MAX_TEMPERATURE: Final = 2.0         # Chat Completions: 0..2
MAX_TOP_K: Final = 1 << 20                  # more than any vocabulary: no top-k limit
MAX_SEED: Final = (1 << 63) - 1             # the RNG takes a 64-bit seed

# --- vLLM's sampling extensions (the OpenAI endpoints) ---
MAX_REPETITION_PENALTY: Final = 10.0        # vLLM takes any value > 0; past 10 nothing seen is ever drawn again
MIN_REPETITION_PENALTY: Final = 0.01
MAX_STOP_TOKEN_IDS: Final = 64              # entries of stop_token_ids (each checked per token drawn)

# --- logit_bias (OpenAI) ---
MAX_LOGIT_BIAS: Final = 300                 # entries, OpenAI's bound
MAX_TOKEN_ID_DIGITS: Final = 9              # a token id below 10^9: no vocabulary is larger
LOGIT_BIAS_RANGE: Final = 100.0             # each bias in [-100, 100]
_TOKEN_ID: Final = re.compile(r"[0-9]{1,%d}" % MAX_TOKEN_ID_DIGITS)   # ASCII only (str.isdigit takes "²")

# --- stop sequences ---
OPENAI_MAX_STOP: Final = 4                  # OpenAI's bound on `stop`
ANTHROPIC_MAX_STOP: Final = 16              # stop_sequences: Anthropic documents none; scanned per token
MAX_STOP_BYTES: Final = 256                 # each stop sequence, UTF-8 bytes

# --- tools and schemas ---
MAX_TOOLS: Final = 128                      # OpenAI's bound on `tools`
MAX_SCHEMA_BYTES: Final = 64 * 1024         # one tool's schema, or a response format's, as JSON
MAX_TOOLS_SCHEMA_BYTES: Final = 256 * 1024  # all tools' schemas together
MAX_SCHEMA_DEPTH: Final = 64                # nesting of objects and arrays inside a schema
MAX_TOOL_NAME: Final = 128                  # characters (Anthropic 128, OpenAI 64)
MAX_TOP_LOGPROBS: Final = 20                # OpenAI's bound


def token_id(key: str) -> int | None:
    """A logit_bias key as a token id: decimal ASCII digits, at most MAX_TOKEN_ID_DIGITS."""
    return int(key) if _TOKEN_ID.fullmatch(key) else None


def stop_too_long(s: str) -> bool:
    """More than MAX_STOP_BYTES in UTF-8 (characters count first: no encoding of long strings)."""
    return len(s) > MAX_STOP_BYTES or len(s.encode("utf-8", "surrogatepass")) > MAX_STOP_BYTES


def schema_depth(value: Any, limit: int = MAX_SCHEMA_DEPTH) -> int:
    """How deep objects and arrays nest in `value` (a scalar is 0), counting no further than
    limit + 1; iterative, so a deep document never meets Python's recursion limit."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            children: Any = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        d += 1
        if d > deepest:
            deepest = d
            if d > limit:
                return d
        stack.extend((c, d) for c in children)
    return deepest


def schema_problem(schema: Any) -> str | None:
    """Why a JSON schema (a decoded value) is refused before it is serialised or compiled: too
    deep (orjson refuses past 255 levels; a compiler takes time with depth) or too large."""
    if schema_depth(schema) > MAX_SCHEMA_DEPTH:
        return f"schema nests deeper than {MAX_SCHEMA_DEPTH} levels"
    return None


def schema_size_problem(size: int) -> str | None:
    """Why a schema of `size` bytes (serialised) is refused."""
    if size > MAX_SCHEMA_BYTES:
        return f"schema is {size} bytes; at most {MAX_SCHEMA_BYTES} are allowed"
    return None


def effective_sampling(temperature: float, top_p: float | None) -> tuple[float, float | None]:
    """The (temperature, top_p) the sampler gets: a temperature below MIN_TEMPERATURE or a
    top_p below MIN_TOP_P is greedy (temperature 0, no top_p): the same answer, no division
    by a tiny number and no empty nucleus."""
    if top_p is not None and top_p < MIN_TOP_P:
        return 0.0, None
    return (0.0 if temperature < MIN_TEMPERATURE else temperature), top_p


def never_fits(choices: int, max_queue: int | None) -> str | None:
    """Why a request of `choices` sequences can never be queued (each choice waits as its own
    sequence, and at most model.max_queue wait): a 400, not the retryable 429 "queue full"."""
    if max_queue is not None and choices > max_queue:
        return (f"this request asks for {choices} choices, more than this server ever queues at once "
                f"(model.max_queue: {max_queue}); ask for at most {max_queue}")
    return None
