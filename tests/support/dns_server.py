"""A tiny DNS server for tests (UDP on loopback): answers A queries for one name with the
addresses the test sets, NXDOMAIN for any other name, and counts the queries. The test can
change its answer at any time (set_addresses), make it answer NXDOMAIN for its name too
(addresses = []), make it silent (a resolver that times out), or answer with whatever bytes
a function of the query returns (set_reply: hostile answers)."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field


def _encode_name(name: str) -> bytes:
    return b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"


def _read_name(packet: bytes, pos: int) -> tuple[str, int]:
    labels = []
    while True:
        n = packet[pos]
        if n == 0:
            return ".".join(labels), pos + 1
        labels.append(packet[pos + 1:pos + 1 + n].decode("ascii", "replace"))
        pos += 1 + n


@dataclass
class DnsServer:
    name: str
    addresses: list[str] = field(default_factory=list)
    silent: bool = False
    reply: Callable[[bytes], bytes] | None = None     # set_reply: raw answers
    queries: int = 0
    port: int = 0
    _sock: socket.socket | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> DnsServer:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="test-dns", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._sock is not None:
            self._sock.close()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set_addresses(self, addresses: list[str]) -> int:
        """Answer with these from now on; returns the query count at the change."""
        with self._lock:
            self.addresses = list(addresses)
            self.silent, self.reply = False, None
            return self.queries

    def set_silent(self) -> int:
        with self._lock:
            self.silent = True
            return self.queries

    def set_reply(self, reply: Callable[[bytes], bytes] | None) -> int:
        """Answer every query with reply(query) (None: back to normal answers)."""
        with self._lock:
            self.reply = reply
            self.silent = False
            return self.queries

    def answer(self, query: bytes) -> bytes | None:
        if len(query) < 12:
            return None
        qid, _flags, qd = struct.unpack(">HHH", query[:6])
        if qd != 1:
            return None
        qname, end = _read_name(query, 12)
        qtype, _qclass = struct.unpack(">HH", query[end:end + 4])
        question = query[12:end + 4]
        with self._lock:
            self.queries += 1
            if self.silent:
                return None
            if self.reply is not None:
                return self.reply(query)
            addrs = list(self.addresses) if qname.lower() == self.name.lower() else None
        if not addrs:
            # NXDOMAIN (also for our name while the test lists no address)
            return struct.pack(">HHHHHH", qid, 0x8183, 1, 0, 0, 0) + question
        records = b""
        if qtype == 1:
            for a in addrs:
                # the name as a pointer to the question (offset 12), type A, class IN, ttl 5
                records += struct.pack(">HHHIH", 0xC00C, 1, 1, 5, 4) + socket.inet_aton(a)
        count = len(addrs) if qtype == 1 else 0
        return struct.pack(">HHHHHH", qid, 0x8180, 1, count, 0, 0) + question + records

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                data, peer = self._sock.recvfrom(4096)
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            try:
                reply = self.answer(data)
            except (IndexError, struct.error, UnicodeDecodeError):
                reply = None
            if reply is not None:
                self._sock.sendto(reply, peer)
