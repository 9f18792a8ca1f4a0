"""Builds the labelled pairs of every category (bodies, true Jaccard, expectation)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Callable

from zccp.cache.fingerprint import MAX_TOKENS, compute, estimate_jaccard
from zccp.cache.fp.csf import _TOKEN_RE

from bench.cache_eval import variants as V
from bench.cache_eval.jaccard import jaccard, masked_prompt, masks, shingles, tokens_of
from bench.cache_eval.prompts import Base, Pool

MODEL = "zccp-tiny"

# Expectations:
#   "J"      a hit is wanted iff true Jaccard >= 0.85 (near-duplicate categories)
#   "exact"  identical after masking/canonicalisation: an exact HIT is wanted
#   "never"  must never hit (other parameters; prompts the fingerprint did not fully see)
CATEGORIES: list[tuple[str, str, str]] = [
    # name, expectation, what
    ("mask_id", "exact", "a long numeric ID (P1234567, 23456789) and/or a UUID planted in the prompt, changed"),
    ("mask_timestamp", "exact", "an ISO-8601 date+time, epoch seconds or epoch millis planted, changed"),
    ("mask_email", "exact", "an e-mail address planted, changed"),
    ("control_excluded", "exact", "same prompt; only stream / metadata / JSON formatting / 0 vs 0.0 / a null member differ"),
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
    ("long_near", "never", "prompts > 1024 tokens: whitespace / one word / appended sentence (near hit must NOT be served)"),
    ("unrelated", "never", "natural ShareGPT first turns (only exact duplicates removed) queried with `Cache-Control: "
                           "no-store` against a cache holding other natural first turns; a query is a false hit when it "
                           "hits although no stored prompt has J >= 0.85 with it"),
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
    # local model of the engine's decision (zccp.fingerprint in Python)
    same_exact_key: bool = False
    est: float = 0.0                  # MinHash estimate between the two prompts
    shared_band: bool = False
    complete: bool = True
    same_csf: bool = False
    same_scope: bool = True           # every output-relevant parameter and the system prompt equal
    # live results
    base_cache: str = ""
    confirm_first: str = ""
    confirm_tries: int = 0
    var_status: int = 0
    var_cache: str = ""
    similarity: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def dumps(obj: Any, **kw: Any) -> bytes:
    kw.setdefault("ensure_ascii", False)
    kw.setdefault("separators", (",", ":"))
    return json.dumps(obj, **kw).encode("utf-8", "surrogatepass")


def anth(text: str, max_tokens: int, **extra: Any) -> dict:
    b = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "messages": [{"role": "user", "content": text}]}
    b.update(extra)
    return b


def oai(text: str, max_tokens: int, **extra: Any) -> dict:
    b = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "messages": [{"role": "user", "content": text}]}
    b.update(extra)
    return b


def _mk(category: str, kind: str, api_b: str, body_b: dict, api_v: str, body_v: dict, *,
        raw_b: bytes | None = None, raw_v: bytes | None = None, headers: dict | None = None) -> Pair:
    tb = tokens_of(masked_prompt(api_b, body_b))
    tv = tokens_of(masked_prompt(api_v, body_v))
    p = Pair(category, kind, api_b, raw_b if raw_b is not None else dumps(body_b), api_v,
             raw_v if raw_v is not None else dumps(body_v), jaccard(shingles(tb), shingles(tv)), len(tb), len(tv),
             EXPECT[category], headers)
    fb, fv = compute(api_b, p.base, masks()), compute(api_v, p.variant, masks())
    if fb is not None and fv is not None:
        p.same_exact_key = api_b == api_v and fb.exact_key == fv.exact_key
        p.est = estimate_jaccard(fb.signature, fv.signature)
        p.shared_band = any(x == y for x, y in zip(fb.bands, fv.bands))
        p.complete = fb.complete and fv.complete
        p.same_csf = fb.csf_key == fv.csf_key
    return p


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
                out.append(_mk("params", f"openai:{kind}/{form}", "openai", base, "openai", OAI_CHANGES[kind](oai(vtext, mt))))
        else:
            kind = a_kinds[i % len(a_kinds)]
            base = anth(b.text, mt)
            if kind == "api":
                out.append(_mk("params", f"anthropic:api->openai/{form}", "anthropic", base, "openai", oai(vtext, mt)))
            else:
                out.append(_mk("params", f"anthropic:{kind}/{form}", "anthropic", base, "anthropic",
                               ANTH_CHANGES[kind](anth(vtext, mt))))
    for p in out:
        p.same_scope = False
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
        p = _mk("mask_in_system", kind, "anthropic", anth(b.text, mt, system=sys_a), "anthropic",
                anth(vtext, mt, system=sys_b))
        p.same_scope = sys_a == sys_b      # the scope holds the system prompt verbatim (unmasked)
        out.append(p)
    return out


def _window_end(text: str) -> int:
    """Char offset in `text` (a user turn) 64 tokens past the end of the fingerprint's window:
    tokens are counted over "user: " + text, so the content's 1023rd token is the prompt's 1024th."""
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
                out.append(_mk("long_exact", "exact_repeat", "anthropic", anth(t, mt_exact), "anthropic", anth(t, mt_exact)))
            else:
                kind, bt, vt = V.mask_id(rng, t)
                out.append(_mk("long_exact", "mask:" + kind, "anthropic", anth(bt, mt_exact), "anthropic", anth(vt, mt_exact)))
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
    return out
