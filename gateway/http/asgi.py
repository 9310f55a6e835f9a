"""The ASGI edge: reading the request, watching for a client that leaves, and the one response starter.

Everything below the edge writes to a Sink (gateway.sink); ``AsgiSink`` is the only code that sends ASGI
response messages, and it knows whether the response has started (as starlette/middleware/errors.py
does), so nothing sends a second head, or a 500 after a stream began.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from gateway import outcomes
from gateway.context import Headers
from gateway.errors import ClientGone, GatewayError, InvalidRequest, TooLarge

__all__ = ["DEPARTURE", "AsgiSink", "Departure", "Message", "Receive", "Scope", "Send", "departure", "read_body",
           "request_headers", "until_disconnect"]

_SINGLE = (b"authorization", b"content-length", b"content-type", b"x-request-id")


def request_headers(scope: Scope) -> dict[bytes, bytes]:
    """The request's headers by (lower-case) name. Headers whose meaning a duplicate would make ambiguous
    (two `Authorization` headers: which key is the caller's?) are refused."""
    raw = scope["headers"]
    headers = dict(raw)
    if len(headers) != len(raw):
        names = [name for name, _ in raw]
        for name in _SINGLE:
            if names.count(name) > 1:
                raise InvalidRequest(f"The '{name.decode()}' header was sent more than once.", "duplicate_header")
    return headers


async def read_body(receive: Receive, headers: dict[bytes, bytes], limit: int) -> bytes:
    declared = headers.get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"The request body is larger than {limit} bytes.", "request_too_large")
    parts = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone("The client disconnected.", "client_disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"The request body is larger than {limit} bytes.", "request_too_large")
        parts.append(chunk)
        if not message.get("more_body"):
            return parts[0] if len(parts) == 1 else b"".join(parts)


class AsgiSink:
    """A Sink over ASGI ``send``; the status it started with is the status the client got."""

    __slots__ = ("_open", "_send", "status")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.status: int | None = None
        self._open = False  # started, and the body not ended yet

    async def start(self, status: int, headers: Headers) -> None:
        if self.status is not None:
            raise RuntimeError("the response has already started")
        self.status = status
        self._open = True
        try:
            await self._send({"type": "http.response.start", "status": status, "headers": headers})
        except OSError:
            pass  # the client is gone; the disconnect watch ends the request

    async def send(self, body: bytes, more: bool = False) -> None:
        self._open = more
        try:
            await self._send({"type": "http.response.body", "body": body, "more_body": more})
        except OSError:
            pass

    @property
    def open(self) -> bool:
        return self._open

    async def fail(self, error: GatewayError, headers: Headers) -> None:
        await outcomes.fail(self, error, headers)


DEPARTURE = "tollgate.departure"  # the scope extension under which the server reports a client that left


class Departure:
    """A request's client leaving, as the server that holds its connection sees it (``GuardedHttpToolsProtocol``
    puts one in each request's ``scope["extensions"]``): ``leave`` is called once the connection is lost before
    the response ended, and cancels the task running the request's work, if any."""

    __slots__ = ("left", "task")

    def __init__(self) -> None:
        self.left = False
        self.task: asyncio.Task[Any] | None = None

    def leave(self) -> None:
        self.left = True
        if self.task is not None:
            self.task.cancel()


def departure(scope: Scope) -> Departure | None:
    extensions = scope.get("extensions")
    return extensions.get(DEPARTURE) if extensions else None


async def until_disconnect(work: Coroutine[Any, Any, None], gone: Departure | None) -> bool:
    """Run ``work`` in this task; cancel it if the client leaves first. Returns True if the client left.

    The work stays in the request's task, so everything it holds (a queue slot, a worker lease, the upstream
    connection) is released by its own ``finally`` blocks when the client leaves; the server cancels the task
    from its ``connection_lost``, so a request needs no watcher task of its own. Under a server that reports
    no departures (``gone`` None: an app called directly), the work runs to its end.
    """
    if gone is None:
        await work
        return False
    if gone.left:  # while the body was read, or queued behind a pipelined request
        work.close()
        return True
    current = asyncio.current_task()
    gone.task = current
    try:
        await work
    except asyncio.CancelledError:
        if not gone.left or current is None:
            raise
        current.uncancel()
    finally:
        gone.task = None
    return gone.left
