"""Outcomes as Starlette responses, for the routes that answer through Starlette (admin, reports, files,
batches). What an outcome says (status, headers, OpenAI's error JSON) is ``gateway.outcomes``'s, shared with the
completions edge's sink and the batch runner's output.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from gateway import errors
from gateway.outcomes import render


def response(exc: errors.GatewayError, status: int | None = None) -> Response:
    """A Starlette response for an outcome (``status`` overrides its usual one: Starlette's own 405)."""
    usual, headers, body = render(exc)
    return Response(body, status or usual, {k.decode(): v.decode() for k, v in headers},
                    media_type="application/json")


async def handle(request: Request, exc: Exception) -> Response:
    """Starlette's exception handler for every ``GatewayError`` a route raises."""
    assert isinstance(exc, errors.GatewayError)
    return response(exc)
