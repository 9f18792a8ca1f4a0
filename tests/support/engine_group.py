"""Looking at an engine of several processes from a test (zccp.process.group): its prep
processes' pids, a prep process's own count of rings, a metric summed on rank 0's page."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable

from tests.support.harness import Stack
from tests.support.prom_text import samples
from zccp.observe.metrics import STATE_REQUEST
from zccp.process.group import metrics_path


def engine_pid(stack: Stack) -> int:
    assert stack.engine is not None and stack.engine.proc is not None
    return stack.engine.proc.pid


def prep_pids(engine: int) -> set[int]:
    out = subprocess.run(["pgrep", "-P", str(engine), "-f", "zccp.process.prep_main"],
                         capture_output=True, text=True)
    return {int(p) for p in out.stdout.split()}


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.05)


def prep_value(socket_path: str, rank: int, name: str) -> float:
    """A prep process's own value of a counter (its metrics socket, as rank 0 asks it)."""
    async def ask() -> bytes:
        reader, writer = await asyncio.open_unix_connection(metrics_path(socket_path, rank))
        writer.write(STATE_REQUEST)
        data = await reader.read(-1)
        writer.close()
        return data

    state = json.loads(asyncio.run(ask()))
    return sum(v for _, v in state.get(name, []))


def rings(socket_path: str, rank: int) -> float:
    return prep_value(socket_path, rank, "zccp_engine_rings_total")


def page_value(stack: Stack, name: str, **labels: str) -> float:
    """A metric on rank 0's page (every process's summed), over the series matching labels."""
    with stack.admin_client() as c:
        text = c.get("/metrics").text
    return sum(v for n, lab, v in samples(text) if n == name and all(lab.get(k) == x for k, x in labels.items()))


def kill_prep_mid_streams(stack: Stack, victim: int, stream: Callable[[int], str], n: int,
                          settle_s: float, tries: int = 8) -> tuple[float, list[str]]:
    """n streams at once (stream(i) -> how it ended); once they run, SIGKILL prep process 1
    (victim) if it took some of them. nginx reuses its doorbell connections, so a burst may all
    land on rank 0: tried again until the prep process holds some. (rings it took, the ends)."""
    socket_path = stack.cfg.server.socket_path
    assert socket_path is not None
    on_victim, ends = 0.0, []
    for _ in range(tries):
        before = rings(socket_path, 1)
        with cf.ThreadPoolExecutor(n) as ex:
            running = [ex.submit(stream, i) for i in range(n)]
            time.sleep(settle_s)
            on_victim = rings(socket_path, 1) - before
            if on_victim:
                os.kill(victim, signal.SIGKILL)
            ends = [f.result(timeout=120) for f in running]    # every one ends: none hangs
        if on_victim:
            break
    return on_victim, ends
