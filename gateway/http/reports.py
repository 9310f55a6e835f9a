"""Cost reports for finance: /admin/reports/costs, /admin/ledger (every record, streamed) and /v1/usage.

The report routes take the finance token (server.finance_token_sha256: reads reports and nothing else) or the
admin token; a tenant's key gets 403 there, and reads its own totals at /v1/usage. Queries run on threads
(the store's calls block). The cost report is a build (gateway.finance.heavy): read and written on the report
thread, one at a time in a process (a second one meanwhile is a 503 ``reports_busy`` with Retry-After), every row
of it from one cursor a chunk at a time, never held whole (gateway.finance.reports.costs). The ledger export
streams page by page, each page read and formatted on a thread (gateway.finance.reports.ledger_page); it is no
build (its memory is a page's). Here: the routes, their parameters, and the downloads' names.

Parameters, each refused with a 400 naming it when it is wrong (never silently replaced):
``from`` and ``to`` take ISO dates or times (UTC when no offset is given; a date as ``to`` includes that whole
day; ``from`` must come before ``to``), or ``month=YYYY-MM`` takes a calendar month instead of both.
``tenant`` filters to one tenant: one the live policy names, or one the ledger holds records of (a tenant that
left the policy is still reportable; a name known to neither is a typo, not an empty report). ``tag`` filters to
records whose tags hold that exact ``key=value`` pair. Grouped by ``tenant`` alone, the costs report lists every
tenant of the policy, with zeros for those without records.

CSV has ISO times and plain numbers (gateway.finance.reports.cell); each download is named for its period,
filters and grouping.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from gateway.errors import Conflict, InvalidRequest, Unavailable
from gateway.finance import heavy
from gateway.finance.reports import costs as cost_report
from gateway.finance.reports import ledger_page, parse_month, shown_range, sum_rows, with_rates
from gateway.http.guards import gateway_of, require_reader, signed_in, tenant_of
from gateway.http.responses import NOSNIFF, json_response, spooled
from gateway.ledger.stores import GROUPS, OPEN_END, OPEN_START, LedgerStore
from gateway.ledger.times import sortable

log = logging.getLogger("tollgate.reports")
UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def ledger_store(request: Request) -> LedgerStore:
    gw = gateway_of(request)
    if gw.ledger is None:
        raise Conflict("The ledger is not enabled: start the gateway with a data directory.", "ledger_disabled")
    return gw.ledger.store


async def costs(request: Request) -> Response:
    """The cost report, built on the report thread alone (gateway.finance.heavy: a second build meanwhile is a 503
    with Retry-After) from one cursor over the store's sums, a chunk at a time, into a spool: a grouping with a
    row per end user (``tag``, ``key``) is never held whole, and every row is in the answer."""
    await require_reader(request)
    store = ledger_store(request)
    start, end = time_range(request)
    group_by = parse_groups(request.query_params.get("group_by", "tenant"))
    fmt = parse_format(request)
    tag = parse_tag(request)
    tenant = await parse_tenant(request, store)
    names = ([tenant] if tenant else list(gateway_of(request).store.current.tenants)) if group_by == ["tenant"] \
        else None
    body = await heavy.build(f"costs by {','.join(group_by) or 'nothing'} {fmt}", cost_report, store, start, end,
                             group_by, tenant, tag, names, fmt)
    if fmt == "csv":
        name = download_name("costs", start, end, month=request.query_params.get("month"), tenant=tenant, tag=tag,
                             group_by=group_by)
        return spooled(body, "text/csv; charset=utf-8", {"content-disposition": attachment(name), **NOSNIFF})
    return spooled(body, "application/json")


async def ledger(request: Request) -> Response:
    """Every record in the range, streamed: each page read and formatted on a thread (a page's CSV is no work
    for the event loop), the first before the answer starts (a store that is down is a 503, not a cut file)."""
    await require_reader(request)
    store = ledger_store(request)
    start, end = time_range(request)
    fmt = parse_format(request)
    tag = parse_tag(request)
    tenant = await parse_tenant(request, store)
    first = await query(ledger_page, store, start, end, tenant, tag, None, fmt)
    pages = _ledger_pages(store, start, end, tenant, tag, fmt, first)
    if fmt == "csv":
        name = download_name("ledger", start, end, month=request.query_params.get("month"), tenant=tenant, tag=tag)
        return StreamingResponse(pages, media_type="text/csv; charset=utf-8",
                                 headers={"content-disposition": attachment(name), **NOSNIFF})
    return StreamingResponse(pages, media_type="application/json", headers=NOSNIFF)


async def usage(request: Request) -> Response:
    """A tenant's own totals, by model and day, with its key or its user's session."""
    principal = await signed_in(request, gateway_of(request).store.current)
    if principal is None:
        tenant = tenant_of(request).name
    elif principal.tenant is None:
        raise InvalidRequest(f"/v1/usage is a tenant's own; as {principal.role}, read /admin/reports/costs.",
                             "not_a_tenant")
    else:
        tenant = principal.tenant
    start, end = time_range(request)
    rows = await query(ledger_store(request).totals, start, end, ["day", "model"], tenant,
                       tag=parse_tag(request))
    return json_response({"object": "usage", "tenant": tenant, **shown_range(start, end),
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


async def _ledger_pages(store: LedgerStore, start: str, end: str, tenant: str | None, tag: str | None, fmt: str,
                        first: tuple[bytes, tuple[str, str] | None]) -> AsyncIterator[bytes]:
    """The export from its first page on, a page at a time on threads (keyset on time and id: nothing skipped,
    nothing twice)."""
    body, after = first
    yield body
    while after is not None:
        body, after = await asyncio.to_thread(ledger_page, store, start, end, tenant, tag, after, fmt)
        if body:
            yield body
    if fmt != "csv":
        yield b"]}"
