"""Builds the labelled pairs of every category (bodies, true Jaccard, expectation)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Callable

from zccp.cache.fingerprint import MAX_TOKENS, compute, decode_request, estimate_jaccard
from zccp.cache.fp.csf import _TOKEN_RE

from bench.cache_eval import conversations as C
from bench.cache_eval import variants as V
from bench.cache_eval.jaccard import masks, pair_jaccard
from bench.cache_eval.prompts import Base, Pool

MODEL = C.MODEL
APIS = ("anthropic", "openai")

# Expectations:
#   "J"      a hit is wanted iff true Jaccard >= 0.85 (near-duplicate categories)
#   "exact"  identical after masking/canonicalisation: an exact HIT is wanted
#   "never"  must never hit (other parameters; prompts the fingerprint did not fully see)
CATEGORIES: list[tuple[str, str, str]] = [
    # name, expectation, what
    ("mask_id", "exact", "a long numeric ID (P1234567, 23456789) and/or a UUID planted in the prompt, changed"),
    ("mask_timestamp", "exact", "an ISO-8601 date+time, epoch seconds or epoch millis planted, changed"),
    ("mask_email", "exact", "an e-mail address planted, changed"),
    ("control_excluded", "exact",
     "same prompt; only stream / metadata / JSON formatting / 0 vs 0.0 / a null member differ"),
    ("whitespace", "J", "spaces doubled, newlines<->spaces, tabs, CRLF, indent, leading/trailing whitespace"),
    ("punctuation", "J", "end mark added/removed, marks swapped, commas dropped/added, a word quoted"),
    ("case", "J", "lower, UPPER, Title Words, sentence case, swapcase of some words (Python str methods)"),
    ("one_word_edit", "J", "one word substituted, deleted or inserted"),
    ("appended_sentence", "J", "one short sentence appended"),
    ("openai", "J", "whitespace / one-word / mask / appended variants through /v1/chat/completions"),
    ("mask_in_system", "J", "system prompt carrying a timestamp that changes (+ a whitespace change in the user turn)"),
    ("params", "never", "same or whitespace-equal prompt, one parameter changed (temperature, max_tokens, stop, "
                        "system, top_k, top_p, tools, tool_choice, thinking, seed, penalties, API)"),
    ("long_exact", "exact", "prompts > 1024 tokens: exact repeat, or a masked ID changed"),
    ("long_near", "never",
     "prompts > 1024 tokens: whitespace / one word / appended sentence (near hit must NOT be served)"),
    ("unrelated", "never", "natural ShareGPT first turns (only exact duplicates removed) queried with `Cache-Control: "
                           "no-store` against a cache holding other natural first turns; a query is a false hit "
                           "when it "
                           "hits although no stored prompt has J >= 0.85 with it"),
    # fingerprint version 2: agents, tools, images, documents, tenants, conversations (both APIs, alternating)
    ("agent_loop", "never", "a coding-agent loop one step later: the same conversation plus one more tool round "
                            "(tool_use + tool_result / tool_calls + tool message); outputs are ShareGPT answers"),
    ("agent_repeat", "exact", "the same agent request again (control)"),
    ("tool_result", "never", "the same agent step, the last tool output different (one word, or another output)"),
    ("tool_call_round", "never", "the same agent step, the last tool call's arguments different, the same output "
                                 "(Anthropic tool_use input / OpenAI tool_calls arguments)"),
    ("image_bytes", "never", "the same question with other image bytes (one byte flipped, or another image; "
                             "Anthropic base64 image / OpenAI data URL)"),
    ("document_bytes", "never", "the same question with other document bytes (Anthropic base64 PDF / OpenAI file)"),
    ("multi_user_masked", "never", "a masked value (ID, UUID, timestamp, e-mail) changed, sent with another API key "
                                   "(another tenant)"),
    ("multi_turn_chat", "J", "a real ShareGPT conversation (question, answer, next question), the final question "
                             "reworded (whitespace, punctuation, case, one word, a sentence appended)"),
    ("history_edit", "never", "the same final question after an earlier turn changed by one word (version 2: the "
                              "history must match exactly)"),
]
EXPECT = {name: e for name, e, _ in CATEGORIES}
WHAT = {name: w for name, _, w in CATEGORIES}


@dataclass
class Pair:
    category: str
    kind: str
    api_base: str
    base: bytes
    api_var: str
    variant: bytes
    jaccard: float
    ntok_base: int
    ntok_var: int
    expect: str
    var_headers: dict[str, str] | None = None
    base_headers: dict[str, str] | None = None
    compared: str = "turn"            # what J is over: the final user turns, or whole conversations
    # local model of the engine's decision (zccp.cache.fingerprint in Python)
    same_exact_key: bool = False
    est: float = 0.0                  # MinHash estimate between the two final turns
    verified_j: float = 0.0           # the engine's exact check: Jaccard of the two turns' shingle-hash sets
    shared_band: bool = False
    complete: bool = True             # both fingerprints allow near hits
    same_csf: bool = False
    same_scope: bool = True           # the same API and prefix key (every parameter, the history)
    masked: bool = False              # a mask changed either request
    same_tenant: bool = True
    # live results (after: this checkout; before: the baseline commit, same run)
    base_cache: str = ""
    confirm_first: str = ""
    confirm_tries: int = 0
    var_status: int = 0
    var_retries: int = 0              # variants asked again after a Redis ERROR
    var_cache: str = ""
    similarity: float | None = None
    before_cache: str = ""
    before_similarity: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def dumps(obj: Any, **kw: Any) -> bytes:
    kw.setdefault("ensure_ascii", False)
    kw.setdefault("separators", (",", ":"))
    return json.dumps(obj, **kw).encode("utf-8", "surrogatepass")


def anth(text: str, max_tokens: int, **extra: Any) -> dict:
    return C.body("anthropic", [{"role": "user", "content": text}], max_tokens, **extra)


def oai(text: str, max_tokens: int, **extra: Any) -> dict:
    return C.body("openai", [{"role": "user", "content": text}], max_tokens, **extra)


def _tenant(headers: dict | None) -> str | None:
    return (headers or {}).get("x-api-key")


def _mk(category: str, kind: str, api_b: str, body_b: dict, api_v: str, body_v: dict, *,
        raw_b: bytes | None = None, raw_v: bytes | None = None, headers: dict | None = None,
        base_headers: dict | None = None) -> Pair:
    j, nb, nv, what = pair_jaccard(api_b, body_b, api_v, body_v)
    p = Pair(category, kind, api_b, raw_b if raw_b is not None else dumps(body_b), api_v,
             raw_v if raw_v is not None else dumps(body_v), j, nb, nv, EXPECT[category], headers, base_headers, what)
    p.same_tenant = _tenant(headers) == _tenant(base_headers)
    fb, fv = compute(api_b, p.base, masks()), compute(api_v, p.variant, masks())
    if fb is not None and fv is not None:
        p.same_exact_key = api_b == api_v and fb.exact_key == fv.exact_key
        p.same_scope = api_b == api_v and fb.prefix_key == fv.prefix_key
        p.masked = fb.masked or fv.masked
        p.complete = fb.near and fv.near
        if p.complete:
            p.est = estimate_jaccard(fb.signature, fv.signature)
            p.shared_band = any(x == y for x, y in zip(fb.bands, fv.bands, strict=True))
            p.same_csf = fb.csf_key == fv.csf_key
            p.verified_j = verified_jaccard(api_b, p.base, api_v, p.variant)
    return p


def verified_jaccard(api_a: str, raw_a: bytes, api_b: str, raw_b: bytes) -> float:
    """The Jaccard of the two final turns' word 2-shingle sets, in the fingerprint's 1024-token
    window: what fingerprint version 2's engine checked a near candidate with (the engine now
    checks the meaning instead: zccp.cache.meaning, bench/cache_eval/meaning.py)."""
    from bench.cache_eval.jaccard import jaccard, masked_turn, shingles, tokens_of
    da, db = decode_request(api_a, raw_a), decode_request(api_b, raw_b)
    ta = masked_turn(da) if da is not None else None
    tb = masked_turn(db) if db is not None else None
    if ta is None or tb is None:
        return 0.0
    return jaccard(shingles(tokens_of(ta)[:MAX_TOKENS]), shingles(tokens_of(tb)[:MAX_TOKENS]))


def _text_pairs(category: str, gen: Callable, bases: list[Base], mt: int, rng: random.Random) -> list[Pair]:
    out = []
    for b in bases:
        for _ in range(4):
            kind, bt, vt = gen(rng, b.text)
            if bt != vt:
                break
        else:
            continue
        out.append(_mk(category, kind, "anthropic", anth(bt, mt), "anthropic", anth(vt, mt)))
    return out


def _openai_pairs(bases: list[Base], mt: int, rng: random.Random) -> list[Pair]:
    gens = [V.whitespace, V.one_word_edit, V.mask_id, V.appended_sentence]
    out = []
    for i, b in enumerate(bases):
        gen = gens[i % len(gens)]
        kind, bt, vt = gen(rng, b.text)
        if bt == vt:
            continue
        out.append(_mk("openai", gen.__name__ + ":" + kind, "openai", oai(bt, mt), "openai", oai(vt, mt)))
    return out


def _control_pairs(bases: list[Base], mt: int, rng: random.Random) -> list[Pair]:
    kinds = ["stream", "metadata", "json_formatting", "number_form", "null_member"]
    out = []
    for i, b in enumerate(bases):
        kind = kinds[i % len(kinds)]
        base = anth(b.text, mt)
        raw_v = None
        if kind == "stream":
            var = dict(base, stream=True)
        elif kind == "metadata":
            var = dict(base, metadata={"user_id": f"user-{rng.randrange(10**6)}"})
        elif kind == "json_formatting":
            var = dict(reversed(list(base.items())))     # other member order, escapes, indentation
            raw_v = json.dumps(var, ensure_ascii=True, indent=2).encode()
        elif kind == "number_form":
            var = base
            raw_v = dumps(base).replace(b'"temperature":0', b'"temperature":0.0e0', 1)
        else:
            var = dict(base, top_p=None, stop_sequences=None)
        out.append(_mk("control_excluded", kind, "anthropic", base, "anthropic", var, raw_v=raw_v))
    return out


_TOOL_A = {"name": "get_weather", "description": "Current weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
_TOOL_O = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
ANTH_CHANGES: dict[str, Callable[[dict], dict]] = {
    "temperature": lambda b: dict(b, temperature=0.7),
    "max_tokens": lambda b: dict(b, max_tokens=b["max_tokens"] + 1),
    "stop_sequences": lambda b: dict(b, stop_sequences=["\n\nHuman:"]),
    "system": lambda b: dict(b, system="You are a terse assistant."),
    "top_k": lambda b: dict(b, top_k=5),
    "top_p": lambda b: dict(b, top_p=0.9),
    "tools": lambda b: dict(b, tools=[_TOOL_A]),
    "tool_choice": lambda b: dict(b, tool_choice={"type": "any"}),
    "thinking": lambda b: dict(b, thinking={"type": "enabled", "budget_tokens": 1024}),
}
OAI_CHANGES: dict[str, Callable[[dict], dict]] = {
    "temperature": lambda b: dict(b, temperature=0.7),
    "max_tokens": lambda b: dict(b, max_tokens=b["max_tokens"] + 1),
    "stop": lambda b: dict(b, stop=["\n\n"]),
    "seed": lambda b: dict(b, seed=7),
    "top_p": lambda b: dict(b, top_p=0.9),
    "presence_penalty": lambda b: dict(b, presence_penalty=0.5),
    "frequency_penalty": lambda b: dict(b, frequency_penalty=0.5),
    "tools": lambda b: dict(b, tools=[_TOOL_O]),
    "system_message": lambda b: dict(b, messages=[{"role": "system", "content": "You are a terse assistant."}]
                                     + b["messages"]),
}


def _param_pairs(bases: list[Base], mt: int, rng: random.Random) -> list[Pair]:
    out: list[Pair] = []
    a_kinds, o_kinds = list(ANTH_CHANGES) + ["api"], list(OAI_CHANGES) + ["api"]
    for i, b in enumerate(bases):
        near = i % 2 == 1                      # half: the variant's prompt also differs in whitespace only (J = 1)
        vtext = b.text + "\n" if near else b.text
        form = "near_prompt" if near else "same_prompt"
        if i % 3 == 2:                         # a third through the OpenAI API
            kind = o_kinds[(i // 3) % len(o_kinds)]
            base = oai(b.text, mt)
            if kind == "api":
                out.append(_mk("params", f"openai:api->anthropic/{form}", "openai", base, "anthropic", anth(vtext, mt)))
            else:
                out.append(_mk("params", f"openai:{kind}/{form}", "openai", base, "openai",
                               OAI_CHANGES[kind](oai(vtext, mt))))
        else:
            kind = a_kinds[i % len(a_kinds)]
            base = anth(b.text, mt)
            if kind == "api":
                out.append(_mk("params", f"anthropic:api->openai/{form}", "anthropic", base, "openai", oai(vtext, mt)))
            else:
                out.append(_mk("params", f"anthropic:{kind}/{form}", "anthropic", base, "anthropic",
                               ANTH_CHANGES[kind](anth(vtext, mt))))
    return out


def _system_pairs(bases: list[Base], mt: int, rng: random.Random) -> list[Pair]:
    out = []
    kinds = ["system_ts_changed/same_prompt", "system_ts_changed/whitespace_prompt", "system_same/whitespace_prompt"]
    for i, b in enumerate(bases):
        kind = kinds[i % 3]
        ta, tb = V._iso(rng), V._iso(rng)
        sys_a = f"Current time: {ta}. You are a helpful assistant."
        sys_b = sys_a if kind.startswith("system_same") else f"Current time: {tb}. You are a helpful assistant."
        vtext = b.text if kind.endswith("same_prompt") else b.text + "\n"
        out.append(_mk("mask_in_system", kind, "anthropic", anth(b.text, mt, system=sys_a), "anthropic",
                       anth(vtext, mt, system=sys_b)))
    return out


def _window_end(text: str) -> int:
    """Char offset in `text` (a user turn) 64 tokens past the end of the fingerprint's window."""
    s = text.encode("utf-8", "surrogateescape").lower().decode("utf-8", "surrogateescape")
    for j, m in enumerate(_TOKEN_RE.finditer(s)):
        if j == MAX_TOKENS - 1 + 64:           # a margin of 64 tokens past the window
            return m.end()
    return len(text)


