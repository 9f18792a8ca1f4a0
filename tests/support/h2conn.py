"""A raw HTTP/2 connection to a test stack's nginx (the h2 package), for what httpx will not
do: a body that stops half way, a stream reset, a stream that stops reading its answer."""

from __future__ import annotations

from typing import Any

from tests.support.harness import Stack, tls_client_context

class H2Conn:
    """A raw HTTP/2 connection over TLS (the h2 package) for what httpx will not do: a body
    that stops half way, a stream reset, a stream that stops reading its answer."""

    def __init__(self, stack: Stack, timeout: float = 30) -> None:
        import socket

        import h2.config
        import h2.connection

        host, port = stack.cfg.server.listen.rsplit(":", 1)
        ctx = tls_client_context()
        ctx.set_alpn_protocols(["h2"])
        self.sock = ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=timeout),
                                    server_hostname=host)
        assert self.sock.selected_alpn_protocol() == "h2"
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.authority = f"{host}:{port}"
        self.streams: dict[int, dict[str, Any]] = {}
        self.goaway: Any = None          # the error code of the server's GOAWAY, once received
        self.flush()

    def flush(self) -> None:
        self.sock.sendall(self.conn.data_to_send())

    def request(self, path: str, body: bytes = b"", length: int | None = None, end: bool = True,
                method: str = "POST", headers: dict[str, str] | None = None) -> int:
        """Opens a stream: headers (content-length `length`, default len(body)), then `body`;
        the stream stays open for more unless end."""
        sid = self.conn.get_next_available_stream_id()
        hdrs = [(":method", method), (":path", path), (":scheme", "https"), (":authority", self.authority),
                ("content-type", "application/json"), ("content-length", str(len(body) if length is None else length))]
        hdrs += list((headers or {}).items())
        self.streams[sid] = {"status": None, "headers": {}, "body": b"", "ended": False, "reset": None}
        self.conn.send_headers(sid, hdrs, end_stream=end and not body)
        self.flush()
        if body:
            self.send(sid, body, end)
        return sid

    def send(self, sid: int, data: bytes, end: bool = False) -> None:
        """Sends what flow control allows now (reading the peer's window updates as needed)."""
        while data:
            room = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size)
            if room <= 0:
                self.pump()
                continue
            self.conn.send_data(sid, data[:room])
            data = data[room:]
            self.flush()
        if end:
            self.conn.end_stream(sid)
            self.flush()

    def reset(self, sid: int) -> None:
        self.conn.reset_stream(sid)
        self.flush()

    def pump(self, ack: bool = True, stalled: frozenset[int] = frozenset()) -> bool:
        """Reads once and records the events; ack: give the read bytes' flow-control credit
        back (False: a client that stops reading); stalled: streams whose own window is never
        given back (the connection's is: the other streams keep flowing). False when the
        connection closed."""
        import h2.events as ev

        data = self.sock.recv(65536)
        if not data:
            return False
        for e in self.conn.receive_data(data):
            st = self.streams.get(getattr(e, "stream_id", 0) or 0)
            if isinstance(e, ev.ResponseReceived) and st is not None:
                hdrs = {k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v
                        for k, v in e.headers}
                st["status"], st["headers"] = int(hdrs[":status"]), hdrs
            elif isinstance(e, ev.DataReceived) and st is not None:
                st["body"] += e.data
                if e.stream_id in stalled and e.flow_controlled_length:
                    self.conn.increment_flow_control_window(e.flow_controlled_length)   # connection only
                elif ack:
                    self.conn.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
            elif isinstance(e, ev.StreamEnded) and st is not None:
                st["ended"] = True
            elif isinstance(e, ev.StreamReset) and st is not None:
                st["reset"] = e.error_code
            elif isinstance(e, ev.ConnectionTerminated):
                self.goaway = e.error_code
        self.flush()
        return True

    def response(self, sid: int) -> dict[str, Any]:
        """Reads until stream sid ended or was reset: {status, headers, body, ended, reset}."""
        import h2.exceptions

        st = self.streams[sid]
        while not st["ended"] and st["reset"] is None:
            try:
                if not self.pump():
                    break
            except (h2.exceptions.ProtocolError, OSError):   # after the server's GOAWAY
                break
        return st

    def close(self) -> None:
        import contextlib

        with contextlib.suppress(Exception):
            self.conn.close_connection()
            self.flush()
        self.sock.close()
