"""A real HTTP/1.1 server on loopback that answers from a script, for the upstream failure
cases no real server produces on demand: a 429 or a 500 before the first byte, a stream
cut mid-way, and a hostile server (issue 28 item 6): a body of gigabytes, an SSE line that
never ends, a header line over 64 KiB, 1xx answers without end. Everything else is tested
against real servers (a second ZCCP stack, `transformers serve`)."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field

MIB = 1 << 20


@dataclass
class Scripted:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    cut: bool = False               # close the connection after `body`, with no end of the chunked body
    interim: int = 0                # 1xx answers sent first; -1: without end (until the client leaves)
    header_line: int = 0            # an extra header line of this many bytes
    generated: int = 0              # a chunked body of this many bytes ('x'), made 1 MiB at a time, never held
    content_type: str = "text/event-stream"
    drip: bytes = b""               # after `body`: this, every drip_s, until the client leaves
    drip_s: float = 0.01


def openai_chunks(pieces: list[str], finish: bool = True) -> bytes:
    """An OpenAI chat.completion.chunk stream of `pieces` (to its [DONE] when finish)."""
    import json

    out = b""
    for p in pieces:
        out += b"data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {"content": p}, "finish_reason": None}]}).encode() + b"\n\n"
    if finish:
        out += b"data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": len(pieces)}}).encode() + b"\n\n"
        out += b"data: [DONE]\n\n"
    return out


class ScriptedUpstream:
    """Answers each request with the next Scripted (the last one repeats); counts them."""

    def __init__(self, script: list[Scripted]) -> None:
        self.script = script
        self.requests = 0
        self.sent = 0                           # body bytes sent (generated and drip)
        self.left = threading.Event()           # a client closed a connection mid-answer
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        try:
            self._exchange(conn)
        except OSError:
            self.left.set()                     # the client went away mid-answer

    def _exchange(self, conn: socket.socket) -> None:
        with conn:
            f = conn.makefile("rb")
            while True:
                line = f.readline()
                if not line:
                    return
                length = 0
                while (h := f.readline()) not in (b"\r\n", b""):
                    name, _, value = h.decode().partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                f.read(length)
                if line.startswith(b"GET"):       # the health probe
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                    continue
                s = self.script[min(self.requests, len(self.script) - 1)]
                self.requests += 1
                hdrs = "".join(f"{k}: {v}\r\n" for k, v in s.headers.items())
                if s.header_line:
                    hdrs += "x-long: " + "a" * s.header_line + "\r\n"
                n = 0
                while n != s.interim:
                    conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                    n += 1
                if s.status == 200:
                    head = (f"HTTP/1.1 200 OK\r\ncontent-type: {s.content_type}\r\n"
                            f"{hdrs}transfer-encoding: chunked\r\n\r\n")
                    conn.sendall(head.encode() + (b"%x\r\n%s\r\n" % (len(s.body), s.body) if s.body else b""))
                    self._generate(conn, s)
                    if s.cut:
                        return
                    conn.sendall(b"0\r\n\r\n")
                else:
                    conn.sendall(f"HTTP/1.1 {s.status} X\r\ncontent-type: application/json\r\n{hdrs}"
                                 f"content-length: {len(s.body)}\r\n\r\n".encode() + s.body)

    def _generate(self, conn: socket.socket, s: Scripted) -> None:
        """The generated body (1 MiB chunks, one buffer reused), then the drip: sendall
        raises once the client has closed, which ends the exchange."""
        piece = b"%x\r\n" % MIB + b"x" * MIB + b"\r\n"
        left = s.generated
        while left >= MIB:
            conn.sendall(piece)
            self.sent += MIB
            left -= MIB
        if left:
            conn.sendall(b"%x\r\n%s\r\n" % (left, b"x" * left))
            self.sent += left
        while s.drip:
            conn.sendall(b"%x\r\n%s\r\n" % (len(s.drip), s.drip))
            self.sent += len(s.drip)
            time.sleep(s.drip_s)

    def close(self) -> None:
        self._sock.close()
