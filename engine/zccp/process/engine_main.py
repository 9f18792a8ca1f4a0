"""The engine process's main: the event loop it runs on (uvloop unless asked otherwise)
and the Engine served until SIGINT or SIGTERM (`zccp-engine`, zccp.ops.cli)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Mapping

from zccp.config import Config
from zccp.process.engine import Engine
from zccp.process.group import MODEL_OWNER, ProcessRole

log = logging.getLogger("zccp.engine")


def run_engine(cfg: Config, role: ProcessRole = MODEL_OWNER) -> None:
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        engine = Engine(cfg, role)
        await engine.serve(stop)

    name, factory = event_loop()
    log.info("event loop: %s", name)
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())


def event_loop(env: Mapping[str, str] = os.environ) -> tuple[str, Callable[[], asyncio.AbstractEventLoop] | None]:
    """uvloop (libuv: the loop, its transports and its timers in C; bench/engine_stages.md,
    round 6) unless ZCCP_EVENT_LOOP=asyncio asks for the standard library's. uvloop asked for
    by name and missing is an error; by default, missing, the standard library's runs."""
    choice = env.get("ZCCP_EVENT_LOOP", "")
    if choice == "asyncio":
        return "asyncio", None
    if choice not in ("", "uvloop"):
        raise SystemExit(f"ZCCP_EVENT_LOOP={choice!r}: expected uvloop or asyncio")
    try:
        import uvloop
    except ImportError:
        if choice:
            raise SystemExit("ZCCP_EVENT_LOOP=uvloop but uvloop is not installed (pip install uvloop)") from None
        return "asyncio (uvloop not installed)", None
    return "uvloop", uvloop.new_event_loop
