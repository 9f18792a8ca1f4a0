"""The two ways a client reaches ZCCP in the tests: plain HTTP/1.1, and HTTP/2 over TLS
(ALPN h2, server.tls). conftest's `protocol` fixture is parametrized over PROTOCOLS; a
module runs its tests over both with `null_stack = both_protocols("null_stack")`."""

from __future__ import annotations

from typing import Any

import pytest

PROTOCOLS = ["http1", "h2tls"]


def both_protocols(name: str, alias: str | None = None) -> Any:
    """A fixture named `alias` (default `name`, overriding it) that is the session stack
    `<name>_http1` or its HTTP/2 + TLS twin `<name>_h2`, by the `protocol` parameter."""

    @pytest.fixture(name=alias or name)
    def over(protocol: str, request: pytest.FixtureRequest) -> Any:
        return request.getfixturevalue(name + ("_h2" if protocol == "h2tls" else "_http1"))

    return over
