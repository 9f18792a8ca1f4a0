"""Random bounded JSON schemas (OpenAI strict mode's kind), shared by the structured-output
tests and bench/grammar_libs.py."""

from __future__ import annotations

import random
from typing import Any


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """A bounded schema: objects of strings, integers, enums, booleans, arrays, nested objects."""
    kinds = ["string", "integer", "enum", "boolean", "array"] + (["object"] if depth < 2 else [])
    props: dict[str, Any] = {}
    for i in range(rng.randint(1, 4)):
        kind = rng.choice(kinds)
        if kind == "string":
            p: dict[str, Any] = {"type": "string", "maxLength": rng.randint(1, 12)}
        elif kind == "integer":
            lo = rng.randint(-100, 100)
            p = {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 1000)}
        elif kind == "enum":
            p = {"enum": rng.sample(["a", "b", "c", "yes", "no", "maybe"], rng.randint(1, 4))}
        elif kind == "boolean":
            p = {"type": "boolean"}
        elif kind == "array":
            p = {"type": "array", "items": {"enum": [1, 2, 3]}, "maxItems": rng.randint(0, 4)}
        else:
            p = random_schema(rng, depth + 1)
        props[f"k{i}_{kind}"] = p
    return {"type": "object", "properties": props, "required": sorted(props), "additionalProperties": False}
