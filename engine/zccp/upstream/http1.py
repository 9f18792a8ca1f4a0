"""A small HTTP/1.1 client on asyncio streams, for the upstream hop: keep-alive
connections pooled per host, a request written in one go, a response read by
Content-Length, chunked transfer coding or to the connection's close.

Why not httpx: measured here (docs/upstreams.md), httpx.AsyncClient spends ~1.0 ms of CPU
per request, this ~0.085 ms; at the upstream hop that is the difference between the
gateway's overhead target (1 ms p50) and missing it by the client alone. It does only what
the hop needs: POST and GET, HTTP/1.1 (TLS by the ssl module for https), no redirects, no
cookies, no proxies.

The server is not trusted: every size it chooses is bounded (Bounds: the head, one SSE line
and event, the body, the interim 1xx answers) and every way it can misbehave is an HttpError,
so the client marks the URL and moves on (docs/upstreams.md).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_HEADERS = 128
READ_SIZE = 1 << 16


@dataclass(frozen=True)
class Bounds:
    """What one answer may hold (upstream.max_*: config.UpstreamConfig)."""

    head: int = 64 << 10          # the status line and the headers together, bytes
    body: int = 16 << 20          # the body, whole or streamed, bytes (chunk framing excluded)
    event: int = 1 << 20          # one line of the body read by lines(), and one SSE event's lines together
    interim: int = 8              # 1xx answers skipped before the real one


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
                 read_timeout: float, bounds: Bounds) -> None:
        self._pool = pool
        self._bounds = bounds
        self._read = 0                     # body bytes so far (Bounds.body)
        self._origin = origin
        self._conn: _Conn | None = conn
        self.status = status
        self.headers = headers
        self._timeout = read_timeout
        te = headers.get("transfer-encoding", "").lower()
        self._chunked = "chunked" in te
        self._chunk_left = 0               # bytes of the current chunk not read yet
        cl = headers.get("content-length")
        self._left = int(cl) if cl is not None and cl.isdigit() and not self._chunked else -1
        self._to_close = not self._chunked and self._left < 0     # read to EOF: not reusable
        self._done = self._left == 0 or status in (204, 304)
        if self._left > bounds.body:
            raise HttpError(f"the answer's content-length {self._left} is over the bound of {bounds.body} bytes")
        self._keep = headers.get("connection", "").lower() != "close" and not self._to_close

    async def _read_some(self) -> bytes:
        """The body's next piece (b"" at its end)."""
        conn = self._conn
        if self._done or conn is None:
            return b""
        r = conn.reader
        async with asyncio.timeout(self._timeout):
            if self._chunked:
                if self._chunk_left == 0:
                    size_line = await _line(r, "a chunk size line")
                    try:
                        size = int(size_line.split(b";", 1)[0].strip(), 16)
                    except ValueError:
                        raise HttpError("a broken chunk size") from None
                    if size < 0:
                        raise HttpError("a broken chunk size")
                    if size == 0:
                        head = 0
                        while (t := await _line(r, "a trailer line")) not in (b"\r\n", b"\n", b""):
                            head += len(t)                    # trailers, bounded like the head
                            if head > self._bounds.head:
                                raise HttpError(f"trailers over {self._bounds.head} bytes")
                        self._done = True
                        return b""
                    self._chunk_left = size
                # A chunk is read in pieces, never whole: its size is the server's word.
                data = await r.read(min(self._chunk_left, READ_SIZE))
                if not data:
                    raise HttpError("the connection closed inside a chunk")
                self._chunk_left -= len(data)
                if self._chunk_left == 0:
                    await r.readexactly(2)
                return data
            if self._left > 0:
                data = await r.read(min(self._left, READ_SIZE))
                if not data:
                    raise HttpError("the connection closed before the body's end")
                self._left -= len(data)
                self._done = self._left == 0
                return data
            data = await r.read(READ_SIZE)
            if not data:
                self._done = True
            return data

    async def _piece(self) -> bytes:
        try:
            data = await self._read_some()
        except TimeoutError:
            raise HttpError("read timeout", timeout=True) from None
        except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise HttpError(f"the answer broke off: {type(exc).__name__}") from None
        self._read += len(data)
        if self._read > self._bounds.body:
            self._keep = False
            raise HttpError(f"the answer is over the bound of {self._bounds.body} bytes (upstream.max_body_kb)")
        return data

    async def read(self) -> bytes:
        parts = []
        while piece := await self._piece():
            parts.append(piece)
        return b"".join(parts)

    async def lines(self) -> AsyncIterator[bytes]:
        """The body's lines (without their line ends), as they arrive. Linear in the body:
        each byte is scanned for a line end once; a line, and an SSE event's lines
        together (up to a blank line), are bounded by Bounds.event."""
        bound = self._bounds.event
        buf = bytearray()
        event = 0
        while piece := await self._piece():
            scan = len(buf)                  # what is already in buf has no line end
            buf += piece
            start = 0
            while (nl := buf.find(b"\n", scan)) >= 0:
                line = bytes(buf[start:nl]).rstrip(b"\r")
                start = scan = nl + 1
                event = 0 if not line else event + len(line)
                if event > bound:
                    raise HttpError(f"an SSE event over {bound} bytes (upstream.max_event_kb)")
                yield line
            if start:
                del buf[:start]              # once per piece, not once per line
            if len(buf) > bound or event + len(buf) > bound:
                raise HttpError(f"an SSE line over {bound} bytes (upstream.max_event_kb)")
        if buf:
            yield bytes(buf)

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

    def __init__(self, max_connections: int, connect_timeout: float, read_timeout: float,
                 bounds: Bounds | None = None) -> None:
        self.bounds = bounds or Bounds()
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
                                                               limit=max(READ_SIZE, self.bounds.head))
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
                        status, hdrs = await _read_head(conn.reader, self.bounds)
                except _Stale as exc:
                    conn.close()
                    if reused:
                        continue                 # a stale keep-alive connection: a fresh one
                    raise HttpError(f"no answer: {exc}", connect=True) from None
                except HttpError:
                    conn.close()                 # the server answered, badly: not a stale connection
                    raise
                except TimeoutError:
                    conn.close()
                    raise HttpError("read timeout", timeout=True) from None
                except (OSError, asyncio.IncompleteReadError) as exc:
                    conn.close()
                    if reused:
                        continue
                    raise HttpError(f"no answer: {type(exc).__name__}", connect=True) from None
                try:
                    return Response(self, origin, conn, status, hdrs, timeout, self.bounds)
                except HttpError:
                    conn.close()
                    raise

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


