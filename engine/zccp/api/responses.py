"""OpenAI Responses (`POST /v1/responses`), the stateless subset: the whole conversation in
`input`, the answer as output items, streamed as the API's semantic events.

The input items become the equivalent Chat Completions body (instructions: a system turn;
messages; `function_call` items: the assistant's tool_calls; `function_call_output`: tool
turns), which zccp.api.openai validates and samples as it does its own (forced tools,
JSON schemas, the chat template's tools); what only this API has is checked here, with
its own field names. Nothing is stored: `previous_response_id`, `store: true`,
`conversation` and `background` are refused with a 400 that says so.

Streamed events (what the official SDK's `responses.stream` and the Agents SDK read):
response.created, response.in_progress, then per output item response.output_item.added,
(message) response.content_part.added, response.output_text.delta*, response.output_text.done,
response.content_part.done, (function call) response.function_call_arguments.delta/.done,
response.output_item.done; and response.completed (response.incomplete at max_output_tokens).

Logprobs (`include: ["message.output_text.logprobs"]`, or `top_logprobs` > 0): the chat
path's (the sampler's, in the chat item shape: token, logprob, bytes, top_logprobs) on the
output_text part and on each response.output_text.delta / .done event.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Final

from ..shared_types import (
    ApiError,
    ChatInput,
    GenerationRequest,
    GenerationResult,
    TextDelta,
    ToolArgsDelta,
    ToolCall,
    ToolCallStart,
)
from . import openai
from .codec import ApiCodec
from .common import ParseLimits, dumps, random_id
from .openai.media import check_image_url
from .openai.parse import _known_only
from .openai.render import _error_obj, _logprob_items
from .openai.wording import (
    _arr, _bool, _empty_array, _err, _int, _invalid_value, _missing, _obj, _str, _type_err
)

_FIELDS: Final = frozenset({
    "model", "input", "instructions", "tools", "tool_choice", "max_output_tokens", "temperature", "top_p",
    "stream", "text", "user", "safety_identifier", "prompt_cache_key", "metadata", "parallel_tool_calls",
    "previous_response_id", "store", "conversation", "background", "prompt",
    "include", "top_logprobs",
    # accepted and ignored
    "truncation", "reasoning", "service_tier", "max_tool_calls", "stream_options",
})
_SHARED: Final = ("model", "temperature", "top_p", "stream", "user", "safety_identifier", "prompt_cache_key",
                  "metadata", "parallel_tool_calls")
_ROLES: Final = ("user", "system", "developer", "assistant")
_STATELESS: Final = "this server keeps no responses: send the whole conversation in 'input'"
_LOGPROBS: Final = "message.output_text.logprobs"    # the `include` entry that asks for them


def _refuse(param: str, what: str) -> ApiError:
    return _err(f"Invalid '{param}': {what} is not supported: {_STATELESS}.", param, "unsupported_value")


def _parts(content: Any, role: str, path: str) -> Any:
    """A message's content as chat content (a string, or chat parts)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _type_err(path, "one of a string or array of input content items", content)
    if not content:
        raise _empty_array(path)
    out: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        ppath = f"{path}[{j}]"
        part = _obj(part, ppath)
        ptype = part.get("type")
        if ptype in ("input_text", "output_text"):
            if "text" not in part:
                raise _missing(ppath + ".text")
            out.append({"type": "text", "text": _str(part["text"], ppath + ".text")})
        elif ptype == "refusal":
            out.append({"type": "text", "text": _str(part.get("refusal", ""), ppath + ".refusal")})
        elif ptype in ("input_image", "input_file", "input_audio") and role == "user":
            if ptype == "input_image" and part.get("image_url") is not None:
                check_image_url(_str(part["image_url"], ppath + ".image_url"), ppath + ".image_url")
            # the chat parts of the same kind: a marker for the built-in models, a 400 from a text-only hf model
            out.append({"input_image": {"type": "image_url", "image_url": {"url": ""}},
                        "input_file": {"type": "file", "file": {}},
                        "input_audio": {"type": "input_audio", "input_audio": {}}}[ptype])
        else:
            allowed = ("input_text", "input_image", "input_file") if role == "user" else ("input_text", "output_text")
            raise _invalid_value(ppath + ".type", ptype, allowed)
    return out


def _output_text(v: Any, path: str) -> str:
    """function_call_output.output: a string, or input_text parts."""
    if isinstance(v, str):
        return v
    parts = _parts(v, "tool", path)
    return "\n\n".join(p["text"] for p in parts)


