"""CPU time of a forced tool call's sampling, its wrapper fast-forwarded vs drawn token by token.

In process, the tiny model (no stack, no HTTP), one torch thread: one forced call
(`tool_choice` required, a two-property schema) generated greedily once; then its sampling
alone is replayed (a fresh Sampler with a copy of the compiled grammar, fed logits that favour
each recorded token, so both variants give the same answer, checked) with the grammar's
fast-forward tokens (GrammarMatcher.forced) on ("ff") and off ("masked": every token masked and
drawn, the behaviour before). Both variants alternate in the same run, so the machine's load
hits both alike; CPU time (time.process_time) per request and per token, best and median of
the rounds. Also: the model's own CPU for the same number of tokens, for scale.

    .venv/bin/python -m bench.forced_tools      # ~20 s -> stdout (recorded in bench/forced_tools.md)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from zccp.api.constraints import tool_call
from zccp.model import grammar
from zccp.model.registry import build_backend
from zccp.model.sampling import Sampler
from zccp.shared_types import SamplingParams

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
          "required": ["city", "unit"], "additionalProperties": False}
ROUNDS = 15


def _sample_all(backend: Any, c: Any, steps: list[torch.Tensor]) -> tuple[float, list[int]]:
    """One request's sampling alone: a fresh sampler (a copy of the compiled grammar) fed
    the recorded logits of every step."""
    compiled = backend.grammar_vocab().matcher(c)
    sampler = Sampler(SamplingParams(max_tokens=len(steps), temperature=0.0), backend.device, compiled)
    t = time.process_time()
    out = [sampler(row) for row in steps]
    return time.process_time() - t, out


def main() -> None:
    torch.set_num_threads(1)                 # CPU time of this thread's work, not torch's pool spinning
    backend = build_backend("tiny")
    c = tool_call([("get_weather", SCHEMA)], None, "tools")
    ids = torch.tensor(list(b"Weather in Tokyo?"), dtype=torch.long)
    # the call's tokens, generated once; each step's logits then favour that token, so both
    # variants walk the same path (greedy) over logits of the model's width
    toks = list(backend.generate(ids, SamplingParams(max_tokens=200, temperature=0.0, constraint=c), lambda: False))
    gen = torch.Generator().manual_seed(1)
    steps = []
    for t in toks:
        row = torch.randn(backend.vocab_size, generator=gen)
        row[t] = 100.0
        steps.append(backend.process_logits(row))
    forced: Callable[[grammar.GrammarMatcher], int | None] = grammar.GrammarMatcher.forced
    off: Callable[[grammar.GrammarMatcher], int | None] = lambda self: None   # noqa: E731
    rows: dict[str, list[float]] = {"ff": [], "masked": []}
    _sample_all(backend, c, steps)                               # warm
    for _ in range(ROUNDS):
        for name, fn in (("ff", forced), ("masked", off)):
            grammar.GrammarMatcher.forced = fn                  # type: ignore[method-assign]
            cpu, out = _sample_all(backend, c, steps)
            assert out == toks, name                            # the same answer either way
            rows[name].append(cpu)
    grammar.GrammarMatcher.forced = forced                      # type: ignore[method-assign]
    t = time.process_time()
    for _ in range(ROUNDS):
        list(backend.generate(ids, SamplingParams(max_tokens=len(toks), temperature=0.0), lambda: False))
    fwd = (time.process_time() - t) / ROUNDS
    print(f"{len(toks)} tokens a call (the EOS after them not counted); rounds: {ROUNDS}")
    print("| variant | sampling CPU µs / request (best) | (median) | µs / token (median) |")
    print("|---|---|---|---|")
    for name, cpus in rows.items():
        med = statistics.median(cpus)
        print(f"| {name} | {min(cpus) * 1e6:,.0f} | {med * 1e6:,.0f} | {med * 1e6 / len(toks):,.1f} |")
    print(f"| the model alone (unconstrained, same tokens) | | {fwd * 1e6:,.0f} | {fwd * 1e6 / len(toks):,.1f} |")


if __name__ == "__main__":
    main()
