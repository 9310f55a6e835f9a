"""The HTTP/1.1 client the gateway talks to its workers with: keep-alive connections per worker, a request in one
write, the answer parsed by httptools (the C parser uvicorn's server side already uses).

Why not aiohttp's ClientSession here: profiled under load (py-spy, 64 concurrent non-streamed requests), its
request and response objects, header multidicts, tracing signals and payload registry were ~40% of the gateway's
event-loop CPU per request. The workers speak one dialect (a JSON POST, an answer with a length or chunked, maybe
SSE), so the client only needs: a connection pool, timeouts for connecting, for silence and for the whole
answer, caps on what an answer may hold, and errors that say which phase failed. The scraper
(gateway.fleet.observe) reads /health and /metrics with it too. It is held to the rules below by
tests/inprocess/transport/test_http1_rules.py; why it is ours and not a library's, with the figures against
pyreqwest, aiosonic and aiohttp: docs/decisions/001-workers-http-client.md.

The framing is llhttp's (through httptools: Content-Length against Transfer-Encoding, chunk sizes, a length
given twice); the state machine around it keeps RFC 9112's rules for a client, as h11's does, because a
connection is shared by tenants one request after another and any slip hands one request's answer to the next:
- an interim answer (1xx but 101) is skipped; the final answer follows it on the same connection;
- a connection is reused only after a complete final answer with nothing after it: a byte that comes while no
  request is outstanding, or after the answer's end, is a peer speaking out of turn and closes the connection;
- the answer's head and body are capped as bytes arrive (before httptools buffers a header that never ends),
  and the whole answer has a deadline beside the silence timeout between bytes.

A connection's place in that exchange is one ``State``, and ``TRANSITIONS`` is every step it may take; each step
goes through ``_Connection._move``, which refuses any other. A refused step is a bug here, never the worker's:
it fails the request under way (``StateError``, an UpstreamError, so the request ends as any worker failure does)
and closes the connection, and the loop goes on (``STRICT``, set by the tests, raises it as well)::

    IDLE --send--> HEAD --1xx head--> INTERIM --its end--> HEAD          (interim answers first: RFC 9110 §15.2)
                   HEAD --final head--> BODY --its end--> COMPLETE       (the body's framing: RFC 9112 §6.3)
                   COMPLETE --released--> IDLE                           (persistence: RFC 9112 §9.3)
    HEAD, BODY, COMPLETE --a rule broken in the bytes fed--> BROKEN --after the feed--> CLOSED
    IDLE, HEAD, BODY, COMPLETE --closed by either side, a timeout, a cap--> CLOSED

The state moves at a send, a head, an answer's end, a release and a failure only: a body's read (data_received
-> on_body -> Response._feed, one a streamed event) compares it and moves nothing. Three fields stay beside it,
as none of them is a step of the exchange: ``received`` (a byte of this answer came, which decides whether a
request that met a closed connection may be sent again: set at every read, where a step would cost a call),
``paused`` (flow control: reading stopped while the reader is behind, which a BODY may be or not), and ``fault``
(what BROKEN, or a refused step, fails the request with).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import logging
import select
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

HIGH_WATER = 256 * 1024  # a relay this far behind its worker stops reading from it until it catches up
STRICT = False  # a refused state transition raises too (the tests set it), beside failing its request
log = logging.getLogger("tollgate.upstream")


class UpstreamError(Exception):
    """A transport failure talking to a worker."""


class ConnectFailed(UpstreamError):
    """No connection: refused, unreachable, or no free connection and none made within the connect timeout."""


class PoolBusy(ConnectFailed):
    """Every connection this client may open to the worker is in use: the gateway's own limit, not the worker's
    fault (it is not cooled down for it)."""


class ReadTimeout(UpstreamError, TimeoutError):
    """The worker sent nothing for longer than the read timeout."""


class Disconnected(UpstreamError):
    """The connection ended before the answer did."""


class BadResponse(UpstreamError):
    """What the worker sent is not HTTP/1.1."""


class TooLarge(BadResponse):
    """The answer's head or body is over its cap."""


