"""A tiny DNS server for tests (UDP and TCP on one loopback port): answers A queries for one
name with the addresses the test sets, NXDOMAIN for any other name, and counts the queries
(over either transport). The test can change its answer at any time (set_addresses), make
it answer NXDOMAIN for its name too (addresses = []), make it silent (a resolver that times
out), or answer with whatever bytes a function of the query returns (set_reply: hostile
answers, the same over TCP).

Like a real server, a UDP answer longer than the client can take (512 bytes, or the size an
EDNS0 OPT record in the query advertises) is cut to its question with the TC bit set: the
client asks again over TCP, where the whole answer goes (RFC 1035 4.2.2 framing)."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

UDP_PLAIN = 512     # RFC 1035's UDP limit for a query without EDNS0


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
    tcp_queries: int = 0
    port: int = 0
    _sock: socket.socket | None = None
    _tcp: socket.socket | None = None
    _thread: threading.Thread | None = None
    _tcp_thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> DnsServer:
        for _ in range(50):     # a port free for both UDP and TCP
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            udp.bind(("127.0.0.1", 0))
            tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                tcp.bind(("127.0.0.1", udp.getsockname()[1]))
                break
            except OSError:
                udp.close()
                tcp.close()
        else:
            raise RuntimeError("no loopback port free for both UDP and TCP")
        udp.settimeout(0.2)
        tcp.listen(16)
        tcp.settimeout(0.2)
        self._sock, self._tcp = udp, tcp
        self.port = udp.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="test-dns", daemon=True)
        self._tcp_thread = threading.Thread(target=self._serve_tcp, name="test-dns-tcp", daemon=True)
        self._thread.start()
        self._tcp_thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in (self._thread, self._tcp_thread):
            if t is not None:
                t.join(5)
        for sock in (self._sock, self._tcp):
            if sock is not None:
                sock.close()

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

    def answer(self, query: bytes, tcp: bool = False) -> bytes | None:
        if len(query) < 12:
            return None
        qid, _flags, qd, _an, _ns, ar = struct.unpack(">HHHHHH", query[:12])
        if qd != 1:
            return None
        qname, end = _read_name(query, 12)
        qtype, _qclass = struct.unpack(">HH", query[end:end + 4])
        question = query[12:end + 4]
        limit = UDP_PLAIN
        if ar and query[end + 4:end + 7] == b"\0\0\x29":     # root name, type OPT: its class is the size
            limit = max(UDP_PLAIN, struct.unpack(">H", query[end + 7:end + 9])[0])
        with self._lock:
            self.queries += 1
            self.tcp_queries += tcp
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
        whole = struct.pack(">HHHHHH", qid, 0x8180, 1, count, 0, 0) + question + records
        if not tcp and len(whole) > limit:   # too long for this client over UDP: TC, ask over TCP
            return struct.pack(">HHHHHH", qid, 0x8380, 1, 0, 0, 0) + question
        return whole

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

    def _serve_tcp(self) -> None:
        assert self._tcp is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._tcp.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    head = _recv_exact(conn, 2)
                    query = _recv_exact(conn, struct.unpack(">H", head)[0])
                    reply = self.answer(query, tcp=True)
                    if reply is not None:
                        conn.sendall(struct.pack(">H", len(reply)) + reply)
                except (OSError, IndexError, struct.error, UnicodeDecodeError):
                    pass


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise OSError("closed before the whole message")
        data += chunk
    return data
