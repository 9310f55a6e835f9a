"""Cost reports for finance: /admin/reports/costs, /admin/ledger (every record, streamed) and /v1/usage.

The report routes take the finance token (server.finance_token_sha256: reads reports and nothing else) or the
admin token; a tenant's key gets 403 there, and reads its own totals at /v1/usage. Queries run on threads
(the store's calls block).

Parameters, each refused with a 400 naming it when it is wrong (never silently replaced):
``from`` and ``to`` take ISO dates or times (UTC when no offset is given; a date as ``to`` includes that whole
day; ``from`` must come before ``to``), or ``month=YYYY-MM`` takes a calendar month instead of both.
``tenant`` filters to one tenant: one the live policy names, or one the ledger holds records of (a tenant that
left the policy is still reportable; a name known to neither is a typo, not an empty report). ``tag`` filters to
records whose tags hold that exact ``key=value`` pair. Grouped by ``tenant`` alone, the costs report lists every
tenant of the policy, with zeros for those without records.

CSV has ISO times and plain numbers (money as plain decimals, never exponent notation; an absent value is an
empty cell), so it loads in pandas as typed; each download is named for its period, filters and grouping.
"""

from __future__ import annotations

import asyncio
import csv
import io
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from gateway.errors import Conflict, InvalidRequest, Unavailable
from gateway.http.guards import gateway_of, require_reader, tenant_of
from gateway.http.responses import NOSNIFF, json_response
from gateway.ledger.prices import plain
from gateway.ledger.stores import COLUMNS, GROUPS, OPEN_END, OPEN_START, LedgerStore
from gateway.ledger.times import sortable

log = logging.getLogger("tollgate.reports")
TOTALS = ("requests", "prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd", "cache_hits",
          "cache_saved_tokens", "errors")
MONTH = re.compile(r"([0-9]{4})-([0-9]{2})")
FIRST_YEAR, LAST_YEAR = 1970, 9998  # a month's end and the month before it stay inside the calendar
UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
PAGE = 2000  # ledger records per store query while streaming


def ledger_store(request: Request) -> LedgerStore:
    gw = gateway_of(request)
    if gw.ledger is None:
        raise Conflict("The ledger is not enabled: start the gateway with a data directory.", "ledger_disabled")
    return gw.ledger.store


async def costs(request: Request) -> Response:
    await require_reader(request)
    store = ledger_store(request)
    start, end = time_range(request)
    group_by = parse_groups(request.query_params.get("group_by", "tenant"))
    fmt = parse_format(request)
    tag = parse_tag(request)
    tenant = await parse_tenant(request, store)
    rows = await query(store.totals, start, end, group_by, tenant, tag=tag)
    if group_by == ["tenant"]:
        rows = every_tenant(rows, [tenant] if tenant else gateway_of(request).store.current.tenants)
    rows = [with_rates(row) for row in rows]
    if fmt == "csv":
        keys = ["key_id" if g == "key" else g for g in group_by]
        name = download_name("costs", start, end, month=request.query_params.get("month"), tenant=tenant, tag=tag,
                             group_by=group_by)
        return csv_response([*keys, *TOTALS, "cost_per_1k_requests_usd", "tokens_per_request"], rows, name)
    return json_response({"object": "cost_report", **shown_range(start, end), "group_by": group_by,
                          "data": rows, "total": with_rates(sum_rows(rows))})


async def ledger(request: Request) -> Response:
    await require_reader(request)
    store = ledger_store(request)
    start, end = time_range(request)
    fmt = parse_format(request)
    tag = parse_tag(request)
    tenant = await parse_tenant(request, store)
    first = await query(store.records, start, end, tenant, None, PAGE, tag)  # a store that is down: 503, not cut
    pages = _pages(store, start, end, tenant, tag, first)
    if fmt == "csv":
        name = download_name("ledger", start, end, month=request.query_params.get("month"), tenant=tenant, tag=tag)
        return StreamingResponse(_csv_stream(list(COLUMNS), pages), media_type="text/csv; charset=utf-8",
                                 headers={"content-disposition": attachment(name), **NOSNIFF})
    return StreamingResponse(_json_stream(pages), media_type="application/json", headers=NOSNIFF)


