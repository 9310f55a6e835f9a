"""The one place a gateway outcome becomes HTTP: its status, its headers (Retry-After) and OpenAI's error JSON.

The core raises ``gateway.errors`` kinds; the completions edge renders them through its sink, every other
route through the Starlette exception handler below, and the batch runner writes them into its output file.
The status is looked up by class along the MRO (as ``starlette._exception_handler`` finds a handler), so a
new kind answers like its parent until it is given a row of its own.
"""

from __future__ import annotations

import math

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway import errors
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
        found = _STATUS.get(kind)  # type: ignore[arg-type]
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
    """Retry-After (whole seconds, at least 1) on everything that may pass later."""
    if isinstance(exc, errors.TryLater):
        return [(b"retry-after", str(max(1, math.ceil(exc.retry_after_s))).encode())]
    return []


def render(exc: errors.GatewayError) -> tuple[int, Headers, bytes]:
    return status_of(exc)[0], headers_of(exc), body_of(exc)


def response(exc: errors.GatewayError, status: int | None = None) -> Response:
    """A Starlette response for an outcome (``status`` overrides its usual one: Starlette's own 405)."""
    usual, headers, body = render(exc)
    return Response(body, status or usual, {k.decode(): v.decode() for k, v in headers},
                    media_type="application/json")


async def handle(request: Request, exc: Exception) -> Response:
    """Starlette's exception handler for every ``GatewayError`` a route raises."""
    assert isinstance(exc, errors.GatewayError)
    return response(exc)
