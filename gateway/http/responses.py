"""The routes' responses: JSON, and a finance build's spooled body (errors are raised as outcomes and rendered
by gateway.http.errors)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
from starlette.responses import Response, StreamingResponse

from gateway.finance.heavy import SPOOL_MEMORY, Spool

NOSNIFF = {"x-content-type-options": "nosniff"}  # downloads: a browser must not guess HTML out of a CSV or file
CHUNK = 256 * 1024  # bytes per read of a spooled body


def json_response(data: object, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def spooled(body: Spool, media_type: str, headers: dict[str, str] | None = None, status: int = 200) -> Response:
    """A build's body as the answer: whole when it stayed in memory, else streamed from its file, read on a thread
    (then closed)."""
    if body.size <= SPOOL_MEMORY:
        body.file.seek(0)
        data = body.file.read()
        body.file.close()
        return Response(data, status, headers, media_type=media_type)
    return StreamingResponse(_chunks(body), status, headers, media_type=media_type)


async def _chunks(body: Spool) -> AsyncIterator[bytes]:
    try:
        await asyncio.to_thread(body.file.seek, 0)
        while chunk := await asyncio.to_thread(body.file.read, CHUNK):
            yield chunk
    finally:
        body.file.close()
