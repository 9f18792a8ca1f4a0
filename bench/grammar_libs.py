"""Grammar libraries compared on the CPU (why zccp.model.grammar uses llguidance), and the
grammar's per-token cost against a batch-8 decode step.

For each library: the time to make a matcher for a schema (compile), the time per token
to compute the mask and consume the token drawn, and correctness: N random bounded
schemas, tokens drawn at random among those allowed, every finished output validated
with jsonschema. Vocabulary: the test checkpoint's byte-level BPE (tests/support/
hf_checkpoint.py, 600 ids) made here. Then the batch-8 decode step of that checkpoint
and of the tiny model, against 8 matchers' mask + consume (what one step adds).

    .venv/bin/python -m bench.grammar_libs [N]
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import torch

from tests.support.hf_checkpoint import build_checkpoint
from tests.support.schemas import random_schema


def run_llguidance(tok: Any, n_vocab: int, eos: int, schemas: list[dict], rng: random.Random) -> dict:
    import llguidance
    import llguidance.hf

    lltok = llguidance.hf.from_tokenizer(tok, n_vocab=n_vocab, eos_token=eos)
    compile_s = step_s = 0.0
    steps = ok = 0
    for schema in schemas:
        t0 = time.perf_counter()
        g = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides={"whitespace_flexible": False})
        m = llguidance.LLMatcher(lltok, g)
        compile_s += time.perf_counter() - t0
        out: list[int] = []
        for _ in range(400):
            t0 = time.perf_counter()
            bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), np.uint8), bitorder="little")[:n_vocab]
            allowed = np.flatnonzero(bits)
            step_s += time.perf_counter() - t0
            t = int(rng.choice(allowed))
            if t == eos:
                break
            t0 = time.perf_counter()
            m.consume_token(t)
            step_s += time.perf_counter() - t0
            steps += 1
            out.append(t)
        try:
            jsonschema.validate(json.loads(tok.decode(out)), schema)
            ok += 1
        except Exception:
            pass
    return {"compile_ms": 1e3 * compile_s / len(schemas), "token_us": 1e6 * step_s / steps, "valid": ok}


def run_xgrammar(tok: Any, n_vocab: int, eos: int, schemas: list[dict], rng: random.Random) -> dict:
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=n_vocab, stop_token_ids=[eos])
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    mask = xgr.allocate_token_bitmask(1, n_vocab)
    compile_s = step_s = 0.0
    steps = ok = 0
    for schema in schemas:
        t0 = time.perf_counter()
        m = xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(schema), any_whitespace=False))
        compile_s += time.perf_counter() - t0
        out: list[int] = []
        for _ in range(400):
            t0 = time.perf_counter()
            m.fill_next_token_bitmask(mask)
            bits = np.unpackbits(mask.numpy().view(np.uint8), bitorder="little")[:n_vocab]
            allowed = np.flatnonzero(bits)
            step_s += time.perf_counter() - t0
            t = int(rng.choice(allowed))
            if t == eos:
                break
            t0 = time.perf_counter()
            m.accept_token(t)
            step_s += time.perf_counter() - t0
            steps += 1
            out.append(t)
        try:
            jsonschema.validate(json.loads(tok.decode(out)), schema)
            ok += 1
        except Exception:
            pass
    return {"compile_ms": 1e3 * compile_s / len(schemas), "token_us": 1e6 * step_s / steps, "valid": ok}


@torch.inference_mode()
def batch_step_vs_grammar(backend: Any, prompt: list[int], rows: int = 8, steps: int = 30) -> tuple[float, float]:
    """(decode step ms at `rows` rows, the grammar's ms for those rows: 8 masks + consumes)."""
    from zccp.shared_types import OutputConstraint, SamplingParams

    batch = backend.new_batch()
    for _ in range(rows):
        st = backend.new_state()
        backend.prefill(st, torch.tensor(prompt, dtype=torch.int32))
        batch.join(st)
    schema = random_schema(random.Random(1))
    params = SamplingParams(max_tokens=steps, temperature=1.0, constraint=OutputConstraint("json", json.dumps(schema)))
    samplers = [backend.sampler(params) for _ in range(rows)]
    toks = [prompt[-1]] * rows
    step_s = gram_s = 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        logits = backend.process_logits(batch.decode(toks))
        step_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        masked = [s.grammar.mask(logits[i]) for i, s in enumerate(samplers)]
        gram_s += time.perf_counter() - t0
        toks = [int(torch.argmax(m)) for m in masked]
        t0 = time.perf_counter()
        for s, t in zip(samplers, toks, strict=True):
            s.grammar.accept(t)
        gram_s += time.perf_counter() - t0
    return 1e3 * step_s / steps, 1e3 * gram_s / steps


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    from transformers import AutoTokenizer

    from zccp.model.hf import HfBackend
    from zccp.model.tiny import TinyTransformer

    with tempfile.TemporaryDirectory() as d:
        ckpt = build_checkpoint(Path(d) / "ckpt")
        tok = AutoTokenizer.from_pretrained(ckpt)
        eos = tok.convert_tokens_to_ids("<|im_end|>")
        schemas = [random_schema(random.Random(i)) for i in range(n)]
        print(f"{n} random bounded schemas, vocabulary {len(tok)} (byte-level BPE), random draws among allowed")
        print("| library | matcher per schema (ms) | mask + consume per token (µs) | outputs valid |")
        print("|---|---|---|---|")
        for name, fn in (("llguidance", run_llguidance), ("xgrammar", run_xgrammar)):
            r = fn(tok, len(tok), eos, schemas, random.Random(0))
            print(f"| {name} | {r['compile_ms']:.2f} | {r['token_us']:.1f} | {r['valid']}/{n} |")
        hf = HfBackend(str(ckpt), "x", prefill_chunk=0)
        prompt = tok.encode("The grammar cost per step, measured.")
        print("\n| backend | decode step at batch 8 (ms) | grammar for 8 rows (ms) | share |")
        print("|---|---|---|---|")
        for name, be in (("tiny", TinyTransformer()), ("hf test checkpoint (hidden 64, 2 layers)", hf)):
            p = prompt if be is hf else list(b"The grammar cost per step, measured.")
            step, gram = batch_step_vs_grammar(be, p)
            print(f"| {name} | {step:.2f} | {gram:.2f} | {100 * gram / (step + gram):.1f}% |")


if __name__ == "__main__":
    main()
