"""Reading the golden fingerprint vectors (shm_abi/vectors/), shared by the Python and Lua checks."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

VECTORS = Path(__file__).resolve().parents[2] / "shm_abi" / "vectors" / "fingerprint_vectors.json"


def load_vectors() -> Any:
    return json.loads(VECTORS.read_text())


def vec_body(v: dict) -> bytes:
    if v.get("body_b64") is not None:
        return base64.b64decode(v["body_b64"])
    return b"".join(base64.b64decode(c) * n for c, n in v["body_runs"])


def vec_text(t: dict) -> bytes:
    if t.get("text_hex") is not None:
        return bytes.fromhex(t["text_hex"])
    fmt, n = t["text_repeat"]
    return (" ".join(fmt.strip() % i for i in range(n)) if "%d" in fmt else fmt * n).encode()


def sig_values(hexs: str) -> list[int]:
    return [int(hexs[i:i + 8], 16) for i in range(0, len(hexs), 8)]
