"""Client half of scripts/compose-smoke.sh: talks to the compose stack on 127.0.0.1 only.

  compose_smoke.py health                  print /health's JSON; exit 0 when it is 200
  compose_smoke.py sdks                    both APIs through the official SDKs, streams, cache HIT
  compose_smoke.py cache-pair A B          two requests that differ only in A/B: print the 2nd's X-ZCCP-Cache
  compose_smoke.py mask-add FILE           add the smoke's mask to a mask_patterns.lua
  compose_smoke.py h2 CERT                 over HTTPS + HTTP/2 (CERT: the CA to trust): a 512 KiB body,
                                           a stream and a cache HIT, each answered on HTTP/2
  compose_smoke.py engines NAME...         8 conversations of 3 turns: each conversation's turns answered
                                           by one engine (X-ZCCP-Engine), the engines seen exactly NAME...
  compose_smoke.py keys CERT KEY           auth.mode keys: a wrong key is the SDKs' AuthenticationError,
                                           KEY (rpm 4) is served with the rate-limit headers, then
                                           RateLimitError with retry-after

ZCCP_URL (default http://127.0.0.1:8080) says where. Exit status 1 with a message on failure.
"""

from __future__ import annotations

import json
import os
import sys

import httpx

URL = os.environ.get("ZCCP_URL", "http://127.0.0.1:8080")
MODEL = "zccp-tiny"
SMOKE_MASK = """    {
        -- added by scripts/compose-smoke.sh (removed again when it ends)
        name = "compose_smoke",
        pattern = [[\\bsmoke-ticket-[a-z]+\\b]],
        replacement = "<smoke-ticket>",
    },
"""


def fail(msg: str) -> None:
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def health() -> tuple[int, dict]:
    try:
        r = httpx.get(f"{URL}/health", timeout=3)
    except httpx.HTTPError as exc:
        return 0, {"error": str(exc)}
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, {"body": r.text[:200]}


def cmd_health() -> None:
    code, body = health()
    print(json.dumps(body))
    sys.exit(0 if code == 200 else 1)


def cmd_sdks() -> None:
    import anthropic
    import openai

    claude = anthropic.Anthropic(base_url=URL, api_key="unused", max_retries=0, timeout=60)
    msgs = [{"role": "user", "content": "Compose smoke: say something."}]
    # This SDK's create() has no temperature argument any more; the API still takes it.
    greedy = {"extra_body": {"temperature": 0}}
    raw = claude.messages.with_raw_response.create(model=MODEL, max_tokens=24, messages=msgs, **greedy)
    msg = raw.parse()
    if msg.type != "message" or msg.content[0].type != "text" or msg.usage.output_tokens < 1:
        fail(f"anthropic: unexpected message {msg!r}")
    again = claude.messages.with_raw_response.create(model=MODEL, max_tokens=24, messages=msgs, **greedy)
    if again.headers.get("x-zccp-cache") != "HIT":
        fail(f"anthropic: repeated request: X-ZCCP-Cache {again.headers.get('x-zccp-cache')!r}, expected HIT")
    if again.parse().content[0].text != msg.content[0].text:
        fail("anthropic: the cache HIT's text differs from the first answer")
    print(f"anthropic: message ok ({msg.usage.output_tokens} tokens), repeat X-ZCCP-Cache: HIT")

    # Greedy: the tiny model's output is noise, and a sampled one may end at once.
    with claude.messages.stream(model=MODEL, max_tokens=24, messages=[
            {"role": "user", "content": "Compose smoke: stream, please."}], **greedy) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    if not pieces or "".join(pieces) != final.content[0].text or final.stop_reason is None:
        fail(f"anthropic: stream {len(pieces)} deltas, final {final!r}")
    print(f"anthropic: stream ok ({len(pieces)} text deltas, stop_reason {final.stop_reason})")

    oai = openai.OpenAI(base_url=f"{URL}/v1", api_key="unused", max_retries=0, timeout=60)
    omsgs = [{"role": "user", "content": "Compose smoke: OpenAI side."}]
    raw = oai.chat.completions.with_raw_response.create(model=MODEL, max_tokens=24, temperature=0, messages=omsgs)
    comp = raw.parse()
    if comp.choices[0].message.content is None or comp.usage.completion_tokens < 1:
        fail(f"openai: unexpected completion {comp!r}")
    again = oai.chat.completions.with_raw_response.create(model=MODEL, max_tokens=24, temperature=0, messages=omsgs)
    if again.headers.get("x-zccp-cache") != "HIT":
        fail(f"openai: repeated request: X-ZCCP-Cache {again.headers.get('x-zccp-cache')!r}, expected HIT")
    print(f"openai: completion ok ({comp.usage.completion_tokens} tokens), repeat X-ZCCP-Cache: HIT")

    chunks = list(oai.chat.completions.create(
        model=MODEL, max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Compose smoke: OpenAI stream."}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = [c.usage for c in chunks if c.usage]
    if not text or not usage or usage[-1].completion_tokens < 1:
        fail(f"openai: stream of {len(chunks)} chunks, text {text!r}, usage {usage!r}")
    print(f"openai: stream ok ({len(chunks)} chunks, usage {usage[-1].completion_tokens} tokens)")


def cmd_cache_pair(a: str, b: str) -> None:
    """The second request's cache result: HIT only if a mask makes A and B the same key."""
    results = []
    for word in (a, b):
        body = {"model": MODEL, "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": f"Describe {word} in one line."}]}
        r = httpx.post(f"{URL}/v1/messages", json=body, timeout=60)
        if r.status_code != 200:
            fail(f"cache-pair {word}: HTTP {r.status_code}: {r.text[:200]}")
        results.append(r.headers.get("x-zccp-cache"))
    print(results[1])


