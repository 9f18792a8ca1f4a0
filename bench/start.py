"""Engine start to its first answer: nginx up, the engine process launched, a probe POST
through nginx every 20 ms until a 200.

    PYTHONPATH=engine:. python -m bench.start [--starts 10] [--backend null tiny] [--json F]

Each start: the previous engine stopped (SIGTERM, its arena removed), a new one launched as
zccp-stack launches it (`python -m zccp.ops.cli engine`), then launch -> first 200, and from
the engine's own log: launch -> "engine serving" (doorbell listening, arena published).
Method and results: bench/restart.md ("Start").
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx

from tests.support.harness import Stack, anthropic_body
from zccp.ops.stack import engine_service


def _serving_at(log: Path, after: float) -> float | None:
    """The wall time of the last "engine serving" line in the engine log written after `after`."""
    found = None
    for line in log.read_text().splitlines():
        if '"engine serving' in line:
            ts = datetime.fromisoformat(json.loads(line)["ts"].replace("Z", "+00:00")).timestamp()
            if ts >= after:
                found = ts
    return found


def one_start(s: Stack, url: str, model: str) -> tuple[float, float | None]:
    s.stop_engine()
    body = anthropic_body("start probe", max_tokens=4, model=model)
    with httpx.Client(timeout=5) as c:
        wall, t0 = time.time(), time.monotonic()
        s.engine = engine_service(s.config_path, s.cfg, s.run_dir, wait=False)
        end = t0 + 60
        while time.monotonic() < end:
            try:
                if c.post(url, json=body).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        else:
            raise RuntimeError("no 200 within 60 s")
        first = time.monotonic() - t0
    serving = _serving_at(s.run_dir / "logs" / "engine.log", wall)
    return first, (serving - wall) if serving else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--starts", type=int, default=10)
    ap.add_argument("--backend", nargs="+", default=["null", "tiny"])
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    res = {}
    for backend in a.backend:
        model = f"zccp-{backend}"
        s = Stack(Path(tempfile.mkdtemp(prefix=f"zccp-start-{backend}-")),
                  {"model": {"backend": backend, "name": model}}).start()
        try:
            rows = [one_start(s, s.url("/v1/messages"), model) for _ in range(a.starts)]
        finally:
            s.stop()
        first = [r[0] for r in rows]
        serving = [r[1] for r in rows if r[1] is not None]
        res[backend] = {"start_to_first_200_s": [round(x, 3) for x in first],
                        "p50_s": round(statistics.median(first), 3), "max_s": round(max(first), 3),
                        "start_to_serving_log_s": [round(x, 3) for x in serving]}
        print(backend, json.dumps(res[backend]), flush=True)
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
