"""Where an answer goes: the pipeline writes to a Sink, never to ASGI directly.

The HTTP edge's sink sends ASGI messages (gateway.asgi.AsgiSink); a batch runner or a test collects the
answer in memory (BufferSink). Both record the status they started with, once.
"""

from __future__ import annotations

from typing import Protocol

from gateway.context import Headers


class Sink(Protocol):
    status: int | None  # set by the first start(); None until then

    async def start(self, status: int, headers: Headers) -> None:
        """Begin the answer. Exactly once; a second call is a bug (RuntimeError)."""

    async def send(self, body: bytes, more: bool = False) -> None:
        """Body bytes; ``more=False`` ends the answer."""


class BufferSink:
    """Collects an answer in memory."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: Headers = []
        self.chunks: list[bytes] = []
        self.complete = False

    async def start(self, status: int, headers: Headers) -> None:
        if self.status is not None:
            raise RuntimeError("the answer has already started")
        self.status, self.headers = status, headers

    async def send(self, body: bytes, more: bool = False) -> None:
        if self.status is None:
            raise RuntimeError("send() before start()")
        if body:
            self.chunks.append(body)
        self.complete = not more

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)