async def usage(request: Request) -> Response:
    """A tenant's own totals, by model and day, with its key."""
    tenant = tenant_of(request)
    start, end = time_range(request)
    rows = await query(ledger_store(request).totals, start, end, ["day", "model"], tenant.name,
                       tag=parse_tag(request))
    return json_response({"object": "usage", "tenant": tenant.name, **shown_range(start, end),
                          "total": with_rates(sum_rows(rows)), "data": [with_rates(r) for r in rows]})


ROUTES = [
    Route("/admin/reports/costs", costs, methods=["GET"]),
    Route("/admin/ledger", ledger, methods=["GET"]),
    Route("/v1/usage", usage, methods=["GET"]),
]


async def query(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A store query on a thread; a store that fails is the gateway's 503, not a 500."""
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
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
        raise InvalidRequest(f"'{text[:40]}' is not an ISO date or time (as 2026-11-30 or 2026-11-30T08:00:00Z).",
                             "invalid_time", param="to" if end else "from") from None
    return sortable(moment)


def parse_month(text: str) -> tuple[datetime, datetime]:
    """``YYYY-MM`` as the month's [first moment, the next month's first moment) in UTC."""
    match = MONTH.fullmatch(text)
    year, month = (int(match[1]), int(match[2])) if match else (0, 0)
    if not (FIRST_YEAR <= year <= LAST_YEAR and 1 <= month <= 12):
        raise InvalidRequest(f"month takes a calendar month as YYYY-MM ({FIRST_YEAR}-01 to {LAST_YEAR}-12), "
                             f"not '{text[:40]}'.", "invalid_month", param="month")
    first = datetime(year, month, 1, tzinfo=UTC)
    return first, datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)


def shown_range(start: str, end: str) -> dict[str, str | None]:
    """The range as a report states it: null for an open end."""
    return {"from": None if start == OPEN_START else start, "to": None if end == OPEN_END else end}


def time_range(request: Request) -> tuple[str, str]:
    """The report's [start, end) in ledger times: ``month``, or ``from`` and ``to`` (either may be left open)."""
    q = request.query_params
    if q.get("month"):
        if q.get("from") or q.get("to"):
            raise InvalidRequest("Give month, or from and to, not both.", "invalid_range", param="month")
        first, after = parse_month(q["month"])
        return sortable(first), sortable(after)
    start = parse_time(q["from"], False) if q.get("from") else OPEN_START
    end = parse_time(q["to"], True) if q.get("to") else OPEN_END
    if start != OPEN_START and end != OPEN_END and start >= end:
        raise InvalidRequest(f"from ({q['from'][:40]}) must come before to ({q['to'][:40]}); a date as to "
                             "includes that whole day.", "invalid_range", param="from")
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


def parse_tag(request: Request) -> str | None:
    """One cost centre, ``key=value``, in the form records carry it (gateway.tags: the key lowercased, the value
    stripped)."""
    tag = request.query_params.get("tag")
    if not tag:
        return None
    key, _, value = tag.partition("=")
    key, value = key.strip().lower(), value.strip()
    if not key or not value or "=" in value or "," in tag or len(tag) > 256:
        raise InvalidRequest("tag takes one key=value pair (as project=search), matched exactly within a "
                             "record's tags.", "invalid_tag", param="tag")
    return f"{key}={value}"


async def parse_tenant(request: Request, store: LedgerStore) -> str | None:
    """The ``tenant`` filter: a tenant of the live policy, or one the ledger holds any record of."""
    name = request.query_params.get("tenant")
    if not name:
        return None
    tenants = gateway_of(request).store.current.tenants
    if name in tenants or await query(store.records, OPEN_START, OPEN_END, name, None, 1):
        return name
    raise InvalidRequest(unknown_tenant(name, tenants), "unknown_tenant", param="tenant")


def unknown_tenant(name: str, tenants: Iterable[str]) -> str:
    names = sorted(tenants)
    shown = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
    return (f"No tenant '{name[:40]}': tenant takes one the policy names ({shown or 'none'}) or one the ledger "
            "holds records of.")


