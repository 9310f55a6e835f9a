"""JSON and OpenAI-error responses for the Starlette routes (the completions path writes its own)."""

from __future__ import annotations

import orjson
from starlette.responses import Response

from gateway.openai_api import ApiError, error_body


def json_response(data: object, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def error_response(status: int, message: str, code: str, type_: str = "invalid_request_error") -> Response:
    return Response(error_body(message, type_, code), status_code=status, media_type="application/json")


def api_error_response(exc: ApiError) -> Response:
    """An ApiError as OpenAI's error JSON, with its status, param and headers (e.g. Retry-After)."""
    return Response(exc.body(), exc.status, {k.decode(): v.decode() for k, v in exc.headers},
                    media_type="application/json")
