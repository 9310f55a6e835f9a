"""The HTTP server's own limits: what a client may send and how long it may take, enforced before the app.

uvicorn's httptools protocol reads request heads without a size limit and times out only idle keep-alive
connections, never a fresh connection that sends nothing or trickles a head or body one byte at a time.
Measured on this gateway before this module: a 64 MiB header was read in full and stalled the event loop
~2 s (health scrapes missed, healthy workers dropped); 700 idle or half-sent connections were all held.

``GuardedHttpToolsProtocol`` adds, from the policy's ``server`` section:
- a request line (414) and head (431) size limit and a header count limit (431), checked as the parser
  hands over each piece; and the head's bytes counted as they arrive, the parser fed no more than the head's
  room at a time, so a header that never ends (which httptools would keep whole until it does) is refused at
  the request line's and the headers' limits together before it is buffered;
- an idle timeout for a connection that has not sent a byte (closed), a head timeout from a request's
  first byte to the end of its head (408), and a body timeout from the head to the end of the body (408);
- concurrent connections are capped by uvicorn's ``limit_concurrency`` (503), set from the same section;
- each request's ``Departure`` (``gateway.http.asgi``) in its scope's extensions, told when the connection is
  lost before its response ended: the request's task is cancelled then, with no watcher task per request;
- an answer whose head declares its length goes out in one write with its body (``OneWriteCycle``), where
  uvicorn writes the head and the body each as it comes: one system call fewer per plain answer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from gateway.errors import InvalidRequest
from gateway.http.asgi import DEPARTURE, Departure
from gateway.outcomes import body_of
from gateway.policy.schema import Server

_REASONS = {408: b"Request Timeout", 414: b"URI Too Long", 431: b"Request Header Fields Too Large"}
_MESSAGES = {
    408: ("The request was not received in time.", "request_timeout"),
    414: ("The request line is too long.", "request_line_too_long"),
    431: ("The request headers are too large or too many.", "headers_too_large"),
}


# A file upload's body has the body timeout for every UPLOAD_PROGRESS_BYTES it delivers, not for the whole file:
# 200 MB would otherwise need 6.7 MB/s within the 30 s default; a trickle (under 64 KiB per timeout) still ends.
UPLOAD_PATH = b"/v1/files"
UPLOAD_PROGRESS_BYTES = 64 * 1024
LINGER_S = 2.0  # how long a refused connection's client may go on sending (read and dropped) before it is closed
# ... and how much: over loopback a client writing a header that never ends pushed 3.5 GB through the gateway's
# reads in those 2 s (a core busy for nothing); a client that will read its answer has stopped long before this.
LINGER_BYTES = 8 * 1024 * 1024  # above what one large write of a client puts in the socket buffers


@dataclass(frozen=True, slots=True)
class Limits:
    """The protocol's share of the policy's server section (its defaults live there, once)."""

    max_request_line_bytes: int
    max_header_bytes: int
    max_headers: int
    idle_timeout_s: float
    header_timeout_s: float
    body_timeout_s: float

    @property
    def max_head_bytes(self) -> int:
        """The whole head, counted raw as it arrives: the request line's limit and the headers' together."""
        return self.max_request_line_bytes + self.max_header_bytes

    @classmethod
    def from_policy(cls, server: Server) -> Limits:
        return cls(server.max_request_line_bytes, server.max_header_bytes, server.max_headers,
                   server.idle_timeout_s, server.header_timeout_s, server.body_timeout_s)


class _Gathered:
    """Stands in for the transport while uvicorn's cycle renders a head: keeps what it writes."""

    __slots__ = ("closing", "parts")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.parts.append(data)

    def close(self) -> None:
        self.closing = True


def _sized(headers: Any) -> bool:
    """Does the head declare its body's length? (One comprehension, not a generator stepped per header: it runs
    for every answer.)"""
    return b"content-length" in [name.lower() for name, _ in headers]


