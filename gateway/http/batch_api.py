"""The OpenAI Files and Batches endpoints (/v1/files, /v1/batches) for a tenant's own key.

Files and batches belong to the tenant that made them; another tenant's ids answer 404, as unknown ones do.
Only ``purpose=batch`` uploads are taken. The body of an upload is counted as it arrives and refused with 413
past ``batches.max_file_bytes``; the file is copied into the data directory on a thread.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from gateway.auth import identify
from gateway.batches.lines import ENDPOINTS
from gateway.batches.runner import BatchRunner
from gateway.batches.store import BatchRecord, BatchStore, FileRecord, new_id
from gateway.errors import Conflict, InvalidRequest, NotFound, QuotaExceeded, TooLarge
from gateway.http.asgi import Message, read_body, request_headers
from gateway.http.guards import authorization, tenant_of
from gateway.http.responses import NOSNIFF, json_response
from gateway.openai_api import parse_json
from gateway.policy.loader import TenantView
from gateway.policy.schema import BatchPolicy

log = logging.getLogger("tollgate.batches")

MULTIPART_OVERHEAD = 64 * 1024  # form boundaries and the other fields, beyond the file itself


def runner_of(request: Request) -> BatchRunner:
    runner: BatchRunner = request.app.state.batches  # starlette's app.state holds anything (Any)
    return runner


def store_of(request: Request) -> BatchStore:
    return runner_of(request).store


async def upload(request: Request) -> Response:
    tenant, runner = tenant_of(request), runner_of(request)
    store = runner.store
    batches = runner.gw.store.current.policy.batches
    limit = batches.max_file_bytes
    too_large = TooLarge(f"The file is larger than the limit of {limit} bytes.", "file_too_large")
    text = request.headers.get("content-length", "")
    declared = int(text) if text.isascii() and text.isdigit() else None  # "²" is a digit to str.isdigit
    if declared is not None and declared > limit + MULTIPART_OVERHEAD:
        raise too_large
    kept, kept_bytes = await store.do(store.tenant_usage, tenant.name)
    _check_quota(batches, kept, kept_bytes + (declared - MULTIPART_OVERHEAD if declared is not None else 0))
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise InvalidRequest("Upload a file as multipart/form-data with the fields 'file' and 'purpose'.",
                             "invalid_content_type")
    received = 0

    async def counted() -> Message:
        nonlocal received
        message = await request.receive()
        received += len(message.get("body", b""))
        if received > limit + MULTIPART_OVERHEAD:
            raise too_large
        return message

    try:
        form = await Request(request.scope, counted).form(max_files=1, max_fields=8)
    except HTTPException as exc:
        raise InvalidRequest(f"The upload is not a valid multipart form: {exc.detail}", "invalid_multipart") from None
    try:
        purpose, file = form.get("purpose"), form.get("file")
        if purpose != "batch":
            raise InvalidRequest("Only purpose 'batch' is supported here.", "invalid_purpose", param="purpose")
        if not isinstance(file, UploadFile):
            raise InvalidRequest("The form has no 'file' part.", "missing_file", param="file")
        if file.size is not None and file.size > limit:
            raise too_large
        if not file.size:
            raise InvalidRequest("The file is empty.", "empty_file", param="file")
        _check_quota(batches, kept, kept_bytes + file.size)
        staged = store.files_dir / (new_id("upload-") + ".part")
        await asyncio.to_thread(_copy, file, staged)
        record = await store.do(store.add_file, tenant.name, purpose, (file.filename or "upload.jsonl")[:256],
                                staged)
    finally:
        await form.close()
    return json_response(record.to_openai())


async def list_files(request: Request) -> Response:
    tenant, store = tenant_of(request), store_of(request)
    q = request.query_params
    limit = _limit(q.get("limit"), 10_000)
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("order must be 'asc' or 'desc'.", "invalid_order", param="order")
    found = await store.do(store.list_files, tenant.name, q.get("purpose"), limit + 1, q.get("after"),
                           order == "desc")
    return _page([f.to_openai() for f in found], limit)


async def get_file(request: Request) -> Response:
    return json_response((await _file(request, tenant_of(request))).to_openai())


async def file_content(request: Request) -> Response:
    tenant, store = tenant_of(request), store_of(request)
    record = await _file(request, tenant)
    first = await store.do(store.read_chunk, record.id, 0)

    async def rest() -> AsyncIterator[bytes]:
        index, chunk = 0, first
        while chunk is not None:
            yield chunk
            index += 1
            chunk = await store.do(store.read_chunk, record.id, index)
    return StreamingResponse(rest(), media_type="application/octet-stream", headers={
        "content-length": str(record.bytes),
        "content-disposition": f'attachment; filename="{_header_safe(record.filename)}"', **NOSNIFF})


async def delete_file(request: Request) -> Response:
    tenant, store = tenant_of(request), store_of(request)
    file_id = request.path_params["file_id"]
    if not await store.do(store.delete_file, tenant.name, file_id):
        raise _no_such("file", file_id)
    return json_response({"id": file_id, "object": "file", "deleted": True})


async def _file(request: Request, tenant: TenantView) -> FileRecord:
    store = store_of(request)
    file_id = request.path_params["file_id"]
    record = await store.do(store.get_file, tenant.name, file_id)
    if record is None:
        raise _no_such("file", file_id)
    return record


async def create_batch(request: Request) -> Response:
    """A batch of the caller's tenant, which keeps the id of the caller's key: its lines are that key's
    requests in the ledger."""
    runner = runner_of(request)
    tenant, key_id = identify(authorization(request), runner.gw.store.current)
    store = runner.store
    headers = request_headers(request.scope)
    body = await parse_json(await read_body(request.receive, headers,
                                            runner.gw.store.current.policy.server.max_body_bytes))
    file_id, endpoint = body.get("input_file_id"), body.get("endpoint")
    window, metadata = body.get("completion_window"), body.get("metadata")
    if not isinstance(file_id, str):
        raise InvalidRequest("input_file_id is required.", "missing_required_parameter", param="input_file_id")
    if endpoint not in ENDPOINTS:
        raise InvalidRequest(f"endpoint must be one of {', '.join(ENDPOINTS)}.", "invalid_endpoint", param="endpoint")
    if window != "24h":
        raise InvalidRequest("completion_window must be '24h'.", "invalid_completion_window", param="completion_window")
    _check_metadata(metadata)
    source = await store.do(store.get_file, tenant.name, file_id)
    if source is None:
        raise InvalidRequest(f"No file with id '{file_id[:64]}'.", "file_not_found", param="input_file_id")
    if source.purpose != "batch":
        raise InvalidRequest("The input file must have purpose 'batch'.", "invalid_input_file", param="input_file_id")
    record = await store.do(store.create_batch, tenant.name, endpoint, file_id, window, metadata, key_id)
    runner.drive(record.id)
    return json_response(record.to_openai())


async def list_batches(request: Request) -> Response:
    tenant, store = tenant_of(request), store_of(request)
    limit = _limit(request.query_params.get("limit"), 100)
    found = await store.do(store.list_batches, tenant.name, limit + 1, request.query_params.get("after"))
    return _page([b.to_openai() for b in found], limit)


async def _batch(request: Request, tenant: TenantView) -> BatchRecord:
    store = store_of(request)
    batch_id = request.path_params["batch_id"]
    record = await store.do(store.get_batch, batch_id, tenant.name)
    if record is None:
        raise _no_such("batch", batch_id)
    return record


async def get_batch(request: Request) -> Response:
    return json_response((await _batch(request, tenant_of(request))).to_openai())


async def cancel_batch(request: Request) -> Response:
    tenant, runner = tenant_of(request), runner_of(request)
    store = runner.store
    record = await _batch(request, tenant)
    batch_id = record.id
    moved = await store.do(store.set_status, batch_id, "cancelling", ("validating", "in_progress"))
    if not moved and record.status not in ("cancelling", "cancelled"):
        raise Conflict(f"A batch with status '{record.status}' cannot be cancelled.", "batch_not_cancellable")
    runner.cancel(batch_id)
    runner.drive(batch_id)
    latest = await store.do(store.get_batch, batch_id, tenant.name)
    assert latest is not None
    return json_response(latest.to_openai())


ROUTES = [
    Route("/v1/files", upload, methods=["POST"]),
    Route("/v1/files", list_files, methods=["GET"]),
    Route("/v1/files/{file_id}", get_file, methods=["GET"]),
    Route("/v1/files/{file_id}", delete_file, methods=["DELETE"]),
    Route("/v1/files/{file_id}/content", file_content, methods=["GET"]),
    Route("/v1/batches", create_batch, methods=["POST"]),
    Route("/v1/batches", list_batches, methods=["GET"]),
    Route("/v1/batches/{batch_id}", get_batch, methods=["GET"]),
    Route("/v1/batches/{batch_id}/cancel", cancel_batch, methods=["POST"]),
]


def _check_quota(batches: BatchPolicy, files: int, bytes_: int) -> None:
    """A tenant's files are bounded in number and bytes (uploads and results alike), so one tenant cannot fill
    the store; a few uploads at once may pass together, by at most their own size."""
    if files >= batches.tenant_files:
        raise QuotaExceeded(f"This tenant keeps {files} files, its most; delete some first.")
    if bytes_ > batches.tenant_bytes:
        raise QuotaExceeded(f"This upload would take this tenant's files past {batches.tenant_bytes} bytes; "
                            "delete some first.")


def _header_safe(name: str) -> str:
    """A filename fit for a quoted header value (a client chose it)."""
    return "".join(c if c.isprintable() and c not in '"\\' and ord(c) < 128 else "_" for c in name)


def _copy(upload: UploadFile, target: Path) -> None:
    upload.file.seek(0)
    with target.open("wb") as out:
        shutil.copyfileobj(upload.file, out, 1024 * 1024)


def _limit(text: str | None, most: int) -> int:
    if text is None:
        return min(20, most)
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= most:
        raise InvalidRequest(f"limit must be a whole number from 1 to {most}.", "invalid_limit", param="limit")
    return int(text)


def _page(data: list[dict[str, object]], limit: int) -> Response:
    shown = data[:limit]
    return json_response({"object": "list", "data": shown, "first_id": shown[0]["id"] if shown else None,
                          "last_id": shown[-1]["id"] if shown else None, "has_more": len(data) > limit})


def _no_such(kind: str, ident: str) -> NotFound:
    return NotFound(f"No {kind} with id '{ident[:64]}'.", f"{kind}_not_found")


def _check_metadata(metadata: object) -> None:
    if metadata is None:
        return
    if (not isinstance(metadata, dict) or len(metadata) > 16
            or not all(isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
                       for k, v in metadata.items())):
        raise InvalidRequest("metadata is at most 16 string pairs (keys up to 64 characters, values up to 512).",
                             "invalid_metadata", param="metadata")