def _messages(obj: dict[str, Any]) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    if (v := obj.get("instructions")) is not None:
        msgs.append({"role": "system", "content": _str(v, "instructions")})
    inp = obj["input"]
    if isinstance(inp, str):
        msgs.append({"role": "user", "content": inp})
        return msgs
    items = _arr(inp, "input")
    if not items:
        raise _empty_array("input")
    for i, item in enumerate(items):
        path = f"input[{i}]"
        item = _obj(item, path)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            if "role" not in item:
                raise _missing(path + ".role")
            role = _str(item["role"], path + ".role")
            if role not in _ROLES:
                raise _invalid_value(path + ".role", role, _ROLES)
            if "content" not in item:
                raise _missing(path + ".content")
            msgs.append({"role": role, "content": _parts(item["content"], role, path + ".content")})
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if key not in item:
                    raise _missing(f"{path}.{key}")
                _str(item[key], f"{path}.{key}")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = msgs[-1] if msgs else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)     # this turn's calls, together
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            for key in ("call_id", "output"):
                if key not in item:
                    raise _missing(f"{path}.{key}")
            msgs.append({"role": "tool", "tool_call_id": _str(item["call_id"], path + ".call_id"),
                         "content": _output_text(item["output"], path + ".output")})
        elif kind == "reasoning":
            continue                                  # this server's models produce none; nothing to replay
        elif kind == "item_reference":
            raise _refuse(path + ".type", "item_reference")
        else:
            raise _invalid_value(path + ".type", kind, ("message", "function_call", "function_call_output"))
    return msgs


def _tools(v: Any) -> list[dict[str, Any]]:
    out = []
    for i, t in enumerate(_arr(v, "tools")):
        path = f"tools[{i}]"
        t = _obj(t, path)
        if t.get("type") != "function":
            raise _err(f"Invalid value for '{path}.type': only 'function' tools are served here, not "
                       f"{t.get('type')!r}.", path + ".type", "invalid_value")
        if "name" not in t:
            raise _missing(path + ".name")
        fn = {"name": t["name"]}
        for key in ("description", "parameters"):
            if t.get(key) is not None:
                fn[key] = t[key]
        if t.get("strict") is not None:
            _bool(t["strict"], path + ".strict")
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(v: Any) -> Any:
    if isinstance(v, str):
        return v                                       # the chat parser checks the value
    c = _obj(v, "tool_choice")
    if c.get("type") != "function":
        raise _err(f"Invalid value for 'tool_choice.type': only 'function' is served here, not {c.get('type')!r}.",
                   "tool_choice.type", "invalid_value")
    if "name" not in c:
        raise _missing("tool_choice.name")
    return {"type": "function", "function": {"name": _str(c["name"], "tool_choice.name")}}


def _response_format(v: Any) -> dict[str, Any] | None:
    """text.format as a chat response_format (None: plain text)."""
    text = _obj(v, "text")
    if text.get("format") is None:
        return None
    f = _obj(text["format"], "text.format")
    kind = f.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise _invalid_value("text.format.type", kind, ("text", "json_object", "json_schema"))
    for key in ("name", "schema"):
        if key not in f:
            raise _missing("text.format." + key)
    js = {"name": f["name"], "schema": f["schema"]}
    if f.get("strict") is not None:
        js["strict"] = f["strict"]
    return {"type": "json_schema", "json_schema": js}


def chat_body(obj: dict[str, Any]) -> dict[str, Any]:
    """The Chat Completions body that asks the same of the model (raises this API's 400s)."""
    if "input" not in obj:
        raise _missing("input")
    chat: dict[str, Any] = {k: obj[k] for k in _SHARED if k in obj}
    chat["messages"] = _messages(obj)
    if (v := obj.get("tools")) is not None:
        chat["tools"] = _tools(v)
    if (v := obj.get("tool_choice")) is not None:
        chat["tool_choice"] = _tool_choice(v)
    if (v := obj.get("max_output_tokens")) is not None:
        chat["max_tokens"] = _int(v, "max_output_tokens", 1)
    if (v := obj.get("text")) is not None and (rf := _response_format(v)) is not None:
        chat["response_format"] = rf
    return chat | _logprobs(obj)


def _logprobs(obj: dict[str, Any]) -> dict[str, Any]:
    """include's logprobs entry (or top_logprobs > 0) as the chat body's logprobs fields."""
    include = [_str(x, f"include[{i}]") for i, x in enumerate(_arr(obj["include"], "include"))] \
        if obj.get("include") is not None else []
    top = obj.get("top_logprobs")
    if _LOGPROBS in include or (top is not None and _int(top, "top_logprobs", 0) > 0):
        return {"logprobs": True, "top_logprobs": top} if top is not None else {"logprobs": True}
    if top is not None:
        _int(top, "top_logprobs", 0)
    return {}


