"""zccp.upstream.http1's bounds on what a server sends, and Retry-After as the client reads
it, without a network: a StreamReader fed by hand."""

from __future__ import annotations

import asyncio
import time
from email.utils import formatdate

import pytest

from zccp.upstream.client import MAX_RETRY_AFTER_S, retry_after_s
from zccp.upstream.http1 import Bounds, HttpError, _read_head


def head(data: bytes, bounds: Bounds, limit: int = 1 << 16) -> tuple[int, dict[str, str]]:
    async def go() -> tuple[int, dict[str, str]]:
        r = asyncio.StreamReader(limit=limit)
        r.feed_data(data)
        r.feed_eof()
        return await _read_head(r, bounds)

    return asyncio.run(go())


def test_interim_answers_are_skipped_up_to_the_bound() -> None:
    ok = b"HTTP/1.1 100 Continue\r\n\r\n" * 3 + b"HTTP/1.1 200 OK\r\nx-a: 1\r\n\r\n"
    assert head(ok, Bounds(interim=3)) == (200, {"x-a": "1"})
    with pytest.raises(HttpError, match="interim"):
        head(ok, Bounds(interim=2))


def test_a_long_header_line_is_an_http_error_not_a_value_error() -> None:
    data = b"HTTP/1.1 200 OK\r\nx-long: " + b"a" * 70_000 + b"\r\n\r\n"
    with pytest.raises(HttpError, match="max_header_kb"):
        head(data, Bounds())


def test_the_head_is_bounded_as_a_whole() -> None:
    data = b"HTTP/1.1 200 OK\r\n" + b"".join(b"x-%d: %s\r\n" % (i, b"a" * 900) for i in range(20)) + b"\r\n"
    assert head(data, Bounds(head=64 << 10))[0] == 200
    with pytest.raises(HttpError, match="head over"):
        head(data, Bounds(head=8 << 10))


def test_retry_after_seconds_and_dates() -> None:
    assert retry_after_s("7") == 7
    assert retry_after_s(None) is None and retry_after_s("soon") is None
    assert retry_after_s("99999999") == MAX_RETRY_AFTER_S
    got = retry_after_s(formatdate(time.time() + 30, usegmt=True))
    assert got is not None and 28 <= got <= 31
    assert retry_after_s(formatdate(time.time() - 30, usegmt=True)) == 0
