"""Cost reports for finance: /admin/reports/costs, /admin/ledger (every record, streamed) and /v1/usage.

The report routes take the finance token (server.finance_token_sha256: reads reports and nothing else) or the
admin token; a tenant's key gets 403 there, and reads its own totals at /v1/usage. Queries run on threads
(the store's calls block). ``from`` and ``to`` take ISO dates or times (UTC when no offset is given); a date
as ``to`` includes that whole day. CSV has ISO times and plain numbers, so it loads in pandas as typed.
"""

from __future__ import annotations

import asyncio
import csv
import io
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from gateway.errors import Conflict, InvalidRequest, Unavailable
from gateway.http.guards import gateway_of, require_reader, tenant_of
from gateway.http.responses import NOSNIFF, json_response
from gateway.ledger.stores import COLUMNS, GROUPS, OPEN_END, OPEN_START, LedgerStore, iter_all
from gateway.ledger.times import sortable

log = logging.getLogger("tollgate.reports")
TOTALS = ("requests", "prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd", "cache_hits",
          "cache_saved_tokens", "errors")


def ledger_store(request: Request) -> LedgerStore:
    gw = gateway_of(request)
    if gw.ledger is None:
        raise Conflict("The ledger is not enabled: start the gateway with a data directory.", "ledger_disabled")
    return gw.ledger.store


async def costs(request: Request) -> Response:
    await require_reader(request)
    start, end = time_range(request)
    group_by = parse_groups(request.query_params.get("group_by", "tenant"))
    fmt = parse_format(request)
    rows = [with_rates(row) for row in await query(ledger_store(request).totals, start, end, group_by,
                                                   request.query_params.get("tenant"))]
    if fmt == "csv":
        keys = ["key_id" if g == "key" else g for g in group_by]
        return csv_response([*keys, *TOTALS, "cost_per_1k_requests_usd", "tokens_per_request"], rows, "costs.csv")
    return json_response({"object": "cost_report", **shown_range(start, end), "group_by": group_by,
                          "data": rows, "total": with_rates(sum_rows(rows))})


async def ledger(request: Request) -> Response:
    await require_reader(request)
    start, end = time_range(request)
    fmt = parse_format(request)
    pages = _pages(ledger_store(request), start, end, request.query_params.get("tenant"))
    if fmt == "csv":
        return StreamingResponse(_csv_stream(list(COLUMNS), pages), media_type="text/csv; charset=utf-8",
                                 headers={"content-disposition": 'attachment; filename="ledger.csv"', **NOSNIFF})
    return StreamingResponse(_json_stream(pages), media_type="application/json", headers=NOSNIFF)


async def usage(request: Request) -> Response:
    """A tenant's own totals, by model and day, with its key."""
    tenant = tenant_of(request)
    start, end = time_range(request)
    rows = await query(ledger_store(request).totals, start, end, ["day", "model"], tenant.name)
    return json_response({"object": "usage", "tenant": tenant.name, **shown_range(start, end),
                          "total": with_rates(sum_rows(rows)), "data": [with_rates(r) for r in rows]})


ROUTES = [
    Route("/admin/reports/costs", costs, methods=["GET"]),
    Route("/admin/ledger", ledger, methods=["GET"]),
    Route("/v1/usage", usage, methods=["GET"]),
]


async def query(fn: Callable[..., list[dict[str, Any]]], *args: Any) -> list[dict[str, Any]]:
    """A store query on a thread; a store that fails is the gateway's 503, not a 500."""
    try:
        return await asyncio.to_thread(fn, *args)
    except Exception as exc:
        log.warning("ledger query failed: %s", exc)
        raise Unavailable("The ledger store is unreachable; retry shortly.", "ledger_unavailable") from None


def parse_time(text: str, end: bool) -> str:
    """An ISO date or time as a ledger bound. A bound at the calendar's edge (``to=9999-12-31``, a ``from`` in
    year 1 with an offset east of UTC) is an open end, not an overflow."""
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            moment = datetime(day.year, day.month, day.day, tzinfo=UTC)
            if end:
                moment += timedelta(days=1)
        else:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
            moment = moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)
    except OverflowError:
        return OPEN_END if end else OPEN_START
    except ValueError:
        raise InvalidRequest(f"'{text[:40]}' is not an ISO date or time.", "invalid_time",
                             param="to" if end else "from") from None
    return sortable(moment)


def shown_range(start: str, end: str) -> dict[str, str | None]:
    """The range as a report states it: null for an open end."""
    return {"from": None if start == OPEN_START else start, "to": None if end == OPEN_END else end}


def time_range(request: Request) -> tuple[str, str]:
    q = request.query_params
    start = parse_time(q["from"], False) if q.get("from") else OPEN_START
    end = parse_time(q["to"], True) if q.get("to") else OPEN_END
    return start, end


def parse_groups(text: str) -> list[str]:
    groups = [g.strip() for g in text.split(",") if g.strip()]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown or len(set(groups)) != len(groups):
        raise InvalidRequest(f"group_by takes distinct names from: {', '.join(GROUPS)}.", "invalid_group_by",
                             param="group_by")
    return groups


def parse_format(request: Request) -> str:
    fmt = request.query_params.get("format", "json")
    if fmt not in ("json", "csv"):
        raise InvalidRequest("format must be json or csv.", "invalid_format", param="format")
    return fmt


def sum_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {k: sum(r[k] or 0 for r in rows) for k in TOTALS}


def with_rates(row: dict[str, Any]) -> dict[str, Any]:
    requests = row["requests"] or 0
    row["cost_usd"] = round(row["cost_usd"] or 0.0, 9)
    row["cost_per_1k_requests_usd"] = round(row["cost_usd"] * 1000 / requests, 9) if requests else 0.0
    row["tokens_per_request"] = round(((row["prompt_tokens"] or 0) + (row["completion_tokens"] or 0)) / requests,
                                      2) if requests else 0.0
    return row


def csv_response(columns: list[str], rows: list[dict[str, Any]], filename: str) -> Response:
    out = io.StringIO()
    writer = csv.DictWriter(out, columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return Response(out.getvalue(), media_type="text/csv; charset=utf-8",
                    headers={"content-disposition": f'attachment; filename="{filename}"', **NOSNIFF})


async def _pages(store: LedgerStore, start: str, end: str, tenant: str | None) -> AsyncIterator[list[dict[str, Any]]]:
    pages = iter_all(store, start, end, tenant)
    while (page := await asyncio.to_thread(next, pages, None)) is not None:
        yield page


async def _csv_stream(columns: list[str], pages: AsyncIterator[list[dict[str, Any]]]) -> AsyncIterator[bytes]:
    out = io.StringIO()
    writer = csv.DictWriter(out, columns, lineterminator="\n")
    writer.writeheader()
    yield out.getvalue().encode()
    async for page in pages:
        out.seek(0)
        out.truncate()
        writer.writerows({k: ("true" if v is True else "false" if v is False else v) for k, v in row.items()}
                         for row in page)
        yield out.getvalue().encode()


async def _json_stream(pages: AsyncIterator[list[dict[str, Any]]]) -> AsyncIterator[bytes]:
    yield b'{"object":"list","data":['
    first = True
    async for page in pages:
        body = b",".join(orjson.dumps(row) for row in page)
        yield body if first else b"," + body
        first = False
    yield b"]}"
