"""A small HTTP/1.1 client on asyncio streams, for the upstream hop: keep-alive
connections pooled per host, a request written in one go, a response read by
Content-Length, chunked transfer coding or to the connection's close.

Why not httpx: measured here (docs/upstreams.md), httpx.AsyncClient spends ~1.0 ms of CPU
per request, this ~0.085 ms; at the upstream hop that is the difference between the
gateway's overhead target (1 ms p50) and missing it by the client alone. It does only what
the hop needs: POST and GET, HTTP/1.1 (TLS by the ssl module for https), no redirects, no
cookies, no proxies.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_HEADER_LINE = 1 << 16
MAX_HEADERS = 128


class HttpError(Exception):
    """The exchange failed; `connect`: before the request reached the server."""

    def __init__(self, message: str, connect: bool = False, timeout: bool = False) -> None:
        super().__init__(message)
        self.connect = connect
        self.timeout = timeout


@dataclass(frozen=True)
class Origin:
    host: str
    port: int
    tls: bool

    @classmethod
    def of(cls, url: str) -> tuple[Origin, str]:
        """The URL's origin and its path (with the query)."""
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = u.scheme == "https"
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        return cls(u.hostname, u.port or (443 if tls else 80), tls), path


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        self.writer.close()


class Response:
    """A response whose body is not read yet: read() it whole, or lines() of it (SSE);
    close() hands a fully read connection back to the pool, or drops it."""

    def __init__(self, pool: Pool, origin: Origin, conn: _Conn, status: int, headers: dict[str, str],
                 read_timeout: float) -> None:
        self._pool = pool
        self._origin = origin
        self._conn: _Conn | None = conn
        self.status = status
        self.headers = headers
        self._timeout = read_timeout
        te = headers.get("transfer-encoding", "").lower()
        self._chunked = "chunked" in te
        cl = headers.get("content-length")
        self._left = int(cl) if cl is not None and cl.isdigit() and not self._chunked else -1
        self._to_close = not self._chunked and self._left < 0     # read to EOF: not reusable
        self._done = self._left == 0 or status in (204, 304)
        self._keep = headers.get("connection", "").lower() != "close" and not self._to_close

    async def _read_some(self) -> bytes:
        """The body's next piece (b"" at its end)."""
        conn = self._conn
        if self._done or conn is None:
            return b""
        r = conn.reader
        async with asyncio.timeout(self._timeout):
            if self._chunked:
                size_line = await r.readline()
                try:
                    size = int(size_line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise HttpError("a broken chunk size") from None
                if size == 0:
                    while (await r.readline()) not in (b"\r\n", b"\n", b""):
                        pass                                  # trailers
                    self._done = True
                    return b""
                data = await r.readexactly(size)
                await r.readexactly(2)
                return data
            if self._left > 0:
                data = await r.read(min(self._left, 1 << 16))
                if not data:
                    raise HttpError("the connection closed before the body's end")
                self._left -= len(data)
                self._done = self._left == 0
                return data
            data = await r.read(1 << 16)
            if not data:
                self._done = True
            return data

    async def _piece(self) -> bytes:
        try:
            return await self._read_some()
        except TimeoutError:
            raise HttpError("read timeout", timeout=True) from None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise HttpError(f"the answer broke off: {type(exc).__name__}") from None

    async def read(self) -> bytes:
        parts = []
        while piece := await self._piece():
            parts.append(piece)
        return b"".join(parts)

    async def lines(self) -> AsyncIterator[bytes]:
        """The body's lines (without their line ends), as they arrive."""
        buf = b""
        while piece := await self._piece():
            buf += piece
            *full, buf = buf.split(b"\n")
            for line in full:
                yield line.rstrip(b"\r")
        if buf:
            yield buf

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and self._keep:
            self._pool.put(self._origin, conn)
        else:
            conn.close()


class Pool:
    """Idle keep-alive connections per origin (at most `max_idle` each); at most
    `max_connections` exchanges at a time."""

    def __init__(self, max_connections: int, connect_timeout: float, read_timeout: float) -> None:
        self._idle: dict[Origin, deque[_Conn]] = {}
        self._max_idle = max_connections
        self._sem = asyncio.Semaphore(max_connections)
        self._connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._ssl: ssl.SSLContext | None = None

    def put(self, origin: Origin, conn: _Conn) -> None:
        idle = self._idle.setdefault(origin, deque())
        if len(idle) < self._max_idle:
            idle.append(conn)
        else:
            conn.close()

    async def _connect(self, origin: Origin) -> _Conn:
        if origin.tls and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            async with asyncio.timeout(self._connect_timeout):
                reader, writer = await asyncio.open_connection(origin.host, origin.port,
                                                               ssl=self._ssl if origin.tls else None,
                                                               limit=MAX_HEADER_LINE)
        except TimeoutError:
            raise HttpError("connect timeout", connect=True, timeout=True) from None
        except OSError as exc:
            raise HttpError(f"connect failed: {exc.strerror or type(exc).__name__}", connect=True) from None
        return _Conn(reader, writer)

    async def request(self, method: str, url: str, headers: dict[str, str], body: bytes = b"",
                      read_timeout: float | None = None) -> Response:
        """Send one request and read the status and headers. A reused connection the server
        had closed meanwhile (nothing of an answer came back) is retried once on a new one."""
        origin, path = Origin.of(url)
        head = [f"{method} {path} HTTP/1.1", f"host: {origin.host}:{origin.port}",
                f"content-length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        timeout = self.read_timeout if read_timeout is None else read_timeout
        async with self._sem:
            idle = self._idle.get(origin)
            while True:
                reused = bool(idle)
                conn = idle.popleft() if idle else await self._connect(origin)
                try:
                    conn.writer.write(data)
                    async with asyncio.timeout(timeout):
                        status, hdrs = await _read_head(conn.reader)
                except (OSError, asyncio.IncompleteReadError, HttpError, TimeoutError) as exc:
                    conn.close()
                    if reused and not isinstance(exc, TimeoutError):
                        continue                 # a stale keep-alive connection: a fresh one
                    if isinstance(exc, TimeoutError):
                        raise HttpError("read timeout", timeout=True) from None
                    raise HttpError(f"no answer: {type(exc).__name__}", connect=not reused) from None
                return Response(self, origin, conn, status, hdrs, timeout)

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


async def _read_head(r: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    line = await r.readline()
    if not line:
        raise HttpError("the connection closed")
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise HttpError(f"not an HTTP/1.x status line: {line[:60]!r}")
    status = int(parts[1])
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS):
        h = await r.readline()
        if h in (b"\r\n", b"\n"):
            if 100 <= status < 200:              # an interim answer: the real one follows
                return await _read_head(r)
            return status, headers
        if not h:
            raise HttpError("the connection closed in the headers")
        name, sep, value = h.decode("latin-1").partition(":")
        if not sep:
            raise HttpError("a broken header line")
        headers[name.strip().lower()] = value.strip()
    raise HttpError("too many headers")