class BodyTooLarge(TooLarge):
    """The answer's body is over its cap: what the request asked for may be that large, unlike a head."""


def _over_cap(status: int, cap: int) -> TooLarge:
    """A body past its cap: a 2xx answer's is what the request asked for (BodyTooLarge); any other status's is
    the worker's fault, like a head past its cap."""
    if 200 <= status < 300:
        return BodyTooLarge(f"the answer's body is over {cap} bytes")
    return TooLarge(f"a {status} answer's body is over {cap} bytes")


class DeadlineExceeded(ReadTimeout):
    """The whole answer took longer than its deadline (a worker trickling bytes is never silent for long)."""


class StateError(UpstreamError):
    """A connection was asked to take a step its state does not allow (TRANSITIONS): a bug of this client's."""


class State(enum.Enum):
    """Where a connection is in the exchange of one request and its answer (RFC 9112: a client sends a request
    and reads answers on the connection until the final one ends; nothing may come in between or after)."""

    IDLE = "idle"  # open, no request under way: a byte from the worker now is out of turn
    HEAD = "head"  # a request written; an answer's head (status line and fields) awaited or being read
    INTERIM = "interim"  # a 1xx head (not 101) was read: its message ends with it, and another head follows
    BODY = "body"  # the final answer's head was read and handed over; its body is read (length, chunks or close)
    COMPLETE = "complete"  # the final answer ended: the connection serves another request once released
    BROKEN = "broken"  # the bytes being fed broke a rule (``fault``): the request fails, and the feed's end closes
    CLOSED = "closed"  # closed by either side, or dropped: never used again

    # Members are singletons: hashed by identity, in C (Enum's own __hash__ is a Python call at each move).
    __hash__ = object.__hash__


IDLE, HEAD, INTERIM, BODY = State.IDLE, State.HEAD, State.INTERIM, State.BODY
COMPLETE, BROKEN, CLOSED = State.COMPLETE, State.BROKEN, State.CLOSED

TRANSITIONS: dict[State, frozenset[State]] = {
    IDLE: frozenset({HEAD, CLOSED}),  # send; dropped idle (out of turn, expired, pool closed) or closed by the worker
    HEAD: frozenset({INTERIM, BODY, BROKEN, CLOSED}),  # a 1xx head; the final head; a bad head; timeout, cap, lost
    INTERIM: frozenset({HEAD}),  # the 1xx message ends with its head, in the same feed
    BODY: frozenset({COMPLETE, BROKEN, CLOSED}),  # the end; a bad chunk or the body cap; closed early, timeout, lost
    COMPLETE: frozenset({IDLE, BROKEN, CLOSED}),  # released for reuse; another message began; not reused, or lost
    BROKEN: frozenset({CLOSED}),  # the request failed: the connection closes after the feed
    CLOSED: frozenset(),
}


@dataclass(frozen=True, slots=True)
class Caps:
    """What one answer may take: head and body bytes, and seconds from the request to the answer's end."""

    head_bytes: int = 65536
    body_bytes: int = 32 * 1024 * 1024
    deadline_s: float = 900.0


_HEAD_END = b"\r\n\r\n"