class _Stale(Exception):
    """Nothing of an answer came back: the connection was closed (a stale keep-alive one)."""


async def _line(r: asyncio.StreamReader, what: str) -> bytes:
    """One line, bounded by the reader's limit (Pool._connect): a longer one is an HttpError,
    never the ValueError StreamReader.readline raises for it."""
    try:
        return await r.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        return exc.partial              # EOF: what came (b"" at once)
    except (asyncio.LimitOverrunError, ValueError):
        raise HttpError(f"{what} over the bound of upstream.max_header_kb") from None


async def _read_head(r: asyncio.StreamReader, bounds: Bounds) -> tuple[int, dict[str, str]]:
    """The status and headers of the real answer: up to bounds.interim 1xx answers are
    skipped (a loop, not a recursion); the head is bounded by bounds.head bytes."""
    for _ in range(bounds.interim + 1):
        status, headers = await _one_head(r, bounds)
        if not 100 <= status < 200:
            return status, headers
    raise HttpError(f"more than {bounds.interim} interim (1xx) answers (upstream.max_interim)")


async def _one_head(r: asyncio.StreamReader, bounds: Bounds) -> tuple[int, dict[str, str]]:
    line = await _line(r, "the status line")
    if not line:
        raise _Stale("the connection closed")
    size = len(line)
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit() or len(parts[1]) != 3:
        raise HttpError(f"not an HTTP/1.x status line: {line[:60]!r}")
    status = int(parts[1])
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS):
        h = await _line(r, "a header line")
        size += len(h)
        if size > bounds.head:
            raise HttpError(f"a head over {bounds.head} bytes (upstream.max_header_kb)")
        if h in (b"\r\n", b"\n"):
            return status, headers
        if not h:
            raise HttpError("the connection closed in the headers")
        name, sep, value = h.decode("latin-1").partition(":")
        if not sep:
            raise HttpError("a broken header line")
        headers[name.strip().lower()] = value.strip()
    raise HttpError("too many headers")
