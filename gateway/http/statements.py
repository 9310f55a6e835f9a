"""Monthly statements for finance, and closing a month: the routes (the statement's figures and documents are
gateway.finance.statements; the closes' table and arithmetic gateway.ledger.closes).

``GET /admin/statements?month=YYYY-MM[&tenant=NAME]&format=json|html|csv|xlsx`` (the finance or admin token, or
the finance page's sign-in cookie; ``month`` defaults to this UTC month, as the finance page's selector): the
month's statement, for every tenant or one, as JSON, a printable page, a CSV or an Excel workbook
(gateway.finance.statements says what each holds: the page and the workbook in ``?lang=en|ko``, else as
``Accept-Language`` asks, and in the policy's ``finance.currency``; the CSV and JSON in the ledger's USD).
Downloads are named for the month and
the tenant (``statement_2026-11_acme.csv``, ``statement_2026-11_all.xlsx``). A statement (and a close) is read
and written on the report thread, one build at a time (gateway.finance.heavy): while another statement or report
is being built the answer is a 503 ``reports_busy`` with Retry-After; the body is spooled and streamed when large.

``POST /admin/statements/close?month=YYYY-MM`` (the admin token alone: finance reads, it does not close) closes
an ended month, once (the first close names a month the ledger holds); ``POST /admin/statements/reopen?month=``
reopens the latest closed month (a mistaken close); ``GET /admin/statements/closes`` lists the closed months. A
close and a reopen are in the admin audit log: who, from where, the month and its totals.

Each parameter that cannot be honoured is a 400 naming it: a month that is not YYYY-MM, one that has not begun,
from/to (a statement is a calendar month), a tenant neither the policy nor the ledger knows, an unknown format;
closing a month that has not ended is a 400 too, and closing out of order, twice or (the first close) before the
ledger began a 409, as is reopening a month that is not the latest closed one.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import Conflict, InvalidRequest, NotAuthenticated, NotPermitted
from gateway.finance import heavy, statements, words
from gateway.finance.reports import parse_month
from gateway.http.admin import audited
from gateway.http.guards import gateway_of, require_admin, require_reader
from gateway.http.reports import attachment, download_name, ledger_store, parse_tenant, query
from gateway.http.responses import NOSNIFF, json_response, spooled
from gateway.ledger import closes
from gateway.ledger.times import sortable
from gateway.runtime import Gateway

XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"


async def statement(request: Request) -> Response:
    await require_reader(request)
    gw = gateway_of(request)
    store = ledger_store(request)
    now = time.time()
    month, fmt = parse_statement(request, now)
    lang = words.choose(request.query_params.get("lang"), request.headers.get("accept-language"))
    tenant = await parse_tenant(request, store)
    first, after = parse_month(month)
    name = download_name("statement", sortable(first), sortable(after), month=month, tenant=tenant or "all")
    body = await heavy.build(f"statement {month} {fmt}", statements.document, store, month, tenant, fmt,
                             _inputs(gw, now, lang))
    if fmt == "csv":
        return spooled(body, "text/csv; charset=utf-8", {"content-disposition": attachment(name), **NOSNIFF})
    if fmt == "xlsx":
        return spooled(body, XLSX, {"content-disposition": attachment(name.removesuffix(".csv") + ".xlsx"),
                                    **NOSNIFF})
    if fmt == "html":
        return spooled(body, "text/html; charset=utf-8")
    return spooled(body, "application/json")


async def close_month(request: Request) -> Response:
    """Close an ended month: its statement as it stands becomes its snapshot, for good."""
    actor = await require_closer(request)
    gw = gateway_of(request)
    store = ledger_store(request)
    now = time.time()
    month = parse_month_param(request)
    if parse_month(month)[1].timestamp() > now:
        raise InvalidRequest(f"{month} has not ended (UTC): a month closes once it is over.", "month_not_ended",
                             param="month")
    stored = await heavy.build(f"close {month}", statements.close, store, month, "admin", _inputs(gw, now))
    await audited(request, actor, "statement.close", month,
                  {"month": month, "closed_at": stored.closed_at, "total": stored.snapshot["total"]})
    return json_response(stored.statement())


async def reopen_month(request: Request) -> Response:
    """Reopen the latest closed month (a mistaken close): its snapshot goes, and its statement is read live
    again until it closes again. Answers the close that was removed."""
    actor = await require_closer(request)
    store = ledger_store(request)
    month = parse_month_param(request)
    closes.check_reopen(await query(closes.chain, store), month)
    removed = await query(closes.reopen, store, month)
    if removed is None:  # a close after it, or another reopen, stood first: say which
        closes.check_reopen(await query(closes.chain, store), month)
        raise Conflict("The closed months changed at the same moment; read /admin/statements/closes and retry.",
                       "reopen_conflict")
    await audited(request, actor, "statement.reopen", month,
                  {"month": month, "closed_at": removed.closed_at, "closed_by": removed.closed_by,
                   "total": removed.snapshot["total"]})
    return json_response({"object": "statement.reopened", **removed.public()})


async def closed_months(request: Request) -> Response:
    await require_reader(request)
    chain = await query(closes.chain, ledger_store(request))
    return json_response({"object": "list", "data": [c.public() for c in chain]})


ROUTES = [
    Route("/admin/statements", statement, methods=["GET"]),
    Route("/admin/statements/close", close_month, methods=["POST"]),
    Route("/admin/statements/reopen", reopen_month, methods=["POST"]),
    Route("/admin/statements/closes", closed_months, methods=["GET"]),
]


async def require_closer(request: Request) -> str:
    """An admin, by token or session (who, for the audit; a close records the role); a reader of the reports is
    told it may not close."""
    try:
        return await require_admin(request)
    except (NotAuthenticated, NotPermitted):
        await require_reader(request)  # nobody known: 401; a tenant: 403
    raise NotPermitted("Closing a month needs the admin token or an admin's sign-in; the finance token reads "
                       "statements.", "forbidden")


def _inputs(gw: Gateway, now: float, lang: str = "en") -> statements.Inputs:
    snapshot = gw.store.current
    live = gw.presence.live(now) if gw.presence is not None else []
    return statements.Inputs(list(snapshot.tenants), snapshot.policy, live, now, lang)


def parse_month_param(request: Request, default: str | None = None) -> str:
    """The ``month`` asked for (``default`` when none is given and there is one; else a 400)."""
    q = request.query_params
    if q.get("from") or q.get("to"):
        raise InvalidRequest("A statement is a calendar month: give month=YYYY-MM, not from or to.", "invalid_range",
                             param="from" if q.get("from") else "to")
    month = q.get("month") or default
    if not month:
        raise InvalidRequest("month is required, as YYYY-MM.", "missing_month", param="month")
    parse_month(month)
    return month


def parse_statement(request: Request, now: float) -> tuple[str, str]:
    """(month, format): a month that has begun (UTC), this one when none is asked for, and one of
    gateway.finance.statements.FORMATS."""
    month = parse_month_param(request, datetime.fromtimestamp(now, UTC).strftime("%Y-%m"))
    if parse_month(month)[0].timestamp() > now:
        raise InvalidRequest(f"{month} has not begun (UTC): there is nothing to state yet.", "month_not_begun",
                             param="month")
    fmt = request.query_params.get("format", "json")
    if fmt not in statements.FORMATS:
        raise InvalidRequest(f"format takes one of {', '.join(statements.FORMATS)}.", "invalid_format",
                             param="format")
    return month, fmt
