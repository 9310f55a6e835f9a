"""Where an answer goes: the pipeline writes to a Sink, never to ASGI directly.

The HTTP edge's sink sends ASGI messages (gateway.http.asgi.AsgiSink); a batch runner or a test collects the
answer in memory (BufferSink). Both record the status they started with, once, and both answer an outcome
(``fail``) by ``gateway.outcomes.fail``, the one rule for it.
"""

from __future__ import annotations

from typing import Protocol

from gateway import outcomes
from gateway.context import Headers
from gateway.errors import GatewayError


class Sink(Protocol):
    @property
    def status(self) -> int | None:
        """The status the first start() sent; None until then. Read-only to the pipeline: only start() sets it."""

    async def start(self, status: int, headers: Headers) -> None:
        """Begin the answer. Exactly once; a second call is a bug (RuntimeError)."""

    async def send(self, body: bytes, more: bool = False) -> None:
        """Body bytes; ``more=False`` ends the answer."""

    async def fail(self, error: GatewayError, headers: Headers) -> None:
        """End the request with ``error``: as the whole answer if none started, else in-band if the answer is
        still open (an SSE error event), else not at all."""


class BufferSink:
    """Collects an answer in memory; ``error`` is the outcome it ended with, if any."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: Headers = []
        self.chunks: list[bytes] = []
        self.complete = False
        self.error: GatewayError | None = None

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
    def open(self) -> bool:
        return self.status is not None and not self.complete

    async def fail(self, error: GatewayError, headers: Headers) -> None:
        self.error = error
        await outcomes.fail(self, error, headers)

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)