def parse_document(obj: dict[str, Any], limits: ParseLimits) -> GenerationRequest:
    _known_only(obj, _FIELDS)
    if obj.get("previous_response_id") is not None:
        raise _refuse("previous_response_id", "previous_response_id")
    if (v := obj.get("store")) is not None and _bool(v, "store"):
        raise _refuse("store", "store: true")
    if obj.get("conversation") is not None:
        raise _refuse("conversation", "conversation")
    if (v := obj.get("background")) is not None and _bool(v, "background"):
        raise _err("Invalid 'background': background responses are not supported here.", "background",
                   "unsupported_value")
    if obj.get("prompt") is not None:
        raise _err("Invalid 'prompt': stored prompt templates are not supported here.", "prompt",
                   "unsupported_value")
    req = openai.parse_document(chat_body(obj), limits)
    fmt = (obj.get("text") or {}).get("format") or {"type": "text"}
    echo = {
        "instructions": obj.get("instructions"), "tools": obj.get("tools") or [],
        "tool_choice": obj.get("tool_choice") or "auto", "temperature": obj.get("temperature", 1.0),
        "top_p": obj.get("top_p", 1.0), "max_output_tokens": obj.get("max_output_tokens"),
        "parallel_tool_calls": obj.get("parallel_tool_calls", True), "metadata": obj.get("metadata") or {},
        "text": {"format": fmt}, "user": obj.get("user"),
    }
    return replace(req, api="responses", echo=echo)


def chat_input(obj: dict[str, Any]) -> ChatInput:
    return openai.chat_input(chat_body(obj))


# --- rendering ---

def new_response_id() -> str:
    return random_id("resp_", 32)


def _usage(r: GenerationResult) -> dict[str, Any]:
    return {"input_tokens": r.input_tokens, "input_tokens_details": {"cached_tokens": r.cached_tokens},
            "output_tokens": r.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": r.input_tokens + r.output_tokens}


def _response(req: GenerationRequest, rid: str, created: int, status: str, output: list[dict[str, Any]],
              result: GenerationResult | None) -> dict[str, Any]:
    incomplete = result is not None and result.stop_reason == "max_tokens"
    return {
        "id": rid, "object": "response", "created_at": created, "status": status,
        "background": False, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "model": req.model, "output": output, "previous_response_id": None, "reasoning": None,
        "service_tier": "default", "store": False, "truncation": "disabled",
        "usage": _usage(result) if result is not None else None,
        **(req.echo or {}),
    }


def _status(result: GenerationResult) -> str:
    return "incomplete" if result.stop_reason == "max_tokens" else "completed"


def _message(mid: str, text: str, status: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "message", "id": mid, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}]}


def _call(fid: str, call_id: str, call: ToolCall, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": fid, "call_id": call_id, "name": call.name,
            "arguments": call.arguments, "status": status}


def _call_status(call: ToolCall) -> str:
    return "incomplete" if call.truncated else "completed"


def _output(result: GenerationResult) -> list[dict[str, Any]]:
    """The output items: the message (when there is text, or nothing else), then each call."""
    out = []
    if result.text or not result.tool_calls:
        lps = _logprob_items(result.logprobs) if result.logprobs else None
        out.append(_message(random_id("msg_", 32), result.text, _status(result), lps))
    out += [_call(fid, cid, c, _call_status(c)) for (fid, cid), c in zip(_ids(len(result.tool_calls)),
                                                                         result.tool_calls, strict=True)]
    return out


def _ids(n: int) -> list[tuple[str, str]]:
    return [(random_id("fc_", 32), random_id("call_")) for _ in range(n)]


def render_response(req: GenerationRequest, result: GenerationResult, response_id: str, created: int) -> bytes:
    output = _output(result)
    return dumps(_response(req, response_id, created, _status(result), output, result))


