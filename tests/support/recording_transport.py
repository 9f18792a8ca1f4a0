"""A stand-in for an asyncio write transport that keeps what was written (the doorbell's
Connection writes frames to it): the unit tests of the request and token paths read it."""

from __future__ import annotations


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default      # no socket: the doorbell's Connection writes only through write()

    def close(self) -> None:
        pass
