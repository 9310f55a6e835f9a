"""How an outcome reads to an OpenAI client: its status, its headers (Retry-After), OpenAI's error JSON, and the
one rule for failing a request whose answer may have started.

The core raises ``gateway.errors`` kinds and knows no web framework; this module turns them into plain values
(status, header pairs, bytes) that any sink can write: the HTTP edge's ASGI sink, a batch line's buffer, a test's.
The status is looked up by class along the MRO (as ``starlette._exception_handler`` finds a handler), so a new
kind answers like its parent until it is given a row of its own.
"""

from __future__ import annotations

import math
from typing import Protocol

import orjson

from gateway import errors, sse
from gateway.context import Headers

# kind -> (status, OpenAI's error "type")
_STATUS: dict[type[errors.GatewayError], tuple[int, str]] = {
    errors.GatewayError: (500, "server_error"),
    errors.InvalidRequest: (400, "invalid_request_error"),
    errors.TooLarge: (413, "invalid_request_error"),
    errors.NotAuthenticated: (401, "invalid_request_error"),
    errors.NotPermitted: (403, "invalid_request_error"),
    errors.NotFound: (404, "invalid_request_error"),
    errors.Conflict: (409, "invalid_request_error"),
    errors.ClientGone: (499, "invalid_request_error"),
    errors.TryLater: (429, "rate_limit_error"),
    errors.Unavailable: (503, "server_error"),
    errors.OverBudget: (429, "insufficient_quota"),
    errors.QuotaExceeded: (429, "insufficient_quota"),
    errors.UpstreamFailed: (502, "server_error"),
}


def status_of(exc: errors.GatewayError) -> tuple[int, str]:
    """The HTTP status and OpenAI error type for an outcome (a worker's own 4xx keeps its status)."""
    if isinstance(exc, errors.WorkerRejected):
        return exc.worker_status, "invalid_request_error"
    for kind in type(exc).__mro__:
        found = _STATUS.get(kind)
        if found is not None:
            return found
    return _STATUS[errors.GatewayError]


def body_of(exc: errors.GatewayError) -> bytes:
    """OpenAI's error JSON: message, type, param, code (and the itemised ``details`` where there are some)."""
    error: dict[str, object] = {"message": exc.message, "type": status_of(exc)[1], "param": exc.param,
                                "code": exc.code}
    if exc.details is not None:
        error["details"] = exc.details
    return orjson.dumps({"error": error})


def headers_of(exc: errors.GatewayError) -> Headers:
    """Retry-After (whole seconds, at least 1) on everything that may pass later; a rate limit's x-ratelimit-*."""
    if isinstance(exc, errors.TryLater):
        retry = [(b"retry-after", str(max(1, math.ceil(exc.retry_after_s))).encode())]
        return [*retry, *exc.headers] if isinstance(exc, errors.RateLimited) else retry
    return []


def render(exc: errors.GatewayError) -> tuple[int, Headers, bytes]:
    return status_of(exc)[0], headers_of(exc), body_of(exc)


class Answer(Protocol):
    """What the fail rule needs of a sink: whether its answer started, whether it is still open, and writing."""

    status: int | None

    @property
    def open(self) -> bool: ...

    async def start(self, status: int, headers: Headers) -> None: ...

    async def send(self, body: bytes, more: bool = False) -> None: ...


async def fail(sink: Answer, exc: errors.GatewayError, headers: Headers) -> None:
    """End a request with ``exc``: as the whole answer if none started; in a stream whose status has gone out, as
    an SSE error event and [DONE] (the client reads the failure in the stream); after a finished answer, not at
    all."""
    if sink.status is None:
        status, extra, body = render(exc)
        await sink.start(status, [*headers, *extra, (b"content-type", b"application/json"),
                                  (b"content-length", str(len(body)).encode())])
        await sink.send(body)
    elif sink.open:
        await sink.send(sse.event(body_of(exc)) + sse.DONE_EVENT)
