"""Anthropic Messages API (`POST /v1/messages`): request parsing.

Validation errors follow the real API's style: "<dotted.path>: <message>", e.g.
"messages.1.content.0.text: Field required"; ApiError.param carries the path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, cast

from ...shared_types import (
    ApiError,
    GenerationRequest,
    OutputConstraint,
    Role,
    SamplingParams,
)
from ..common import (
    JOIN,
    BodyError,
    ParseLimits,
    decode_object,
    marker,
    merge_turns,
)
from ..bounds import (
    ANTHROPIC_MAX_STOP,
    MAX_STOP_BYTES,
    MAX_TOOL_NAME,
    MAX_TOOLS,
    MAX_TOP_K,
    effective_sampling,
    stop_too_long,
)
from ..constraints import json_output, schema_json, tool_call
from .cache_marks import cache_marks
from .media import check_image
from .wording import _bad, _dict, _int, _list, _no_extras, _required, _str, _text_of, _unit

_FIELDS: Final = frozenset({
    "model", "messages", "max_tokens", "system", "stop_sequences", "temperature",
    "top_p", "top_k", "stream", "metadata", "tools", "tool_choice", "thinking",
    "service_tier", "output_config",
})
_COUNT_FIELDS: Final = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking",
                                  "output_config"})
_OUTPUT_CONFIG_FIELDS: Final = frozenset({"format", "effort"})
_FORMAT_FIELDS: Final = frozenset({"type", "schema"})
_MESSAGE_FIELDS: Final = frozenset({"role", "content"})
_METADATA_FIELDS: Final = frozenset({"user_id"})
_ROLES: Final = frozenset({"user", "assistant"})


# The content block types the Messages API accepts in a request (its discriminated union);
# any other "type" is refused with the real API's message.
_BLOCK_TYPES: Final = (
    "bash_code_execution_tool_result", "code_execution_tool_result", "container_upload", "document",
    "image", "mcp_tool_result", "mcp_tool_use", "redacted_thinking", "search_result", "server_tool_use",
    "text", "text_editor_code_execution_tool_result", "thinking", "tool_result", "tool_use",
    "web_fetch_tool_result", "web_search_tool_result",
)
_BLOCK_TYPE_SET: Final = frozenset(_BLOCK_TYPES)
_EXPECTED_TAGS: Final = ", ".join(f"'{t}'" for t in _BLOCK_TYPES)


def _block_text(block: Any, path: str, tools: "_ToolIds") -> str:
    """Text a content block contributes: its text, or "[type]" for other kinds."""
    block = _dict(block, path)
    btype = _str(_required(block, "type", path + ".type"), path + ".type")
    if btype not in _BLOCK_TYPE_SET:
        raise _bad(path, f"Input tag '{btype}' found using 'type' does not match any of the expected tags: "
                         f"{_EXPECTED_TAGS}")
    if btype == "tool_use":
        tools.uses.append(_str(_required(block, "id", path + ".id"), path + ".id"))
        _str(_required(block, "name", path + ".name"), path + ".name")
        _dict(_required(block, "input", path + ".input"), path + ".input")
    elif btype == "tool_result":
        tools.results.append(_str(_required(block, "tool_use_id", path + ".tool_use_id"), path + ".tool_use_id"))
    elif btype == "image":
        check_image(block, path)
    return _text_of(block, path) if btype == "text" else marker(btype)


def _system(v: Any) -> str:
    if isinstance(v, str):
        return v
    if not isinstance(v, list):
        raise _bad("system", "Input should be a valid string or a list of text blocks")
    parts: list[str] = []
    for i, block in enumerate(v):
        path = f"system.{i}"
        block = _dict(block, path)
        btype = _required(block, "type", path + ".type")
        if btype != "text":
            raise _bad(path + ".type", "Input should be 'text'")
        parts.append(_text_of(block, path))
    return JOIN.join(parts)


@dataclass
class _ToolIds:
    """The tool_use ids and tool_result references of one turn (consecutive messages of one
    role are one turn: the API merges them)."""

    first: int                                        # index of the turn's first message
    role: str
    uses: list[str] = field(default_factory=list)
    results: list[str] = field(default_factory=list)


def _check_tool_pairs(turns: list[_ToolIds]) -> None:
    """As the real API: every tool_result answers a tool_use of the turn just before it, and
    every tool_use of an assistant turn that is followed by another turn is answered there."""
    for k, turn in enumerate(turns):
        prev = set(turns[k - 1].uses) if k and turns[k - 1].role == "assistant" else set()
        if unexpected := [i for i in turn.results if i not in prev]:
            raise _bad(f"messages.{turn.first}.content.0",
                       f"unexpected `tool_use_id` found in `tool_result` blocks: {', '.join(unexpected)}. "
                       "Each `tool_result` block must have a corresponding `tool_use` block in the previous message.")
    for k, turn in enumerate(turns):
        if turn.role == "assistant" and turn.uses and k + 1 < len(turns):
            answered = set(turns[k + 1].results)
            if missing := [i for i in turn.uses if i not in answered]:
                raise _bad(f"messages.{turns[k + 1].first}",
                           f"`tool_use` ids were found without `tool_result` blocks immediately after: "
                           f"{', '.join(missing)}. Each `tool_use` block must have a corresponding "
                           "`tool_result` block in the next message.")


def _messages(v: Any, allow_empty: bool = False) -> list[tuple[Role, str]]:
    """The conversation's turns. Consecutive messages of one role are accepted and merged
    (the real API has done so since 2024), and the first message may be an assistant's: the
    API refuses neither. Unknown block types and tool_result blocks that answer no tool_use
    are refused, as there."""
    items = _list(v, "messages")
    if not items and not allow_empty:
        raise _bad("messages", "at least one message is required")
    turns: list[tuple[Role, str]] = []
    tool_turns: list[_ToolIds] = []
    tooled = False          # a tool_use or tool_result block seen: the pairs are checked
    last = len(items) - 1
    for i, msg in enumerate(items):
        # the common message, exactly {"role": "user" | "assistant", "content": "<text>"}:
        # accepted without the readers' error paths (four strings a message); any other
        # shape is read field by field below, with the same errors as ever
        if type(msg) is dict and len(msg) == 2 and type(text := msg.get("content")) is str \
                and type(role := msg.get("role")) is str and role in _ROLES:
            if not tool_turns or tool_turns[-1].role != role:
                tool_turns.append(_ToolIds(i, role))
        else:
            role, text = _message(msg, f"messages.{i}", i, tool_turns)
            tooled = tooled or bool(tool_turns[-1].uses or tool_turns[-1].results)
        is_prefill = i == last and role == "assistant"
        if not text and not is_prefill:
            raise _bad(f"messages.{i}",
                       "all messages must have non-empty content except for the optional final assistant message")
        if is_prefill and text and text[-1].isspace():
            raise _bad(f"messages.{i}.content", "final assistant content cannot end with trailing whitespace")
        turns.append((cast(Role, role), text))   # checked above: user or assistant
    if tooled:   # no tool block: every turn's pairs are empty, nothing to check
        _check_tool_pairs(tool_turns)
    return turns


def _message(msg: Any, path: str, i: int, tool_turns: list[_ToolIds]) -> tuple[str, str]:
    """Message i read field by field: its role and text (its blocks' tool ids into its turn)."""
    msg = _dict(msg, path)
    _no_extras(msg, _MESSAGE_FIELDS, path + ".")
    role = _required(msg, "role", path + ".role")
    if not isinstance(role, str) or role not in _ROLES:
        raise _bad(path + ".role", "Input should be 'user' or 'assistant'")
    content = _required(msg, "content", path + ".content")
    if not tool_turns or tool_turns[-1].role != role:
        tool_turns.append(_ToolIds(i, role))
    if isinstance(content, str):
        return role, content
    if isinstance(content, list):
        pieces = [_block_text(b, f"{path}.content.{j}", tool_turns[-1]) for j, b in enumerate(content)]
        return role, pieces[0] if len(pieces) == 1 else JOIN.join(pieces)
    raise _bad(path + ".content", "Input should be a valid string or a list of content blocks")


def _stop_sequences(v: Any) -> tuple[str, ...]:
    seqs = _list(v, "stop_sequences")
    if len(seqs) > ANTHROPIC_MAX_STOP:   # each is scanned on every token: bounded, as OpenAI's stop
        raise _bad("stop_sequences", f"List should have at most {ANTHROPIC_MAX_STOP} items after validation, "
                                     f"not {len(seqs)}")
    for i, s in enumerate(seqs):
        _str(s, f"stop_sequences.{i}")
        if stop_too_long(s):
            raise _bad(f"stop_sequences.{i}", f"each stop sequence must be at most {MAX_STOP_BYTES} bytes")
        if not s.strip():
            raise _bad(f"stop_sequences.{i}", "each stop sequence must contain non-whitespace characters")
    return tuple(seqs)


def _metadata(v: Any) -> str | None:
    meta = _dict(v, "metadata")
    _no_extras(meta, _METADATA_FIELDS, "metadata.")
    user = meta.get("user_id")
    if user is None:
        return None
    _str(user, "metadata.user_id")
    if len(user) > 256:
        raise _bad("metadata.user_id", "String should have at most 256 characters")
    return user


_TOOL_CHOICES: Final = ("auto", "any", "tool", "none")


def _tools(body: dict[str, Any]) -> bool:
    """Check tools and tool_choice; True when tools are offered and may be called."""
    tools = body.get("tools")
    if tools is not None:
        tools = _list(tools, "tools")
        if len(tools) > MAX_TOOLS:
            raise _bad("tools", f"List should have at most {MAX_TOOLS} items after validation, not {len(tools)}")
        for i, tool in enumerate(tools):
            tool = _dict(tool, f"tools.{i}")
            name = _str(_required(tool, "name", f"tools.{i}.name"), f"tools.{i}.name")
            if len(name) > MAX_TOOL_NAME:
                raise _bad(f"tools.{i}.name", f"String should have at most {MAX_TOOL_NAME} characters")
            if (schema := tool.get("input_schema")) is not None:
                schema_json(_dict(schema, f"tools.{i}.input_schema"), f"tools.{i}.input_schema")
            if (desc := tool.get("description")) is not None:
                _str(desc, f"tools.{i}.description")
    choice = "auto"
    if (val := body.get("tool_choice")) is not None:
        val = _dict(val, "tool_choice")
        choice = _str(_required(val, "type", "tool_choice.type"), "tool_choice.type")
        if choice not in _TOOL_CHOICES:
            raise _bad("tool_choice.type", "Input should be 'auto', 'any', 'tool' or 'none'")
        if choice == "tool":
            _str(_required(val, "name", "tool_choice.name"), "tool_choice.name")
    return bool(tools) and choice != "none"


_THINKING_MIN_BUDGET: Final = 1024       # Anthropic's floor for thinking.budget_tokens


def _thinking(val: Any, max_tokens: int | None) -> None:
    """thinking is accepted (these models do not think) but refused where Anthropic refuses
    it: a budget under 1024, or one not below max_tokens (a generation request)."""
    val = _dict(val, "thinking")
    kind = _str(_required(val, "type", "thinking.type"), "thinking.type")
    if kind != "enabled":
        return
    budget = _required(val, "budget_tokens", "thinking.enabled.budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool):
        raise _bad("thinking.enabled.budget_tokens", "Input should be a valid integer")
    if budget < _THINKING_MIN_BUDGET:
        raise _bad("thinking.enabled.budget_tokens",
                   f"Input should be greater than or equal to {_THINKING_MIN_BUDGET}")
    if max_tokens is not None and budget >= max_tokens:
        raise ApiError(400, "invalid_request_error",
                       "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our "
                       "documentation at https://docs.claude.com/en/docs/build-with-claude/"
                       "extended-thinking#max-tokens-and-context-window-size")


def _forced_tool(body: dict[str, Any]) -> OutputConstraint | None:
    """tool_choice any or tool: the turn is one call, its input valid against the tool's
    input_schema."""
    choice = body.get("tool_choice")
    if not choice or choice["type"] not in ("any", "tool"):
        return None
    defs = [(t["name"], t.get("input_schema")) for t in body["tools"]]
    only = choice["name"] if choice["type"] == "tool" else None
    if only is not None and only not in {n for n, _ in defs}:
        raise _bad("tool_choice.name", f"Tool '{only}' not found in provided tools")
    return tool_call(defs, only, "tools")


def _output_config(val: Any) -> OutputConstraint | None:
    """output_config.format: a json_schema the answer's text must follow."""
    cfg = _dict(val, "output_config")
    _no_extras(cfg, _OUTPUT_CONFIG_FIELDS, "output_config.")
    if (effort := cfg.get("effort")) is not None:
        _str(effort, "output_config.effort")
    if (fmt := cfg.get("format")) is None:
        return None
    fmt = _dict(fmt, "output_config.format")
    _no_extras(fmt, _FORMAT_FIELDS, "output_config.format.")
    kind = _str(_required(fmt, "type", "output_config.format.type"), "output_config.format.type")
    if kind != "json_schema":
        raise _bad("output_config.format.type", "Input should be 'json_schema'")
    schema = _dict(_required(fmt, "schema", "output_config.format.schema"), "output_config.format.schema")
    return json_output(schema, "output_config.format.schema")


def _ignored(body: dict[str, Any], max_tokens: int | None) -> None:
    """Fields accepted for compatibility but not acted on; check their outer shape only."""
    if (val := body.get("thinking")) is not None:
        _thinking(val, max_tokens)
    if (tier := body.get("service_tier")) is not None and tier not in ("auto", "standard_only"):
        raise _bad("service_tier", "Input should be 'auto' or 'standard_only'")


def decode_body(body: bytes | memoryview) -> dict[str, Any]:
    """The body as a JSON object (parsed once, with orjson), or this API's 400."""
    try:
        obj = decode_object(body)
    except BodyError as exc:
        if exc.reason == "empty":
            msg = "Request body is empty; expected a JSON object"
        elif exc.reason == "invalid":
            msg = f"Request body is not valid JSON: {exc.detail}"
        else:
            msg = f"Request body must be a JSON object, got {exc.detail}"
        raise ApiError(400, "invalid_request_error", msg) from None
    return obj


def parse_request(body: bytes | memoryview, limits: ParseLimits) -> GenerationRequest:
    return parse_document(decode_body(body), limits)


def parse_document(obj: dict[str, Any], limits: ParseLimits) -> GenerationRequest:
    """Validate an already-decoded body (decode_body) into a GenerationRequest."""
    return _parse(obj, limits, _FIELDS, for_generation=True)


def parse_count_tokens(obj: dict[str, Any], limits: ParseLimits) -> GenerationRequest:
    """A POST /v1/messages/count_tokens body (no max_tokens, no sampling fields)."""
    return _parse(obj, limits, _COUNT_FIELDS, for_generation=False)


def parse_warmup(obj: dict[str, Any], limits: ParseLimits) -> GenerationRequest:
    """A POST /v1/zccp/warmup body: a Messages request whose max_tokens is optional and
    whose messages may be empty (a system prompt and tools alone)."""
    return _parse(obj, limits, _FIELDS, for_generation=False, allow_no_messages=True)


def _parse(obj: dict[str, Any], limits: ParseLimits, fields: frozenset[str], for_generation: bool,
           allow_no_messages: bool = False) -> GenerationRequest:
    _no_extras(obj, fields, "")
    model = _str(_required(obj, "model", "model"), "model")
    if for_generation or obj.get("max_tokens") is not None:
        max_tokens = _int(_required(obj, "max_tokens", "max_tokens"), "max_tokens", 1)
    else:
        max_tokens = 1
    turns = _messages(_required(obj, "messages", "messages"), allow_no_messages)

    # Optional fields: JSON null is treated as absent.
    get = obj.get
    system = _system(v) if (v := get("system")) is not None else ""
    stop = _stop_sequences(v) if (v := get("stop_sequences")) is not None else ()
    temperature = _unit(v, "temperature") if (v := get("temperature")) is not None else 1.0
    top_p = _unit(v, "top_p") if (v := get("top_p")) is not None else None
    temperature, top_p = effective_sampling(temperature, top_p)   # tiny ones are greedy
    top_k = _int(v, "top_k", 0) if (v := get("top_k")) is not None else None
    if top_k is not None and top_k > MAX_TOP_K:
        raise _bad("top_k", f"Input should be less than or equal to {MAX_TOP_K}")
    stream = get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("stream", "Input should be a valid boolean")
    user = _metadata(v) if (v := get("metadata")) is not None else None
    tool_use = _tools(obj)
    _ignored(obj, max_tokens if for_generation else None)
    constraint = _forced_tool(obj) if tool_use else None
    if (v := get("output_config")) is not None:
        fmt = _output_config(v)
        constraint = constraint or fmt
    marks = cache_marks(obj)

    if model not in limits.served_models:
        raise ApiError(404, "not_found_error", f"model: {model}", "model")
    if max_tokens > limits.max_tokens_cap:
        raise _bad("max_tokens", f"{max_tokens} > {limits.max_tokens_cap}, which is the maximum "
                   f"allowed number of output tokens for {model}")

    return GenerationRequest(
        api="anthropic",
        model=model,
        system=system,
        messages=merge_turns(turns),
        sampling=SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k or None,          # 0 means "no top-k limit"
            stop=stop,
            constraint=constraint,
        ),
        stream=bool(stream),
        user=user,
        tool_use=tool_use,
        cache_marks=marks,
    )