def cmd_mask_add(path: str) -> None:
    text = open(path, encoding="utf-8").read()
    end = text.rstrip().rfind("}")
    if end < 0 or "compose_smoke" in text:
        fail(f"{path}: no closing brace, or the smoke's mask is already there")
    with open(path, "r+", encoding="utf-8") as f:  # in place: same inode
        f.write(text[:end] + SMOKE_MASK + text[end:])
        f.truncate()


def cmd_h2(cert: str) -> None:
    """The TLS + HTTP/2 listener (server.tls, http2): the three things issue 21 names."""
    with httpx.Client(base_url=URL, http2=True, verify=cert, timeout=60) as c:
        body = {"model": MODEL, "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": "Compose smoke over HTTP/2."}]}
        head = json.dumps(body).encode()
        # 512 KiB exactly, padded with JSON whitespace: above the 64 KiB decode limit, so nginx
        # takes it through its HTTP/2 body path (the request socket does not exist on HTTP/2).
        big = c.post("/v1/messages", content=head[:-1] + b" " * (512 * 1024 - len(head)) + b"}",
                     headers={"content-type": "application/json"})
        if big.http_version != "HTTP/2" or big.status_code != 200 or big.json().get("type") != "message":
            fail(f"h2: 512 KiB body: {big.http_version} {big.status_code} {big.text[:200]}")
        first = c.post("/v1/messages", json=body)
        again = c.post("/v1/messages", json=body)
        if again.http_version != "HTTP/2" or again.headers.get("x-zccp-cache") != "HIT" \
                or again.json()["content"] != first.json()["content"]:
            fail(f"h2: repeated request: {again.http_version} X-ZCCP-Cache {again.headers.get('x-zccp-cache')!r}")
        with c.stream("POST", "/v1/messages", json={**body, "stream": True, "messages": [
                {"role": "user", "content": "Compose smoke: an HTTP/2 stream."}]}) as r:
            events = [ln for ln in r.iter_lines() if ln.startswith("event: ")]
            if r.http_version != "HTTP/2" or r.status_code != 200 or events[-1:] != ["event: message_stop"]:
                fail(f"h2: stream {r.http_version} {r.status_code}, events {events[-3:]}")
    print(f"h2: 512 KiB body 200, cache HIT, stream of {len(events)} events, all on HTTP/2 + TLS")