class OneWriteCycle(RequestResponseCycle):
    """uvicorn's request-response cycle, except that a head declaring a ``content-length`` is held until the
    first body message and written with it: a plain answer's head and body reach the client in one write (one
    system call, one segment) instead of two. uvicorn still renders and checks every byte; only when they are
    written changes. Only a sized head is held, and only until the next message, which joins it: the gateway's
    answers send their body at once (``AsgiSink``), a stream's head (chunked) is never held and goes out before
    its first token, and nothing but a head is ever kept. A response that fails between head and body writes
    nothing, and the connection is closed (uvicorn's cycle then closes it too)."""

    _held: _Gathered | None = None

    async def send(self, message: Any) -> None:
        held = self._held
        if held is None:
            if message["type"] != "http.response.start" or self.response_started or \
                    not _sized(message.get("headers", ())):
                return await super().send(message)
            real, self.transport = self.transport, cast(asyncio.Transport, _Gathered())
            try:
                await super().send(message)
            finally:
                self._held, self.transport = cast(_Gathered, self.transport), real
            return None
        self._held, real = None, self.transport
        self.transport = cast(asyncio.Transport, held)
        try:
            await super().send(message)
        finally:
            self.transport = real
        if held.parts and not real.is_closing():
            real.write(b"".join(held.parts))
        if held.closing:
            real.close()
        return None


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with size limits and read timeouts (see the module docstring)."""

    limits = Limits.from_policy(Server())

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # One deadline per connection, checked by a sweep every SWEEP_S instead of a timer per request phase:
        # re-arming call_later three times per request was measurable on the hot path.
        self._deadline: float | None = None
        self._expiry_status: int | None = None  # answered when the deadline passes (None: just close)
        self._line_bytes = 0
        self._head_bytes = 0
        self._in_head = True  # the next byte fed is part of a request head (from its first byte to its end)
        self._head_room = self.limits.max_head_bytes  # what the head may still take, in raw bytes
        self._header_count = 0
        self._refused = False
        self._lingered = 0  # bytes read and dropped since the refusal
        self._upload_progress = -1  # bytes of an upload's body since its deadline moved; -1: not an upload

    # -- deadlines ------------------------------------------------------------------------------------

    def _arm(self, seconds: float, status: int | None) -> None:
        self._deadline = self.loop.time() + seconds
        self._expiry_status = status

    def _disarm(self) -> None:
        self._deadline = None

    def _expire(self) -> None:
        status = self._expiry_status
        self._deadline = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        started = cycle is not None and cycle.response_started and not cycle.response_complete
        if status is None or started:
            self.transport.close()
        else:
            self._refuse(status)

    # -- refusing -------------------------------------------------------------------------------------

    def _refuse(self, status: int) -> None:
        """Answer ``status`` with an OpenAI-shaped error and end the connection; drop whatever else arrives.

        The answer is followed by a FIN, and what the client still sends is read and dropped until it closes or
        LINGER_S pass: closing with its bytes unread would send a reset, which can reach the client before it
        reads the answer (a client still writing an oversized head sees only "connection reset")."""
        self._refused = True
        message, code = _MESSAGES[status]
        body = body_of(InvalidRequest(message, code))
        self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                             b"connection: close\r\n\r\n" % (status, _REASONS[status], len(body)) + body)
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.flow.resume_reading()
            self._arm(LINGER_S, None)
        else:
            self.transport.close()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()

    # -- protocol callbacks ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(cast(asyncio.Transport, transport))  # a stream server's connection
        self._arm(self.limits.idle_timeout_s, None)
        _ensure_sweeper(self.loop, self.connections)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        for cycle in (self.cycle, *(queued for queued, _ in self.pipeline)):
            if cycle is not None and not cycle.response_complete:
                cast(Departure, cycle.scope["extensions"][DEPARTURE]).leave()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Feed the parser at most the head's room at a time: past it with the head unfinished, refuse (431).

        A body is fed in pieces of the same size, so a request pipelined behind it in the same read goes
        uncounted for less than one limit (the parser cannot say where in a piece a request began)."""
        if self._refused:
            self._lingered += len(data)
            if self._lingered > LINGER_BYTES:
                self.transport.close()
            return
        view = memoryview(data)
        while view and not self._refused and not self.transport.is_closing():
            piece = view[:self._head_room if self._in_head else self.limits.max_head_bytes]
            view = view[len(piece):]
            if self._in_head:
                self._head_room -= len(piece)  # before feeding: a request that ends in the piece starts afresh
            # httptools parses any buffer: a slice of the read, not a copy (uvicorn's signature says bytes)
            super().data_received(piece)  # type: ignore[arg-type]
            if self.transport.get_protocol() is not self:
                return  # upgraded to a WebSocket: uvicorn hands it the head and drops the rest of the read
            if self._in_head and not self._head_room and not self._refused:
                self._refuse(431)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = cast(Any, {DEPARTURE: Departure()})
        self._line_bytes = self._head_bytes = self._header_count = 0
        self._arm(self.limits.header_timeout_s, 408)

    def on_url(self, url: bytes) -> None:
        if self._refused:
            return
        self._line_bytes += len(url)
        if self._line_bytes > self.limits.max_request_line_bytes:
            self._refuse(414)
            return
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refused:
            return
        self._head_bytes += len(name) + len(value) + 4
        self._header_count += 1
        if self._head_bytes > self.limits.max_header_bytes or self._header_count > self.limits.max_headers:
            self._refuse(431)
            return
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._in_head = False
        self._arm(self.limits.body_timeout_s, 408)
        self._upload_progress = 0 if self.url.startswith(UPLOAD_PATH) else -1
        super().on_headers_complete()
        if type(self.cycle) is RequestResponseCycle:  # uvicorn builds its own cycle (by name): made ours here,
            self.cycle.__class__ = OneWriteCycle  # before its task's first step reads ``send``

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return
        if self._upload_progress >= 0:  # an upload keeps its time while it keeps coming
            self._upload_progress += len(body)
            if self._upload_progress >= UPLOAD_PROGRESS_BYTES:
                self._upload_progress = 0
                self._arm(self.limits.body_timeout_s, 408)
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        self._disarm()
        self._in_head, self._head_room = True, self.limits.max_head_bytes
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self.pipeline:
            self._arm(self.limits.idle_timeout_s, None)


SWEEP_S = 0.25
_sweepers: dict[asyncio.AbstractEventLoop, asyncio.Task[None]] = {}


def _ensure_sweeper(loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
    """One task per event loop expires the connections whose deadline has passed."""
    task = _sweepers.get(loop)
    if task is None or task.done():
        _sweepers[loop] = loop.create_task(_sweep(loop, connections))


async def _sweep(loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
    while True:
        await asyncio.sleep(SWEEP_S)
        now = loop.time()
        for protocol in list(connections):
            deadline = getattr(protocol, "_deadline", None)
            if deadline is not None and deadline <= now:
                protocol._expire()


def protocol_for(limits: Limits) -> type[GuardedHttpToolsProtocol]:
    """A protocol class bound to ``limits`` (uvicorn instantiates the class it is given)."""
    return type("GatewayHttpProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})
