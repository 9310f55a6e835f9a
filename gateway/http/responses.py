"""JSON responses for the Starlette routes (errors are raised as outcomes and rendered by gateway.http.errors)."""

from __future__ import annotations

import orjson
from starlette.responses import Response

NOSNIFF = {"x-content-type-options": "nosniff"}  # downloads: a browser must not guess HTML out of a CSV or file


def json_response(data: object, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")
