"""The hostile local writer (tests/support/hostile_writer.py) for as long as asked, against a
stack it starts (null model, Redis); the test suite runs it briefly (tests/integration/test_fuzz.py).

    python -m bench.faults.fuzz --seconds 300 [--seed N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.support.checkout import require_this_checkout
from tests.support.harness import Stack, anthropic_body
from tests.support.hostile_writer import Fuzzer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    args = ap.parse_args()
    require_this_checkout()
    with tempfile.TemporaryDirectory(prefix="zccp-fuzz-") as tmp:
        stack = Stack(Path(tmp), {"model": {"backend": "null"}}, with_redis=True).start()
        try:
            engine_pid = stack.engine.proc.pid
            fz = Fuzzer(stack.cfg.shared_memory.name, stack.cfg.server.socket_path, args.seed)
            t0 = time.monotonic()
            st = fz.run(seconds=args.seconds)
            elapsed = time.monotonic() - t0
            alive = stack.engine.proc.poll() is None and stack.engine.proc.pid == engine_pid
            pong = fz.ping()
            fz.settle()
            fz.close()
            ok = sum(httpx.post(stack.url("/v1/messages"), json=anthropic_body(f"after {k}"), timeout=30)
                     .status_code == 200 for k in range(20))
            metrics = stack.admin_client().get("/metrics").text
            rejects = [ln for ln in metrics.splitlines() if ln.startswith("zccp_engine_rejects_total")]
            print(f"seed {args.seed}: {st.iterations} iterations in {elapsed:.0f} s, {st.rings} rings, "
                  f"frames {dict(st.frames)}")
            print(f"notices (op/status): {dict(st.notices)}")
            print(f"engine alive (same pid): {alive}; answers PING: {pong}; normal requests after: {ok}/20")
            print("\n".join(rejects))
            if not (alive and pong and ok == 20):
                sys.exit(1)
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