def cmd_keys(cert: str, key: str) -> None:
    """Keys on in the compose stack (docs/keys.md): nginx verifies keys and counts limits in the
    compose network's Redis, reached by its service name."""
    import anthropic
    import openai

    msg = [{"role": "user", "content": "Compose smoke with keys."}]

    def clients(api_key: str) -> tuple[anthropic.Anthropic, openai.OpenAI]:
        # each SDK's own client class (anthropic's is on another httpx than openai's)
        return (anthropic.Anthropic(base_url=URL, api_key=api_key, max_retries=0, timeout=60,
                                    http_client=anthropic.DefaultHttpxClient(verify=cert)),
                openai.OpenAI(base_url=URL + "/v1", api_key=api_key, max_retries=0, timeout=60,
                              http_client=openai.DefaultHttpxClient(verify=cert)))

    claude, gpt = clients("zk_not_a_key_of_this_stack")
    try:
        claude.messages.create(model=MODEL, max_tokens=4, messages=msg)
        fail("keys: a wrong key was served (anthropic)")
    except anthropic.AuthenticationError:
        pass
    try:
        gpt.chat.completions.create(model=MODEL, max_tokens=4, messages=msg)
        fail("keys: a wrong key was served (openai)")
    except openai.AuthenticationError:
        pass
    claude, gpt = clients(key)
    raw = claude.messages.with_raw_response.create(model=MODEL, max_tokens=4, messages=msg)
    limit = raw.headers.get("anthropic-ratelimit-requests-limit")
    if raw.parse().type != "message" or limit != "4":
        fail(f"keys: anthropic answer {raw.status_code}, limit header {limit!r}")
    raw = gpt.chat.completions.with_raw_response.create(model=MODEL, max_tokens=4, messages=msg)
    limit = raw.headers.get("x-ratelimit-limit-requests")
    if raw.parse().object != "chat.completion" or limit != "4":
        fail(f"keys: openai answer {raw.status_code}, limit header {limit!r}")
    for _ in range(8):   # rpm 4: two were spent above
        try:
            claude.messages.create(model=MODEL, max_tokens=4, messages=msg)
        except anthropic.RateLimitError as exc:
            if not exc.response.headers.get("retry-after"):
                fail("keys: a 429 without retry-after")
            break
    else:
        fail("keys: rpm 4 never answered 429")
    print("keys: wrong key 401 on both SDKs, the key served with its rate-limit headers, then 429 + retry-after")


def cmd_engines(*names: str) -> None:
    """Two engine containers behind one nginx (profile `two`, docs/engines.md)."""
    seen: set[str] = set()
    with httpx.Client(base_url=URL, timeout=60) as c:
        for conv in range(8):
            msgs: list[dict] = []
            served = set()
            for turn in range(3):
                msgs.append({"role": "user", "content": f"Compose smoke conversation {conv}, turn {turn}."})
                r = c.post("/v1/messages", json={"model": MODEL, "max_tokens": 8, "temperature": 0, "messages": msgs})
                if r.status_code != 200 or not r.headers.get("x-zccp-engine"):
                    fail(f"engines: conversation {conv} turn {turn}: {r.status_code} "
                         f"X-ZCCP-Engine {r.headers.get('x-zccp-engine')!r} {r.text[:200]}")
                served.add(r.headers["x-zccp-engine"])
                text = "".join(b.get("text", "") for b in r.json()["content"])
                msgs.append({"role": "assistant", "content": text or "..."})
            if len(served) != 1:
                fail(f"engines: conversation {conv}'s turns went to {sorted(served)}")
            seen |= served
    if seen != set(names):
        fail(f"engines: answered by {sorted(seen)}, expected {sorted(names)}")
    print(f"engines: 8 conversations x 3 turns, each on one engine; engines {sorted(seen)}")


if __name__ == "__main__":
    cmds = {"health": cmd_health, "sdks": cmd_sdks, "cache-pair": cmd_cache_pair,
            "mask-add": cmd_mask_add, "h2": cmd_h2,
            "keys": cmd_keys, "engines": cmd_engines}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        fail(__doc__)
    cmds[sys.argv[1]](*sys.argv[2:])