class StreamEncoder:
    """The semantic events of one streamed response; each event numbered (sequence_number).
    The final response's output is the items announced, in their order, with their ids."""

    __slots__ = ("_req", "_rid", "_created", "_seq", "_items", "_text", "_lps", "_call")

    def __init__(self, req: GenerationRequest, response_id: str, created: int, input_tokens: int,
                 cached_tokens: int = 0) -> None:
        del input_tokens, cached_tokens  # usage comes from the final GenerationResult
        self._req, self._rid, self._created = req, response_id, int(created)
        self._seq = 0
        self._items: list[dict[str, Any]] = []     # the output items so far, as the final response has them
        self._text: list[str] | None = None        # the open message's text (None: no message open)
        self._lps: list[dict[str, Any]] = []       # the open message's logprobs, as streamed
        self._call: int | None = None              # the open function_call item's index

    def _event(self, kind: str, **data: Any) -> bytes:
        payload = dumps({"type": kind, "sequence_number": self._seq, **data})
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + payload + b"\n\n"

    def start(self) -> bytes:
        r = _response(self._req, self._rid, self._created, "in_progress", [], None)
        return self._event("response.created", response=r) + self._event("response.in_progress", response=r)

    def _open_message(self) -> bytes:
        mid = random_id("msg_", 32)
        self._text = []
        self._items.append(_message(mid, "", "in_progress"))
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        i = len(self._items) - 1
        return (self._event("response.output_item.added", output_index=i, item={**self._items[i], "content": []})
                + self._event("response.content_part.added", item_id=mid, output_index=i, content_index=0,
                              part=part))

    def _close_message(self, status: str = "completed") -> bytes:
        assert self._text is not None
        text, self._text = "".join(self._text), None
        lps, self._lps = self._lps, []
        i = len(self._items) - 1
        mid = self._items[i]["id"]
        self._items[i] = item = _message(mid, text, status, lps)
        return (self._event("response.output_text.done", item_id=mid, output_index=i, content_index=0, text=text,
                            logprobs=lps)
                + self._event("response.content_part.done", item_id=mid, output_index=i, content_index=0,
                              part=item["content"][0])
                + self._event("response.output_item.done", output_index=i, item=item))

    def delta(self, d: TextDelta) -> bytes:
        # the last tokens' logprobs may come alone: with the open message's, else (a call's tokens) dropped
        if not d.text and (not d.logprobs or self._text is None):
            return b""
        out = b"" if self._text is not None else self._open_message()
        assert self._text is not None
        self._text.append(d.text)
        lps = _logprob_items(d.logprobs) if d.logprobs else []
        self._lps += lps
        return out + self._event("response.output_text.delta", item_id=self._items[-1]["id"],
                                 output_index=len(self._items) - 1, content_index=0, delta=d.text, logprobs=lps)

    def tool_start(self, start: ToolCallStart) -> bytes:
        """A function_call item opens (its arguments stream, tool_args())."""
        out = self._close_message() if self._text is not None else b""
        fid, cid = _ids(1)[0]
        self._items.append({"type": "function_call", "id": fid, "call_id": cid, "name": start.name,
                            "arguments": "", "status": "in_progress"})
        self._call = len(self._items) - 1
        return out + self._event("response.output_item.added", output_index=self._call, item=self._items[-1])

    def tool_args(self, piece: ToolArgsDelta) -> bytes:
        if not piece.text or self._call is None:
            return b""
        return self._event("response.function_call_arguments.delta", item_id=self._items[self._call]["id"],
                           output_index=self._call, delta=piece.text)

    def tool_call(self, call: ToolCall) -> bytes:
        """The call is complete (or cut short: status incomplete); one not streamed (an
        upstream's) opens and sends its arguments in one delta first."""
        out = b""
        if self._call is None:
            out = self.tool_start(ToolCallStart(call.name)) + self.tool_args(ToolArgsDelta(call.arguments))
        assert self._call is not None
        i, self._call = self._call, None
        opened = self._items[i]
        self._items[i] = item = _call(opened["id"], opened["call_id"], call, _call_status(call))
        return out + (
            self._event("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                        name=call.name, arguments=call.arguments)
            + self._event("response.output_item.done", output_index=i, item=item))

    def finish(self, result: GenerationResult) -> bytes:
        status = _status(result)
        out = b""
        if self._text is None and not self._items:
            out += self._open_message()                 # an empty answer is an empty message
        if self._text is not None:
            out += self._close_message(status)
        r = _response(self._req, self._rid, self._created, status, list(self._items), result)
        return out + self._event("response.completed" if status == "completed" else "response.incomplete",
                                 response=r)

    def error(self, err: ApiError) -> bytes:
        body = _error_obj(err)["error"]
        return self._event("error", code=body.get("code") or body.get("type"), message=body["message"],
                           param=body.get("param"))


CODEC: Final = ApiCodec(
    name="responses", decode=openai.decode_body, parse=parse_document, render=render_response,
    stream=StreamEncoder, render_error=openai.render_error, http_status=openai.http_status,
    new_response_id=new_response_id, chat_input=chat_input, render_models=openai.render_models,
    render_model=openai.render_model,
)
