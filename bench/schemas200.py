"""The structured-output target run: 200 random JSON schemas as OpenAI `response_format`
json_schema (strict), forced tool calls on both APIs, through the real stack (nginx +
engine), every answer parsed and validated with jsonschema; then the grammar's per-token
cost at batch 8 against the decode step.

    PYTHONPATH=engine .venv/bin/python -m bench.schemas200 [--n 200] [--tools 50] [--backends tiny,hf]
        -> bench/schemas200.json (recorded by hand in bench/grammar.md and bench/RESULTS.md)

Schemas (random_schema below, seeded): objects of 1-5 properties drawn from bounded strings
(maxLength, sometimes minLength or an enum-like pattern-free format), integers and numbers with
minimum/maximum (numbers sometimes exclusive bounds), enums (strings, numbers, mixed), booleans,
null, const, arrays (minItems/maxItems) of enums, integers, strings or objects, nested objects up
to depth 3; `required` a random subset (optional properties included), additionalProperties
false. Sampling: temperature 0.7 or 1.0 with a seed per request (a random-weight model decoding
greedily can loop forever inside an unbounded number's digits: the grammar allows it, max_tokens
ends it, and that would be the model's fault, not the grammar's); max_tokens 1000.

Forced tool calls: a random schema as the tool's parameters / input_schema (two tools offered),
OpenAI tool_choice "required" and named, Anthropic tool_choice "any" and "tool"; the answer must
be one tool call whose arguments validate.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import openai

from bench.run import commit_info, log, machine_info
from bench.services import start_d

OUT = Path(__file__).resolve().parent / "schemas200.json"
NOCACHE = {"Cache-Control": "no-cache, no-store"}


def _leaf(rng: random.Random, depth: int) -> dict[str, Any]:
    kinds = ["string", "integer", "number", "enum", "boolean", "null", "const", "array"]
    if depth < 3:
        kinds += ["object", "object"]
    kind = rng.choice(kinds)
    if kind == "string":
        hi = rng.randint(1, 16)
        p: dict[str, Any] = {"type": "string", "maxLength": hi}
        if rng.random() < 0.3:
            p["minLength"] = rng.randint(0, hi)
        return p
    if kind == "integer":
        lo = rng.randint(-1000, 1000)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 5000)}
    if kind == "number":
        lo = round(rng.uniform(-100, 100), 2)
        p = {"type": "number", "minimum": lo, "maximum": round(lo + rng.uniform(0.5, 500), 2)}
        if rng.random() < 0.3:
            p = {"type": "number", "exclusiveMinimum": p["minimum"], "exclusiveMaximum": p["maximum"]}
        return p
    if kind == "enum":
        pool = ["a", "b", "red", "green", "yes", "no", 1, 2, 3.5, -7, True, None]
        return {"enum": rng.sample(pool, rng.randint(1, 5))}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "null":
        return {"type": "null"}
    if kind == "const":
        return {"const": rng.choice(["fixed", 42, False])}
    if kind == "array":
        item = rng.choice([{"enum": [1, 2, 3]}, {"type": "integer", "minimum": 0, "maximum": 99},
                           {"type": "string", "maxLength": 5}, None])
        if item is None:
            item = random_schema(rng, depth + 1, max_props=2)
        lo = rng.randint(0, 2)
        return {"type": "array", "items": item, "minItems": lo, "maxItems": lo + rng.randint(0, 3)}
    return random_schema(rng, depth + 1)


def random_schema(rng: random.Random, depth: int = 0, max_props: int = 5) -> dict[str, Any]:
    props = {f"f{i}": _leaf(rng, depth) for i in range(rng.randint(1, max_props))}
    names = sorted(props)
    required = names if rng.random() < 0.5 else sorted(rng.sample(names, rng.randint(0, len(names))))
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def _valid(text: str, schema: dict) -> str | None:
    """None when text is JSON valid against schema, else why not."""
    try:
        jsonschema.validate(json.loads(text), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
        return f"{type(exc).__name__}: {str(exc)[:160]}"
    return None


def run_schemas(oai: openai.OpenAI, model: str, n: int, seed: int) -> dict:
    rng = random.Random(seed)
    ok, failures, tokens, t0 = 0, [], 0, time.perf_counter()
    for i in range(n):
        schema = random_schema(rng)
        try:
            r = oai.chat.completions.create(
                model=model, messages=[{"role": "user", "content": f"Case {i}: fill in the record."}],
                max_tokens=1000, temperature=rng.choice([0.7, 1.0]), seed=i, extra_headers=NOCACHE,
                response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema,
                                                                        "strict": True}})
            why = _valid(r.choices[0].message.content or "", schema)
            tokens += r.usage.completion_tokens
        except openai.APIError as exc:
            why = f"API error: {exc}"
        if why is None:
            ok += 1
        else:
            failures.append({"i": i, "why": why, "schema": schema})
            log(f"  schema {i}: {why}")
    return {"n": n, "valid": ok, "failures": failures[:10], "completion_tokens": tokens,
            "wall_s": time.perf_counter() - t0}


def _tally(res: dict, api: str, i: int, why: str | None) -> None:
    """One forced tool call's verdict: counted valid, or its failure kept and logged."""
    if why is None:
        res[api]["valid"] += 1
    else:
        res["failures"].append({"i": i, "api": api, "why": why})
        log(f"  tool {i} {api}: {why}")


