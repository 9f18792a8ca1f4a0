"""Shared fixtures: real stacks (nginx + engine [+ redis]) on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import leftovers
from tests.support.checkout import require_this_checkout
from tests.support.harness import Stack
from tests.support.leftovers import remove_socket_dirs
from tests.support.protocols import PROTOCOLS, both_protocols
from tests.support.hf_checkpoint import HF_MODEL, build_checkpoint

# The tests test this checkout, whatever `pip install -e` last pointed at: pyproject's
# [tool.pytest.ini_options] pythonpath puts this checkout's root and engine/ first.
require_this_checkout()


_ARENAS_BEFORE: set[str] = set()
_LEFT_BY_WORKERS: list[str] = []     # under pytest-xdist (scripts/test.sh): what each worker reported


def pytest_sessionstart(session: pytest.Session) -> None:
    _ARENAS_BEFORE.update(leftovers.present())


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """An xdist worker is done: its arenas left behind, for the controller's verdict below."""
    _LEFT_BY_WORKERS.extend(getattr(node, "workeroutput", {}).get("zccp_arenas_left", []))


# trylast: the innermost wrapper, so a worker's list is in its workeroutput before xdist's
# own wrapper sends that to the controller.
@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> Iterator[None]:
    """The session fails when an arena one of its stacks made outlives it (after every
    fixture's teardown: the hook's other implementations run first). An xdist worker
    hands its list to the controller, which fails the run."""
    yield
    left = leftovers.left_by_this_session(_ARENAS_BEFORE)
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["zccp_arenas_left"] = left
        return
    left = sorted(set(left) | set(_LEFT_BY_WORKERS))
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(f"FAILED: shared memory left behind in /dev/shm: {', '.join(left)}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session", autouse=True)
def _no_socket_dirs_left() -> Iterator[None]:
    """Nothing of this run stays in /tmp: every stack's socket directory goes at the end."""
    yield
    remove_socket_dirs()


@pytest.fixture(scope="session")
def stack_http1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The built-in tiny model behind nginx, shared by read-only tests (HTTP/1.1)."""
    s = Stack(tmp_path_factory.mktemp("stack"))
    try:
        yield s.start()
    finally:
        s.stop()


@pytest.fixture(scope="session")
def null_stack_http1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The null backend: measures the pipeline, answers instantly (HTTP/1.1)."""
    s = Stack(tmp_path_factory.mktemp("null"), {"model": {"backend": "null"}})
    try:
        yield s.start()
    finally:
        s.stop()


@pytest.fixture(scope="session")
def stack_h2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`stack` over TLS, speaking HTTP/2 (server.tls + http2)."""
    s = Stack(tmp_path_factory.mktemp("stack_h2"), tls=True)
    try:
        yield s.start()
    finally:
        s.stop()


@pytest.fixture(scope="session")
def null_stack_h2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`null_stack` over TLS, speaking HTTP/2."""
    s = Stack(tmp_path_factory.mktemp("null_h2"), {"model": {"backend": "null"}}, tls=True)
    try:
        yield s.start()
    finally:
        s.stop()


@pytest.fixture(params=PROTOCOLS)
def protocol(request: pytest.FixtureRequest) -> str:
    """"http1" or "h2tls" (tests/support/protocols.py): a test that takes it runs over both."""
    return request.param


# For single tests: `def test_x(null_stack_any)` runs over HTTP/1.1 and over HTTP/2 + TLS.
stack_any = both_protocols("stack", "stack_any")
null_stack_any = both_protocols("null_stack", "null_stack_any")


@pytest.fixture(scope="session")
def stack(stack_http1: Stack) -> Stack:
    """The tiny-model stack over HTTP/1.1 (a module may run over both: both_protocols)."""
    return stack_http1


@pytest.fixture(scope="session")
def null_stack(null_stack_http1: Stack) -> Stack:
    """The null-backend stack over HTTP/1.1 (a module may run over both: both_protocols)."""
    return null_stack_http1


@pytest.fixture
def make_stack(tmp_path: Path) -> Iterator:
    """A private stack for tests that break things (restarts, tiny pools); tls=True: HTTPS
    and HTTP/2 on its listener."""
    made: list[Stack] = []

    def make(overrides: dict | None = None, with_redis: bool = False, tls: bool = False) -> Stack:
        s = Stack(tmp_path / f"stack{len(made)}", overrides or {}, with_redis, tls)
        made.append(s)
        return s.start()

    try:
        yield make
    finally:
        for s in made:
            s.stop()


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small Llama checkpoint + byte-level BPE tokenizer, made on the fly (tests/support/hf_checkpoint.py)."""
    return build_checkpoint(tmp_path_factory.mktemp("hf") / "checkpoint")


@pytest.fixture(scope="session")
def hf_stack(tmp_path_factory: pytest.TempPathFactory, hf_checkpoint: Path) -> Iterator[Stack]:
    """model.backend: hf over that checkpoint, behind the real nginx."""
    s = Stack(tmp_path_factory.mktemp("hfstack"), {"model": {
        "backend": "hf", "path": str(hf_checkpoint), "name": HF_MODEL, "max_context": 4096, "prefill_chunk": 64}})
    try:
        yield s.start()
    finally:
        s.stop()


@pytest.fixture(scope="module")
def claude(sdk_stack: Stack):
    """The anthropic SDK pointed at the module's `sdk_stack` fixture."""
    from tests.support.harness import sdk_clients

    return sdk_clients(sdk_stack)[0]


@pytest.fixture(scope="module")
def oai(sdk_stack: Stack):
    """The openai SDK pointed at the module's `sdk_stack` fixture."""
    from tests.support.harness import sdk_clients

    return sdk_clients(sdk_stack)[1]
