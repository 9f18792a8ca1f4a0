"""Plain data passed between the API layer, the generation loop and the model.

Both API front ends (Anthropic Messages, OpenAI Chat Completions) parse their JSON
into a GenerationRequest; the generation loop answers with GenerationResult and
TextDelta values; the API layer renders those back into each API's bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

# Choices one request may ask for: OpenAI's n (and /v1/completions: prompts x n). nginx
# reserves max_tokens per choice up to this (limits.max_choices in zccp_http.conf).
MAX_CHOICES: Final = 128

# "openai" is Chat Completions; "completions" and "responses" the other OpenAI endpoints
ApiKind = Literal["anthropic", "openai", "completions", "responses"]
Role = Literal["system", "user", "assistant"]
# Anthropic's stop reasons; the OpenAI renderer maps them to finish_reason.
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


@dataclass(frozen=True)
class OutputConstraint:
    """What a grammar holds the answer to (zccp.model.grammar): JSON (any object, or one
    valid against a JSON schema), or one tool call in the hermes form."""

    kind: Literal["json", "tool_call"]
    schema: str | None = None                        # json: the JSON schema as JSON text (None: any object)
    tools: tuple[tuple[str, str | None], ...] = ()   # tool_call: (name, parameters schema JSON) it may call
    # the request field a compile error names (compiled off the loop, zccp.model.grammar_cache)
    param: str = field(default="", compare=False)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0          # 0 means greedy (deterministic)
    top_p: float | None = None        # nucleus sampling, (0, 1]
    top_k: int | None = None          # keep the k most likely tokens, >= 1
    seed: int | None = None           # fixes the sampler's RNG when given
    stop: tuple[str, ...] = ()        # stop sequences, matched on generated text
    constraint: OutputConstraint | None = None   # a grammar the answer must follow
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit), OpenAI's
    presence_penalty: float = 0.0     # subtracted once from a token already generated
    frequency_penalty: float = 0.0    # subtracted per time a token was generated
    logprobs: int | None = None       # report each token's logprob and this many alternatives (None: off)
    # vLLM's sampling extensions (its OpenAI server's; docs/openai-endpoints.md)
    ignore_eos: bool = False          # EOS is never drawn: the answer runs to max_tokens (or a stop)
    min_tokens: int = 0               # EOS, stop_token_ids and stop sequences held back until this many
    min_p: float = 0.0                # drop tokens below min_p x the most likely one's probability
    repetition_penalty: float = 1.0   # a token seen in prompt or output: positive logit / it, negative x it
    stop_token_ids: tuple[int, ...] = ()   # generating one of these ends the answer (it is kept)


@dataclass(frozen=True)
class CacheMark:
    """One Anthropic cache_control breakpoint: the block it sits on and its TTL. `where` is
    "tools", "system" or "messages"; block: the content block within messages[index]; part:
    the block within that tool_result's content (-1: the content block itself)."""

    where: Literal["tools", "system", "messages"]
    index: int
    block: int
    ttl_s: int
    part: int = -1


@dataclass(frozen=True)
class Pin:
    """A prompt prefix to keep in the prefix KV cache for ttl_s (a breakpoint's): its first
    `tokens` prompt tokens."""

    tokens: int
    ttl_s: int


@dataclass(frozen=True)
class CacheWrite:
    """Prompt tokens a call wrote into the prefix KV cache at its breakpoints, by TTL
    (Anthropic's cache_creation: ephemeral_5m_input_tokens / ephemeral_1h_input_tokens)."""

    short: int = 0                    # 5 minutes
    long: int = 0                     # 1 hour

    @property
    def total(self) -> int:
        return self.short + self.long


NO_WRITE = CacheWrite()


@dataclass(frozen=True)
class ChatMessage:
    role: Role
    text: str                         # text content, non-text blocks rendered as "[type]"


@dataclass(frozen=True)
class GenerationRequest:
    api: ApiKind
    model: str
    system: str                       # "" when absent
    messages: tuple[ChatMessage, ...]
    sampling: SamplingParams
    stream: bool = False
    include_usage: bool = False       # OpenAI stream_options.include_usage
    user: str | None = None           # OpenAI `user` / Anthropic metadata.user_id (a cache tenant source)
    tool_use: bool = False            # tools were offered and tool_choice allows calling them
    n: int = 1                        # OpenAI n: choices to generate per prompt
    cache_marks: tuple[CacheMark, ...] = ()   # Anthropic cache_control breakpoints, in prompt order
    prompt_text: str | None = None    # /v1/completions: the prompt as is, no chat template (None: a chat)
    # /v1/completions: every prompt in order, a text or token ids (each gets n choices); () for a chat
    prompts: tuple[str | tuple[int, ...], ...] = ()
    # what the API echoes back in its answer (/v1/responses: instructions, tools, ...); None: nothing
    echo: dict[str, Any] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ChatInput:
    """The conversation as a chat template takes it (transformers' message shape), built
    from a validated body by the API's codec, for backends that render a chat template."""

    messages: list[dict[str, Any]]    # role, content (str), tool_calls, tool_call_id
    tools: list[dict[str, Any]] | None                 # [{"type": "function", "function": {...}}]
    tool_choice: str | dict[str, Any] | None           # "auto" | "none" | "required" | a named function
    media: tuple[tuple[str, str], ...] = ()            # (field, block type) of non-text content


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log probability (and the most likely alternatives), from the
    distribution it was drawn from (bias, penalties and grammar applied; before temperature)."""

    token: bytes
    logprob: float
    top: tuple[tuple[bytes, float], ...] = ()


@dataclass(frozen=True)
class TextDelta:
    text: str                         # newly released text (never splits a UTF-8 character)
    logprobs: tuple[TokenLogprob, ...] = ()   # the tokens since the previous delta (when asked for)


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model made (parsed from its output by zccp.serving.hermes_tools), complete
    or cut short by max_tokens (truncated: the arguments as generated, not always JSON)."""

    name: str
    arguments: str                    # the arguments object as JSON text (truncated: its start)
    id: str | None = None             # the call's id when an upstream named it (None: a fresh one)
    truncated: bool = False


@dataclass(frozen=True)
class ToolCallStart:
    """A tool call's name is known: its arguments follow (ToolArgsDelta*), then its ToolCall."""

    name: str
    id: str | None = None             # the call's id when an upstream named it (None: a fresh one)


@dataclass(frozen=True)
class ToolArgsDelta:
    """The next piece of the open tool call's arguments, as generated (JSON text)."""

    text: str


@dataclass(frozen=True)
class GenerationResult:
    text: str
    stop_reason: StopReason
    stop_sequence: str | None
    input_tokens: int                 # every prompt token, reused ones included
    output_tokens: int
    tool_calls: tuple[ToolCall, ...] = ()
    cached_tokens: int = 0            # prompt tokens whose KV state came from the prefix cache
    cache_write: CacheWrite = NO_WRITE   # prompt tokens written at cache_control breakpoints
    logprobs: tuple[TokenLogprob, ...] | None = None   # every generated token's, when asked for


@dataclass(frozen=True)
class Completed:
    """A complete, successful answer: what the cache may store."""

    result: GenerationResult
    deltas: tuple[int, ...]           # lengths of the text deltas as streamed (one for non-streamed)


@dataclass
class ApiError(Exception):
    """A client-visible error; each API layer renders it in its own shape."""

    status: int                       # HTTP status
    kind: str                         # Anthropic error type, e.g. "invalid_request_error"
    message: str
    param: str | None = None          # the request field at fault, when there is one
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.status} {self.kind}: {self.message}"