def every_tenant(rows: list[dict[str, Any]], names: Iterable[str]) -> list[dict[str, Any]]:
    """Rows by tenant, then a zero row for each named tenant that has none (in name order): the tenants with
    records keep the store's order ahead of them."""
    seen = {row["tenant"] for row in rows}
    return [*rows, *({"tenant": name, **dict.fromkeys(TOTALS, 0)} for name in sorted(names) if name not in seen)]


def sum_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {k: sum(r[k] or 0 for r in rows) for k in TOTALS}


def with_rates(row: dict[str, Any]) -> dict[str, Any]:
    requests = row["requests"] or 0
    row["cost_usd"] = round(row["cost_usd"] or 0.0, 9)
    row["cost_per_1k_requests_usd"] = round(row["cost_usd"] * 1000 / requests, 9) if requests else 0.0
    row["tokens_per_request"] = round(((row["prompt_tokens"] or 0) + (row["completion_tokens"] or 0)) / requests,
                                      2) if requests else 0.0
    return row




FORMULA = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet may read as the start of a formula


def cell(value: Any) -> Any:
    """A CSV cell: plain decimals, lowercase booleans, nothing for an absent value, and text a spreadsheet reads
    as text (a leading ' before what it would take for a formula: a tenant named "=HYPERLINK(...)")."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float | Decimal):
        return plain(value)
    if isinstance(value, str) and value.startswith(FORMULA):
        return "'" + value
    return value


def period_label(start: str, end: str) -> str:
    """A range's first and last day for a file name (``all`` for each open end, or for a wholly open range)."""
    if start == OPEN_START and end == OPEN_END:
        return "all"
    first = "all" if start == OPEN_START else start[:10]
    if end == OPEN_END:
        return f"{first}_all"
    try:
        last = (datetime.fromisoformat(end.replace("Z", "+00:00")) - timedelta(microseconds=1)).date().isoformat()
    except (OverflowError, ValueError):
        last = end[:10]
    return f"{first}_{last}"


def download_name(kind: str, start: str, end: str, *, month: str | None = None, tenant: str | None = None,
                  tag: str | None = None, group_by: Sequence[str] = ()) -> str:
    """``costs_2026-11_acme_by-model.csv``: what, when (a month as asked, else first and last day), the filters
    (reduced to [A-Za-z0-9._-]) and the grouping, so a month's downloads do not overwrite each other."""
    parts = [kind, month or period_label(start, end)]
    parts += [UNSAFE.sub("_", value)[:64] for value in (tenant, tag) if value]
    if group_by:
        parts.append("by-" + "-".join(group_by))
    return "_".join(parts) + ".csv"


def attachment(filename: str) -> str:
    return f'attachment; filename="{UNSAFE.sub("_", filename)}"'


def csv_response(columns: list[str], rows: list[dict[str, Any]], filename: str) -> Response:
    out = io.StringIO()
    writer = csv.DictWriter(out, columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: cell(v) for k, v in row.items()} for row in rows)
    return Response(out.getvalue(), media_type="text/csv; charset=utf-8",
                    headers={"content-disposition": attachment(filename), **NOSNIFF})


async def _pages(store: LedgerStore, start: str, end: str, tenant: str | None, tag: str | None,
                 rows: list[dict[str, Any]]) -> AsyncIterator[list[dict[str, Any]]]:
    """Every record in the range from the first page on, page by page on threads (keyset on time and id:
    nothing skipped, nothing twice)."""
    while rows:
        yield rows
        rows = await asyncio.to_thread(store.records, start, end, tenant, (rows[-1]["time"], rows[-1]["id"]),
                                       PAGE, tag)


async def _csv_stream(columns: list[str], pages: AsyncIterator[list[dict[str, Any]]]) -> AsyncIterator[bytes]:
    out = io.StringIO()
    writer = csv.DictWriter(out, columns, lineterminator="\n")
    writer.writeheader()
    yield out.getvalue().encode()
    async for page in pages:
        out.seek(0)
        out.truncate()
        writer.writerows({k: cell(v) for k, v in row.items()} for row in page)
        yield out.getvalue().encode()


async def _json_stream(pages: AsyncIterator[list[dict[str, Any]]]) -> AsyncIterator[bytes]:
    yield b'{"object":"list","data":['
    first = True
    async for page in pages:
        body = b",".join(orjson.dumps(row) for row in page)
        yield body if first else b"," + body
        first = False
    yield b"]}"
