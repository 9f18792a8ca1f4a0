"""bench.per_token's hook in the engine process (on PYTHONPATH only for that bench): the model
thread writes its native id to $ZCCP_BENCH_TID (its CPU clock is read from /proc), and with
$ZCCP_BENCH_PROFILE set runs under cProfile, the stats dumped there when the thread returns."""

from __future__ import annotations

import os
import threading

_run = threading.Thread.run


def _model_run(self: threading.Thread) -> None:
    if self.name != "zccp-model":
        _run(self)
        return
    tid_file = os.environ.get("ZCCP_BENCH_TID")
    if tid_file:
        with open(tid_file, "w") as f:
            f.write(str(threading.get_native_id()))
    out = os.environ.get("ZCCP_BENCH_PROFILE")
    if not out:
        _run(self)
        return
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
    try:
        _run(self)
    finally:
        prof.disable()
        prof.dump_stats(out)


if os.environ.get("ZCCP_BENCH_TID") or os.environ.get("ZCCP_BENCH_PROFILE"):
    threading.Thread.run = _model_run  # type: ignore[method-assign]