def _long_pairs(bases: list[Base], mt_exact: int, mt_near: int, rng: random.Random) -> list[Pair]:
    out = []
    for i, b in enumerate(bases):
        t = b.text
        if i % 2 == 0:
            if i % 4 == 0:
                out.append(_mk("long_exact", "exact_repeat", "anthropic", anth(t, mt_exact), "anthropic",
                               anth(t, mt_exact)))
            else:
                kind, bt, vt = V.mask_id(rng, t)
                out.append(_mk("long_exact", "mask:" + kind, "anthropic", anth(bt, mt_exact), "anthropic",
                               anth(vt, mt_exact)))
            continue
        k = (i // 2) % 4
        if k == 0:
            kind, bt, vt = "whitespace", t, t + "\n"
        elif k == 1:
            kind, bt, vt = V.appended_sentence(rng, t)
        else:
            kind, bt, vt = V.long_edit(rng, t, _window_end(t), after=k == 2)
        out.append(_mk("long_near", kind, "anthropic", anth(bt, mt_near), "anthropic", anth(vt, mt_near)))
    return out


def max_tokens_for(category: str) -> int:
    """Each category gets its own max_tokens, so its own cache scope: categories never answer for each other."""
    names = [c for c, _, _ in CATEGORIES]
    return 64 + 100 * names.index(category)


def build_pairs(pool: Pool, n: int, n_small: int, seed: int = 4) -> list[Pair]:
    rng = random.Random(seed)
    bases = pool.edit[:n]
    small = pool.edit[:n_small]
    out: list[Pair] = []
    for name, gen in V.TEXT_CATEGORIES.items():
        out += _text_pairs(name, gen, bases, max_tokens_for(name), rng)
    out += _control_pairs(small, max_tokens_for("control_excluded"), rng)
    out += _openai_pairs(small, max_tokens_for("openai"), rng)
    out += _system_pairs(small, max_tokens_for("mask_in_system"), rng)
    out += _param_pairs(bases, max_tokens_for("params"), rng)
    out += _long_pairs(pool.long[:n], max_tokens_for("long_exact"), max_tokens_for("long_near"), rng)
    out += _agent_pairs(pool, n_small, rng)
    out += _media_pairs(pool, n_small, rng)
    out += _multi_user_pairs(small, max_tokens_for("multi_user_masked"), rng)
    out += _chat_pairs(pool, n_small, rng)
    return out


# ----------------------------------------------------------------------------- version 2 categories

def _agent_pairs(pool: Pool, n: int, rng: random.Random) -> list[Pair]:
    """Agent loops of 1-4 tool rounds; the task is a ShareGPT first turn, the tool outputs are
    ShareGPT answers. One base per pair and category."""
    out: list[Pair] = []
    outs = pool.outputs
    for name in ("agent_loop", "agent_repeat", "tool_result", "tool_call_round"):
        mt = max_tokens_for(name)
        for i in range(n):
            api = APIS[i % 2]
            task = pool.edit[(i * 7 + len(out)) % len(pool.edit)].text
            k = rng.randint(1, 4)
            calls = [C.path_arg(rng) for _ in range(k + 1)]
            results = [rng.choice(outs) for _ in range(k + 1)]
            base = C.agent(api, task, calls[:k], results[:k], mt)
            if name == "agent_loop":
                var, kind = C.agent(api, task, calls, results, mt), f"{api}:{k}->{k + 1} rounds"
            elif name == "agent_repeat":
                var, kind = base, f"{api}:{k} rounds"
            elif name == "tool_result":
                edited, kind = results[k], f"{api}:another output"
                if rng.random() < 0.5:
                    for _ in range(8):   # a word outside the masked values (else masks make them one output)
                        _, _, e = V.one_word_edit(rng, results[k - 1])
                        if masks().apply(e.encode()) != masks().apply(results[k - 1].encode()):
                            edited, kind = e, f"{api}:one word of the output"
                            break
                if masks().apply(edited.encode()) == masks().apply(results[k - 1].encode()):
                    continue
                var = C.agent(api, task, calls[:k], results[:k - 1] + [edited], mt)
            else:
                other = C.path_arg(rng)
                while other == calls[k - 1]:
                    other = C.path_arg(rng)
                var, kind = C.agent(api, task, calls[:k - 1] + [other], results[:k], mt), f"{api}:other arguments"
            out.append(_mk(name, kind, api, base, api, var))
    return out


def _media_pairs(pool: Pool, n: int, rng: random.Random) -> list[Pair]:
    out: list[Pair] = []
    for name, kind_of, make in (("image_bytes", "png", C.image), ("document_bytes", "pdf", C.document)):
        mt = max_tokens_for(name)
        for i in range(n):
            api = APIS[i % 2]
            question = pool.edit[(i * 3 + 1) % len(pool.edit)].text
            data = C.fake_bytes(rng, kind_of, rng.randint(2000, 12000))
            if rng.random() < 0.5:
                j = rng.randrange(16, len(data))
                other, kind = data[:j] + bytes([data[j] ^ 1]) + data[j + 1:], f"{api}:one byte flipped"
            else:
                other, kind = C.fake_bytes(rng, kind_of, len(data) - 9), f"{api}:another file"
            out.append(_mk(name, kind, api, make(api, question, data, mt), api, make(api, question, other, mt)))
    return out


def _multi_user_pairs(bases: list[Base], mt: int, rng: random.Random) -> list[Pair]:
    out: list[Pair] = []
    gens = [V.mask_id, V.mask_email, V.mask_timestamp]
    for i, b in enumerate(bases):
        api = APIS[i % 2]
        gen = gens[i % len(gens)]
        kind, bt, vt = gen(rng, b.text)
        out.append(_mk("multi_user_masked", f"{api}:{gen.__name__}:{kind}", api, C.body(api, [
            {"role": "user", "content": bt}], mt), api, C.body(api, [{"role": "user", "content": vt}], mt),
            base_headers={"x-api-key": f"tenant-a-{i}"}, headers={"x-api-key": f"tenant-b-{i}"}))
    return out


_REWORDINGS = [V.whitespace, V.punctuation, V.case, V.one_word_edit, V.appended_sentence]


def _chat_pairs(pool: Pool, n: int, rng: random.Random) -> list[Pair]:
    out: list[Pair] = []
    for name in ("multi_turn_chat", "history_edit"):
        mt = max_tokens_for(name)
        for i, c in enumerate(pool.chats[:n]):
            api = APIS[i % 2]
            base = C.chat(api, c.first, c.answer, c.second, mt)
            if name == "multi_turn_chat":
                gen = _REWORDINGS[i % len(_REWORDINGS)]
                kind, _, q = gen(rng, c.second)
                var = C.chat(api, c.first, c.answer, q, mt)
            else:
                kind, _, first = V.one_word_edit(rng, c.first)
                var = C.chat(api, first, c.answer, c.second, mt)
            if var == base:
                continue
            out.append(_mk(name, f"{api}:{kind}", api, base, api, var))
    return out