class Response:
    """A worker's answer: ``status`` and ``headers`` once the head is in, then the body through ``read`` or
    ``readany``. ``release`` hands the connection back for reuse (after the whole body); ``close`` drops it
    (the worker sees the client leave: vLLM aborts the request)."""

    __slots__ = ("_chunks", "_conn", "_done", "_error", "_loop", "_size", "_waiter", "headers", "keep_alive",
                 "status", "total", "until_close")

    def __init__(self, conn: _Connection, loop: asyncio.AbstractEventLoop) -> None:
        self._conn: _Connection | None = conn
        self._loop = loop  # the pool's: asyncio.get_running_loop() makes a getpid(2) call at each wait
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.keep_alive = False
        self.until_close = False  # the body ends when the connection does (no length, not chunked)
        self._chunks: list[bytes] = []
        self._size = 0  # bytes waiting to be read
        self.total = 0  # body bytes received
        self._done = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def readany(self) -> bytes:
        """What has arrived since the last read (waiting for something); b"" at the end of the body. (Called once
        per streamed event: the wait and the resume are written out here, not called.)"""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._done:
                return b""
            waiter = self._waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        chunks, self._chunks, self._size = self._chunks, [], 0
        conn = self._conn
        if conn is not None and conn.paused:  # the high-water mark paused it
            conn.resume()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def read(self) -> bytes:
        """The whole body."""
        while not self._done:
            if self._error is not None:
                raise self._error
            if self._conn is not None:
                self._conn.resume()  # the whole body is wanted: keep reading
            await self._wait()
        if self._error is not None:
            raise self._error
        chunks, self._chunks, self._size = self._chunks, [], 0
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def release(self) -> None:
        """The body was read to its end: the connection may serve the next request."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.finish(reuse=self._done and self._error is None and self.keep_alive)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.finish(reuse=False)

    async def _wait(self) -> None:
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- fed by the connection --------------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        if self._size > HIGH_WATER and self._conn is not None:
            self._conn.pause()
        waiter = self._waiter  # _wake, written out: once per streamed event
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _end(self) -> None:
        self._done = True
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if not self._done:
            self._error = error
            self._chunks, self._size = [], 0  # a failed answer delivers nothing more
            self._wake()


class _Connection(asyncio.Protocol):
    """One keep-alive connection to a worker, serving one request at a time."""

    def __init__(self, pool: OriginPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None  # the answer under way; None while the connection is idle
        self.head: asyncio.Future[Response] | None = None
        self.state: State = IDLE  # moved by _move only (TRANSITIONS)
        self.received = False  # any byte of the current answer came
        self.last_read = 0.0  # loop time of the last byte read (the silence timeout counts from it)
        self.deadline = 0.0  # loop time by which the whole answer must be in
        self.idle_since = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.paused = False  # flow control: reading stopped while the reader is HIGH_WATER behind
        self.head_bytes = 0  # bytes of the answer's heads (interim ones too) so far
        self.tail = b""  # the last bytes of the head so far, to find an end split between two reads
        self.fault: UpstreamError | None = None  # what the request fails with: the rule BROKEN stands for
        self.poller: select.poll | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream connection's (create_connection)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self.poller = select.poll()  # one of its own, registered once: a reuse's check is one poll(2)
            self.poller.register(sock.fileno(), select.POLLIN)

    def data_received(self, data: bytes) -> None:
        state = self.state
        if state is not BODY and state is not HEAD:
            self.drop()  # out of turn: no request is waiting for these bytes, and the next one must not get them
            return
        self.received = True
        self.last_read = self.pool.loop.time()
        if state is HEAD and not self._head_fits(data):
            self._fail(TooLarge(f"the answer's head is over {self.pool.caps.head_bytes} bytes"))
            self.drop()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # llhttp stops at a 101: its own exception, not a parser error
            self._break(BadResponse("the worker switched protocols, which no request asked for"))
        except httptools.HttpParserError as exc:  # after the final answer's end too: out of turn
            self._break(BadResponse(f"the worker's answer is not HTTP/1.1: {exc}"))
        state = self.state
        if state is BODY or state is COMPLETE:
            return
        if state is HEAD:  # a head still unfinished, or another one begun behind an interim answer: all of it counts
            self.head_bytes += len(data)
            self.tail = data[-3:]
        elif state is BROKEN:
            self._fail(self.fault or BadResponse("the worker's answer broke a rule"))
            self.drop()

    def _head_fits(self, data: bytes) -> bool:
        """Whether the head stays within its cap with ``data``: up to the head's end when it is in there (what
        follows is body), else all of it."""
        end = data.find(_HEAD_END)
        if end >= 0:
            end += 4
        elif self.tail:  # the head's end split between the last read and this one
            split = (self.tail + data[:3]).find(_HEAD_END)
            end = split - len(self.tail) + 4 if split >= 0 else -1
        return self.head_bytes + (len(data) if end < 0 else end) <= self.pool.caps.head_bytes

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state is CLOSED or not self._move(CLOSED):
            return  # dropped by this side (or by a refused step): nobody waits on it any more
        self.pool.lost(self)
        self._cancel_timer()
        if self.response is not None or self.head is not None:
            if self.head is None and self.response is not None and self.response.until_close:
                self.response._end()  # a body without a length or chunks ends with its connection
            reason = f"the worker closed the connection{f': {exc}' if exc else ''}"
            self._fail(Disconnected(reason))

    # -- httptools callbacks --------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.state is COMPLETE:
            self._break(BadResponse("the worker began another answer after the final one"))  # out of turn
        elif self.state is HEAD and self.response is not None:
            self.response.headers = []  # an interim answer's fields are not the final answer's

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.response is not None and self.state is HEAD:
            self.response.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        response = self.response
        if response is None or self.state is not HEAD:
            return
        self.tail = b""
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            if status == 101:
                self._break(BadResponse("the worker switched protocols, which no request asked for"))
            else:
                self._move(INTERIM)  # skipped: the final answer follows on this connection
            return
        length = response.header(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.pool.caps.body_bytes:
            self._break(_over_cap(status, self.pool.caps.body_bytes))
            return
        if not self._move(BODY):
            return
        response.status = status
        response.keep_alive = self.parser.should_keep_alive()
        names = {name for name, _ in response.headers}
        response.until_close = b"content-length" not in names and b"transfer-encoding" not in names and \
            status not in (204, 304)
        head, self.head = self.head, None
        if head is not None and not head.done():
            head.set_result(response)

    def on_body(self, body: bytes) -> None:
        response = self.response
        if response is None or self.state is not BODY:
            return
        response.total += len(body)
        if response.total > self.pool.caps.body_bytes:
            self._break(_over_cap(response.status, self.pool.caps.body_bytes))
            return
        response._feed(body)

    def on_message_complete(self) -> None:
        state = self.state
        if state is INTERIM:
            self._move(HEAD)  # the final answer's head comes next
            return
        if state is not BODY or not self._move(COMPLETE):
            return  # a broken answer does not end well: data_received fails it after the feed
        self._cancel_timer()
        if self.response is not None:
            self.response._end()

    # -- the request ----------------------------------------------------------------------------------------

    def send(self, data: bytes, read_timeout: float) -> asyncio.Future[Response]:
        assert self.transport is not None
        if self.state is CLOSED:  # handed over idle, and closed (by the worker, or for speaking out of turn) on the way
            raise Disconnected("the connection closed before the request was sent")
        if not self._move(HEAD):
            raise self.fault or StateError("the connection is not idle")
        loop = self.pool.loop
        self.response = Response(self, loop)
        self.head = loop.create_future()
        self.received = False
        self.head_bytes, self.tail, self.fault = 0, b"", None
        self.last_read = loop.time()
        self.deadline = self.last_read + self.pool.caps.deadline_s
        self.timer = loop.call_at(min(self.last_read + read_timeout, self.deadline), self._check_time, read_timeout)
        self.transport.write(data)
        return self.head

    def _check_time(self, read_timeout: float) -> None:
        now = self.pool.loop.time()
        if now >= self.deadline:
            error: UpstreamError = DeadlineExceeded(f"the answer took over {self.pool.caps.deadline_s:g}s")
        elif now - self.last_read >= read_timeout:
            error = ReadTimeout(f"the worker sent nothing for {read_timeout:g}s")
        else:
            self.timer = self.pool.loop.call_at(min(self.last_read + read_timeout, self.deadline), self._check_time,
                                                read_timeout)
            return
        self.timer = None
        self._fail(error)
        self.drop()

    def _fail(self, error: UpstreamError) -> None:
        head, self.head = self.head, None
        if head is not None and not head.done():
            head.set_exception(error)
            head.exception()  # retrieved here: the caller may be gone (cancelled) already
        if self.response is not None:
            self.response._fail(error)

    def _break(self, fault: UpstreamError) -> None:
        """A parser callback found the answer wrong: the first fault is what the request fails with, after the
        feed (data_received), and the connection closes. (Closed already, by a refused step: nothing more.)"""
        state = self.state
        if state is not BROKEN and state is not CLOSED and self._move(BROKEN):
            self.fault = fault

    def _move(self, to: State) -> bool:
        """Take the step to ``to`` if TRANSITIONS allows it from here. Else the step is refused: the request under
        way fails with a StateError, the connection closes (and leaves its pool), False is returned so the caller
        stops, and the loop goes on (under STRICT the error is raised too)."""
        here = self.state
        if to in TRANSITIONS[here]:
            self.state = to
            return True
        error = StateError(f"a connection may not go from {here.name} to {to.name}")
        log.error("http1: %s (the request fails, the connection closes)", error)
        self.state, self.fault = CLOSED, error
        self._cancel_timer()
        self._fail(error)
        if here is not CLOSED and self.transport is not None:
            self.transport.close()
            self.pool.lost(self)
        if STRICT:
            raise error
        return False

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def finish(self, reuse: bool) -> None:
        """The current request is over: keep the connection for the next one, or drop it."""
        self._cancel_timer()
        self.received = False
        self.response = None
        self.head = None
        if self.paused:
            self.resume()
        if reuse and self.state is COMPLETE:
            if self._move(IDLE):
                self.pool.put(self)
        else:
            self.drop()

    def drop(self) -> None:
        self._cancel_timer()
        if self.transport is not None and self.state is not CLOSED and self._move(CLOSED):
            self.transport.close()
            self.pool.lost(self)

    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()


class OriginPool:
    """The connections to one worker: idle ones reused most recent first, at most ``limit`` open; a request
    beyond the limit waits (within the connect timeout) for one to come back."""

    def __init__(self, url: str, limit: int, keepalive_s: float, on_connect: Callable[[], None] | None,
                 caps: Caps) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = parts.scheme == "https"
        self.authority = parts.netloc.encode("ascii")
        self.limit = limit
        self.keepalive_s = keepalive_s
        self.on_connect = on_connect
        self.caps = caps
        self.idle: collections.deque[_Connection] = collections.deque()
        self.open = 0
        self.closing = False  # the pool was retired: connections still busy close when their answers end
        self.waiters: collections.deque[asyncio.Future[_Connection | None]] = collections.deque()
        self.loop = asyncio.get_running_loop()

    @staticmethod
    def quiet(conn: _Connection) -> bool:
        """Whether an idle connection has nothing waiting to be read. Bytes the worker sent since the loop last
        polled are not yet seen by data_received; one poll(2) with no wait, at reuse, finds them (or the
        worker's close) before another request is written behind them. (Registering a shared poll object's fd
        for each check cost 2.7% of the gateway's samples at c=64; a poll object per connection, half that.)"""
        return conn.poller is None or not conn.poller.poll(0)

    async def acquire(self, connect_timeout: float) -> tuple[_Connection, bool]:
        """A connection, and whether it was used before (a reused one may have been closed by the worker
        just now; a fresh one cannot)."""
        now = self.loop.time()
        while self.idle:
            conn = self.idle.pop()
            if conn.state is IDLE and now - conn.idle_since < self.keepalive_s and self.quiet(conn):
                self._expire(now)
                return conn, True
            conn.drop()
        if self.open >= self.limit:
            waiter: asyncio.Future[_Connection | None] = self.loop.create_future()
            self.waiters.append(waiter)
            try:
                async with asyncio.timeout(connect_timeout):
                    handed = await waiter
            except BaseException as exc:
                if waiter.done() and not waiter.cancelled():  # handed over as the wait ended: pass it on
                    handed = waiter.result()
                    if handed is not None:
                        self.put(handed)
                    else:
                        self._hand(None)
                else:
                    waiter.cancel()
                    with contextlib.suppress(ValueError):  # _hand may have popped it, cancelled, just now
                        self.waiters.remove(waiter)
                if isinstance(exc, TimeoutError):
                    raise PoolBusy(f"no free connection within {connect_timeout:g}s ({self.limit} in use)") \
                        from None
                raise
            if handed is not None:
                if not self.quiet(handed):
                    handed.drop()  # send() finds it closed, and the request is tried once more
                return handed, True
        return await self._connect(connect_timeout), False

    async def _connect(self, connect_timeout: float) -> _Connection:
        self.open += 1
        conn = _Connection(self)
        try:
            async with asyncio.timeout(connect_timeout):
                await self.loop.create_connection(lambda: conn, self.host, self.port, ssl=self.ssl or None)
        except BaseException as exc:
            if conn.transport is not None:
                conn.drop()  # made as the wait ended: counted out once, by lost()
            else:
                self.open -= 1
            if isinstance(exc, TimeoutError):
                raise ConnectFailed(f"no connection within {connect_timeout:g}s") from None
            if isinstance(exc, OSError):
                raise ConnectFailed(exc.strerror or str(exc)) from None
            raise
        if self.on_connect is not None:
            self.on_connect()
        return conn

    def put(self, conn: _Connection) -> None:
        """A connection free for the next request: the longest waiter's, else idle."""
        if self.closing:
            conn.drop()
        elif not self._hand(conn):
            conn.idle_since = self.loop.time()
            self.idle.append(conn)

    def lost(self, conn: _Connection) -> None:
        """A connection closed (once, by either side): its place is free for a waiter to open a new one."""
        self.open -= 1
        try:
            self.idle.remove(conn)
        except ValueError:
            pass
        self._hand(None)

    def _hand(self, conn: _Connection | None) -> bool:
        """Give the longest waiter a connection (or, with None, leave to open one)."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return True
        return False

    def _expire(self, now: float) -> None:
        """Close the longest-idle connection if it outlived the keep-alive time (the deque's other end)."""
        if self.idle and now - self.idle[0].idle_since >= self.keepalive_s:
            self.idle.popleft().drop()

    def close(self) -> None:
        self.closing = True
        while self.idle:
            self.idle.pop().drop()


class Client:
    """Requests to a pool's workers, each over that worker's ``OriginPool``."""

    def __init__(self, limit: int, keepalive_s: float, connect_timeout: float, read_timeout: float,
                 on_connect: Callable[[], None] | None = None, caps: Caps = Caps()) -> None:
        self.limit, self.keepalive_s, self.caps = limit, keepalive_s, caps
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.on_connect = on_connect
        self.origins: dict[str, OriginPool] = {}

    def _origin(self, url: str) -> OriginPool:
        origin = self.origins.get(url)
        if origin is None:
            origin = self.origins[url] = OriginPool(url, self.limit, self.keepalive_s, self.on_connect, self.caps)
        return origin

    async def request(self, method: bytes, url: str, path: str, body: bytes = b"",
                      headers: list[tuple[bytes, bytes]] | None = None, sent: list[float] | None = None) -> Response:
        """Send a request to the worker at ``url`` and return its answer once the head is in (``sent`` gets
        the perf_counter time the request was written). A reused connection that the worker closed before
        answering is retried once on a new one (nothing reached it)."""
        origin = self._origin(url)
        head = [method, b" ", path.encode("ascii"), b" HTTP/1.1\r\nhost: ", origin.authority,
                b"\r\ncontent-length: ", str(len(body)).encode("ascii"), b"\r\n"]
        for name, value in headers or ():
            head += (name, b": ", value, b"\r\n")
        head.append(b"\r\n")
        head.append(body)
        data = b"".join(head)
        for attempt in range(2):
            conn, reused = await origin.acquire(self.connect_timeout)
            try:
                answer = conn.send(data, self.read_timeout)
                if sent is not None:
                    sent.append(time.perf_counter())
                return await answer
            except Disconnected:
                if reused and not conn.received and attempt == 0:
                    continue
                raise
            except BaseException:
                conn.finish(reuse=False)
                raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        for origin in self.origins.values():
            origin.close()
