"""Shared fixtures: real stacks (nginx + engine [+ redis]) on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.checkout import require_this_checkout
from tests.support.harness import Stack, remove_socket_dirs
from tests.support.hf_checkpoint import HF_MODEL, build_checkpoint

# The tests test this checkout, whatever `pip install -e` last pointed at: pyproject's
# [tool.pytest.ini_options] pythonpath puts this checkout's root and engine/ first.
require_this_checkout()


@pytest.fixture(scope="session", autouse=True)
def _no_socket_dirs_left() -> Iterator[None]:
    """Nothing of this run stays in /tmp: every stack's socket directory goes at the end."""
    yield
    remove_socket_dirs()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The built-in tiny model behind nginx, shared by read-only tests."""
    s = Stack(tmp_path_factory.mktemp("stack"))
    try:
        yield s.start()
    finally:
        s.stop()


@pytest.fixture(scope="session")
def null_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The null backend: measures the pipeline, answers instantly."""
    s = Stack(tmp_path_factory.mktemp("null"), {"model": {"backend": "null"}})
    try:
        yield s.start()
    finally:
        s.stop()


@pytest.fixture
def make_stack(tmp_path: Path) -> Iterator:
    """A private stack for tests that break things (restarts, tiny pools)."""
    made: list[Stack] = []

    def make(overrides: dict | None = None, with_redis: bool = False) -> Stack:
        s = Stack(tmp_path / f"stack{len(made)}", overrides or {}, with_redis)
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