def run_tools(oai: openai.OpenAI, claude: anthropic.Anthropic, model: str, n: int, seed: int) -> dict:
    rng = random.Random(seed)
    res = {"openai": {"n": 0, "valid": 0}, "anthropic": {"n": 0, "valid": 0}, "failures": []}
    for i in range(n):
        schemas = [random_schema(rng), random_schema(rng)]
        names = ["lookup_record", "store_record"]
        named = rng.random() < 0.5
        want = rng.choice(names) if named else None
        temp = rng.choice([0.7, 1.0])
        why: str | None = None
        # OpenAI
        tools = [{"type": "function", "function": {"name": nm, "description": "A record operation", "parameters": s,
                                                   "strict": True}} for nm, s in zip(names, schemas, strict=True)]
        choice: Any = {"type": "function", "function": {"name": want}} if named else "required"
        res["openai"]["n"] += 1
        try:
            r = oai.chat.completions.create(model=model, max_tokens=1000, temperature=temp, seed=i, tools=tools,
                                            tool_choice=choice, extra_headers=NOCACHE,
                                            messages=[{"role": "user", "content": f"Tool case {i}."}])
            calls = r.choices[0].message.tool_calls or []
            if len(calls) != 1 or (want and calls[0].function.name != want):
                why = f"openai: {len(calls)} calls {[c.function.name for c in calls]}"
            else:
                why = _valid(calls[0].function.arguments, schemas[names.index(calls[0].function.name)])
        except openai.APIError as exc:
            why = f"openai API error: {exc}"
        _tally(res, "openai", i, why)
        # Anthropic
        why = None
        atools = [{"name": nm, "description": "A record operation", "input_schema": s}
                  for nm, s in zip(names, schemas, strict=True)]
        achoice: Any = {"type": "tool", "name": want} if named else {"type": "any"}
        res["anthropic"]["n"] += 1
        try:
            m = claude.messages.create(model=model, max_tokens=1000, tools=atools, tool_choice=achoice,
                                       extra_body={"temperature": temp}, extra_headers=NOCACHE,
                                       messages=[{"role": "user", "content": f"Tool case {i}."}])
            uses = [b for b in m.content if b.type == "tool_use"]
            if len(uses) != 1 or m.stop_reason != "tool_use" or (want and uses[0].name != want):
                why = f"anthropic: {len(uses)} tool_use, stop {m.stop_reason}"
            else:
                why = _valid(json.dumps(uses[0].input), schemas[names.index(uses[0].name)])
        except anthropic.APIError as exc:
            why = f"anthropic API error: {exc}"
        _tally(res, "anthropic", i, why)
    res["failures"] = res["failures"][:10]
    return res


def grammar_share(kind: str, ckpt: Path | None) -> dict:
    """The grammar's mask + consume for 8 rows against one batch-8 decode step
    (bench.grammar_libs.batch_step_vs_grammar), on the backend itself (no server)."""
    from bench.grammar_libs import batch_step_vs_grammar

    if kind == "tiny":
        from zccp.model.tiny import TinyTransformer

        be: Any = TinyTransformer()
        prompt = list(b"The grammar cost per step, measured.")
    else:
        from transformers import AutoTokenizer

        from zccp.model.hf import HfBackend

        assert ckpt is not None
        be = HfBackend(str(ckpt), "x", prefill_chunk=0)
        prompt = AutoTokenizer.from_pretrained(ckpt).encode("The grammar cost per step, measured.")
    step, gram = batch_step_vs_grammar(be, prompt, rows=8, steps=40)
    return {"step_ms": step, "grammar_ms": gram, "share_pct": 100 * gram / (step + gram)}


def main(argv: list[str] | None = None) -> None:
    from bench.models import hf_limits
    from bench.run import TINY
    from tests.support.hf_checkpoint import build_checkpoint

    ap = argparse.ArgumentParser(prog="python -m bench.schemas200")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--tools", type=int, default=50)
    ap.add_argument("--backends", default="tiny,hf")
    args = ap.parse_args(argv)
    results: dict = {"commit": commit_info(), "machine": machine_info(), "runs": {}}
    with tempfile.TemporaryDirectory(prefix="zccp-schemas-") as tmp:
        run = Path(tmp)
        for kind in args.backends.split(","):
            ckpt = build_checkpoint(run / "ckpt") if kind == "hf" else None
            lim = dict(hf_limits(ckpt, 1), model_extra={"path": str(ckpt), "tool_parser": "hermes"}) \
                if ckpt else dict(TINY, model_extra={"tool_parser": "hermes"})
            model = lim["model_name"]
            v = start_d(run / kind, lim, 8)
            try:
                oai = openai.OpenAI(base_url=v.url + "/v1", api_key="x", max_retries=0, timeout=300)
                claude = anthropic.Anthropic(base_url=v.url, api_key="x", max_retries=0, timeout=300)
                t0 = time.perf_counter()
                r: dict = {"schemas": run_schemas(oai, model, args.n, 200)}
                log(f"{kind}: json_schema {r['schemas']['valid']}/{args.n} valid")
                r["tools"] = run_tools(oai, claude, model, args.tools, 300)
                log(f"{kind}: tools openai {r['tools']['openai']}, anthropic {r['tools']['anthropic']}")
                r["wall_s"] = time.perf_counter() - t0
            finally:
                v.stop()
            r["grammar_batch8"] = grammar_share(kind, ckpt)
            log(f"{kind}: grammar at batch 8 {r['grammar_batch8']}")
            results["runs"][kind] = r
            OUT.write_text(json.dumps(results, indent=1))
    log(f"-> {OUT}")


if __name__ == "__main__":
    main()
