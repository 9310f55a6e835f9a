"""Monthly statements for finance, and closing a month (gateway.ledger.closes holds the table and the arithmetic).

``GET /admin/statements?month=YYYY-MM[&tenant=NAME]&format=json|html|csv|xlsx`` (the finance or admin token, or
the finance page's sign-in cookie): per tenant of the live policy (each listed, zeros without traffic; tenants
that left it but have records too), or one tenant, the month's lines by model and by cost centre, its GPU cost,
the workers' idle cost apart, the reconciliation, and the adjustments for closed months that it carries. JSON says
``closed`` and ``closed_at``. ``html`` is a printable page (a print stylesheet, each tenant on its own printed
page; no JavaScript, nothing fetched); ``csv`` is one table with a ``section`` column; ``xlsx`` is a workbook with
a sheet per view (and one per tenant when all are shown), numbers as numbers. Downloads are named for the month
and the tenant (``statement_2026-11_acme.csv``, ``statement_2026-11_all.xlsx``). Money in the page and the CSV is
a plain decimal (``gateway.ledger.prices.plain``). A text cell that a spreadsheet would read as a formula (it
starts with = + - @, a tab or a carriage return) is neutralised: a leading ' in the CSV, a text cell with Excel's
quote prefix in the workbook.

``POST /admin/statements/close?month=YYYY-MM`` (the admin token alone: finance reads, it does not close) closes
an ended month, once; ``GET /admin/statements/closes`` lists the closed months.

Each parameter that cannot be honoured is a 400 naming it: a month that is not YYYY-MM, one that has not begun,
from/to (a statement is a calendar month), a tenant neither the policy nor the ledger knows, an unknown format;
closing a month that has not ended is a 400 too, and closing out of order or twice a 409.
"""

from __future__ import annotations

import asyncio
import csv
import io
import re
import time
import urllib.parse
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from gateway.auth import is_admin
from gateway.errors import Conflict, InvalidRequest, NotPermitted
from gateway.http.guards import authorization, gateway_of, require_reader
from gateway.http.reports import (
    FORMULA,
    attachment,
    cell,
    download_name,
    ledger_store,
    parse_month,
    parse_tenant,
    query,
)
from gateway.http.responses import NOSNIFF, json_response
from gateway.ledger import closes
from gateway.ledger.prices import plain
from gateway.ops import gpu_costs
from gateway.runtime import Gateway

FORMATS = ("json", "html", "csv", "xlsx")
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
ABSENT = {"model": "(refused before a model)", "tag": "(untagged)"}
# a column: (field, heading, kind); kind is text, count, usd or hours
Column = tuple[str, str, str]
USAGE: list[Column] = [("requests", "Requests", "count"), ("prompt_tokens", "Input tokens", "count"),
                       ("completion_tokens", "Output tokens", "count"), ("cached_tokens", "Cached tokens", "count"),
                       ("cost_usd", "List-price spend (USD)", "usd")]
GPU: Column = ("gpu_cost_usd", "GPU cost (USD)", "usd")
SUMMARY: list[Column] = [("tenant", "Tenant", "text"), *USAGE, GPU, ("adjustments_usd", "Adjustments (USD)", "usd"),
                         ("billable_usd", "Billable (USD)", "usd")]
BY_MODEL: list[Column] = [("tenant", "Tenant", "text"), ("model", "Model", "text"), *USAGE, GPU]
BY_TAG: list[Column] = [("tenant", "Tenant", "text"), ("tag", "Cost centre (tags)", "text"), *USAGE, GPU]
IDLE: list[Column] = [("worker", "Worker", "text"), ("pool", "Pool", "text"), ("usd_per_hour", "USD per hour", "usd"),
                      ("configured_hours", "Configured hours", "hours"), ("busy_hours", "Busy hours", "hours"),
                      ("idle_hours", "Idle hours", "hours"), ("cost_usd", "Workers' cost (USD)", "usd"),
                      ("idle_cost_usd", "Idle cost (USD)", "usd")]
ADJUSTMENTS: list[Column] = [("label", "Adjustment", "text"), ("tenant", "Tenant", "text"),
                             ("model", "Model", "text"), *USAGE]
LINES: list[Column] = [("view", "Line", "text"), ("model", "Model", "text"), ("tag", "Cost centre (tags)", "text"),
                       ("for_month", "For month", "text"), *USAGE, GPU]
CSV_COLUMNS = ["section", "month", "label", "tenant", "model", "tag", "worker", "pool", "requests", "prompt_tokens",
               "completion_tokens", "cached_tokens", "cost_usd", "gpu_cost_usd", "adjustments_usd", "billable_usd",
               "usd_per_hour", "configured_hours", "busy_hours", "idle_hours", "idle_cost_usd", "workers_cost_usd",
               "difference_usd"]
STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1d2330;background:#f7f8fa}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}h3{font-size:14px;margin:16px 0 6px}
.muted{color:#667}.status{display:inline-block;padding:2px 8px;border-radius:4px;background:#eef1f5}
.closed{background:#e3f1e7}table{border-collapse:collapse;background:#fff;margin-bottom:8px}
td,th{border:1px solid #dde1e8;padding:4px 8px;text-align:right}th{background:#eef1f5}
td:first-child,th:first-child,td.text,th.text{text-align:left}tr.total td{font-weight:bold}
@page{size:A4 landscape;margin:12mm}
@media print{body{margin:0;background:#fff;font-size:10px}.noprint{display:none}
section.tenant,section.fleet{break-before:page;page-break-before:always}
tr{break-inside:avoid;page-break-inside:avoid}thead{display:table-header-group}
th{background:#eee;-webkit-print-color-adjust:exact;print-color-adjust:exact}}
"""


async def statement(request: Request) -> Response:
    await require_reader(request)
    gw = gateway_of(request)
    store = ledger_store(request)
    month, fmt = parse_statement(request, time.time())
    tenant = await parse_tenant(request, store)
    chain = await query(closes.chain, store)
    out = await query(closes.statement, store, month, gw.store.current.tenants, gpu_of(gw), time.time(), chain)
    if tenant is not None:
        out = closes.for_tenant(out, tenant)
    name = download_name("statement", out["from"], out["to"], month=month, tenant=tenant or "all")
    if fmt == "csv":
        return Response(to_csv(out), media_type="text/csv; charset=utf-8",
                        headers={"content-disposition": attachment(name), **NOSNIFF})
    if fmt == "xlsx":
        body = await asyncio.to_thread(to_xlsx, out)  # no store call: a failure here is no store outage
        return Response(body, media_type=XLSX,
                        headers={"content-disposition": attachment(name.removesuffix(".csv") + ".xlsx"), **NOSNIFF})
    if fmt == "html":
        return HTMLResponse(to_html(out))
    return json_response(out)


async def close_month(request: Request) -> Response:
    """Close an ended month: its statement as it stands becomes its snapshot, for good."""
    role = await require_closer(request)
    gw = gateway_of(request)
    store = ledger_store(request)
    now = time.time()
    month = parse_month_param(request)
    if parse_month(month)[1].timestamp() > now:
        raise InvalidRequest(f"{month} has not ended (UTC): a month closes once it is over.", "month_not_ended",
                             param="month")
    chain = await query(closes.chain, store)
    closes.check(chain, month)
    figures = await query(closes.statement, store, month, gw.store.current.tenants, gpu_of(gw), now, chain)
    stored = await query(closes.close, store, month, role, time.time(), figures, chain)
    if stored is None:  # another close stood first: say which
        closes.check(await query(closes.chain, store), month)
        raise Conflict("Another month was closed at the same moment; read /admin/statements/closes and retry.",
                       "close_conflict")
    return json_response(stored.statement())


async def closed_months(request: Request) -> Response:
    await require_reader(request)
    chain = await query(closes.chain, ledger_store(request))
    return json_response({"object": "list", "data": [c.public() for c in chain]})


ROUTES = [
    Route("/admin/statements", statement, methods=["GET"]),
    Route("/admin/statements/close", close_month, methods=["POST"]),
    Route("/admin/statements/closes", closed_months, methods=["GET"]),
]


async def require_closer(request: Request) -> str:
    """The admin token (the role a close records); a reader of the reports is told it may not close."""
    snapshot = gateway_of(request).store.current
    if is_admin(authorization(request), snapshot):
        return "admin"
    await require_reader(request)  # nobody known: 401; a tenant's key: 403
    raise NotPermitted("Closing a month needs the admin token; the finance token reads statements.", "forbidden")


def gpu_of(gw: Gateway) -> closes.GpuReport:
    """The GPU report over the shared store, with this process's open presence spans as they stand."""
    assert gw.ledger is not None
    store, policy = gw.ledger.store, gw.store.current.policy
    live = gw.presence.live(time.time()) if gw.presence is not None else []
    return lambda start, end, group_by: gpu_costs.gather(store, policy, start, end, group_by, live, False)


def parse_month_param(request: Request) -> str:
    q = request.query_params
    if q.get("from") or q.get("to"):
        raise InvalidRequest("A statement is a calendar month: give month=YYYY-MM, not from or to.", "invalid_range",
                             param="from" if q.get("from") else "to")
    month = q.get("month")
    if not month:
        raise InvalidRequest("month is required, as YYYY-MM.", "missing_month", param="month")
    parse_month(month)
    return month


def parse_statement(request: Request, now: float) -> tuple[str, str]:
    """(month, format): a month that has begun (UTC), and one of FORMATS."""
    month = parse_month_param(request)
    if parse_month(month)[0].timestamp() > now:
        raise InvalidRequest(f"{month} has not begun (UTC): there is nothing to state yet.", "month_not_begun",
                             param="month")
    fmt = request.query_params.get("format", "json")
    if fmt not in FORMATS:
        raise InvalidRequest(f"format takes one of {', '.join(FORMATS)}.", "invalid_format", param="format")
    return month, fmt


# -- CSV ------------------------------------------------------------------------------------------------------

def csv_rows(out: dict[str, Any]) -> Iterable[dict[str, Any]]:
    month = out["month"]
    for r in out["tenants"]:
        yield {"section": "tenant", "month": month, **r}
    yield {"section": "total", "month": month, **out["total"]}
    for r in out["by_model"]:
        yield {"section": "model", "month": month, **r}
    for r in out["by_cost_centre"]:
        yield {"section": "cost_centre", "month": month, **r}
    for r in out["adjustments"]:
        yield {"section": "adjustment", **r, "month": r["for_month"]}
    for r in out["idle"]:
        yield {"section": "idle", "month": month, **r}
    rec = out["reconciliation"]
    yield {"section": "reconciliation", "month": month, "gpu_cost_usd": rec["attributed_usd"],
           "idle_cost_usd": rec["idle_usd"], "workers_cost_usd": rec["workers_cost_usd"],
           "difference_usd": rec["difference_usd"]}


def to_csv(out: dict[str, Any]) -> str:
    text = io.StringIO()
    writer = csv.DictWriter(text, CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: cell(v) for k, v in row.items()} for row in csv_rows(out))
    return text.getvalue()


# -- the workbook ---------------------------------------------------------------------------------------------

SHEET_UNSAFE = re.compile(r"[\[\]:*?/\\]")
MONEY = '"$"#,##0.00#######'  # USD with cents, and up to nine places: a request costs fractions of a cent
NUMBER_FORMATS = {"count": "#,##0", "usd": MONEY, "hours": "0.000000"}


def sheet_names(tenants: Sequence[str], taken: Iterable[str]) -> dict[str, str]:
    """A sheet name per tenant: Excel's rules (at most 31 characters, none of []:*?/\\, no ' at either end,
    unique regardless of case, never "History"), distinct from ``taken``."""
    from openpyxl.cell.cell import ILLEGAL_CHARACTERS_RE

    used = {name.casefold() for name in [*taken, "History"]}
    out = {}
    for tenant in tenants:
        base = SHEET_UNSAFE.sub("_", ILLEGAL_CHARACTERS_RE.sub("", tenant)).strip("'")[:31].strip("'") or "tenant"
        name, n = base, 2
        while name.casefold() in used:
            suffix = f" ({n})"
            name, n = base[:31 - len(suffix)] + suffix, n + 1
        used.add(name.casefold())
        out[tenant] = name
    return out


def to_xlsx(out: dict[str, Any]) -> bytes:
    """The statement as a workbook (on a thread: openpyxl builds it in memory)."""
    from openpyxl import Workbook

    book = Workbook()
    book.remove(book.active)
    book.properties.title = f"Tollgate statement {out['month']}"
    book.properties.subject = status_line(out)
    _sheet(book, "Summary by tenant", SUMMARY, [*out["tenants"], {"tenant": "Total", **out["total"]}])
    for title, columns, rows, label in (("By model", BY_MODEL, out["by_model"], "tenant"),
                                        ("By cost centre", BY_TAG, out["by_cost_centre"], "tenant"),
                                        ("GPU idle by worker", IDLE, out["idle"], "worker")):
        _sheet(book, title, columns, [*rows, _sum_row(rows, label, "Total")] if rows else [], total=bool(rows))
    _sheet(book, "Adjustments", ADJUSTMENTS, out["adjustments"], total=False)
    rec = out["reconciliation"]
    _sheet(book, "Statement", [("item", "Item", "text"), ("value", "Value", "usd")], [
        {"item": "Month", "value": out["month"]}, {"item": "From (UTC)", "value": out["from"]},
        {"item": "To (UTC)", "value": out["to"]}, {"item": "Tenant", "value": out["tenant"] or "(all)"},
        {"item": "Closed", "value": "yes" if out["closed"] else "no (figures may change until it is closed)"},
        {"item": "Closed at", "value": out["closed_at"]}, {"item": "Closed by", "value": out["closed_by"]},
        {"item": "Workers' hours at their rate (USD)", "value": rec["workers_cost_usd"]},
        {"item": "Tenants' GPU cost (USD)", "value": rec["attributed_usd"]},
        {"item": "Idle GPU cost (USD)", "value": rec["idle_usd"]},
        {"item": "Difference (USD)", "value": rec["difference_usd"]}], total=False)
    if out["tenant"] is None:
        names = sheet_names([r["tenant"] for r in out["tenants"]], book.sheetnames)
        for summary in out["tenants"]:
            lines = tenant_lines(out, summary["tenant"])
            _sheet(book, names[summary["tenant"]], LINES, [*lines, {"view": "Total", **summary}])
    data = io.BytesIO()
    book.save(data)
    return data.getvalue()


def tenant_lines(out: dict[str, Any], tenant: str) -> list[dict[str, Any]]:
    return ([{"view": "By model", "for_month": out["month"], **r} for r in out["by_model"] if r["tenant"] == tenant]
            + [{"view": "By cost centre", "for_month": out["month"], **r} for r in out["by_cost_centre"]
               if r["tenant"] == tenant]
            + [{"view": "Adjustment", **r} for r in out["adjustments"] if r["tenant"] == tenant])


def _sum_row(rows: list[dict[str, Any]], label_field: str, label: str) -> dict[str, Any]:
    sums: dict[str, Any] = {label_field: label}
    for row in rows:
        for k, v in row.items():
            if isinstance(v, int | float) and not isinstance(v, bool) and k != "usd_per_hour":
                sums[k] = sums.get(k, 0) + v
    return {k: round(v, 9) if isinstance(v, float) else v for k, v in sums.items()}


def _sheet(book: Any, title: str, columns: list[Column], rows: list[dict[str, Any]], total: bool = True) -> None:
    """One view as a sheet: a bold, frozen header row, numbers as numbers in their format, text as text; the last
    row bold when it is the total."""
    from openpyxl.cell.cell import ILLEGAL_CHARACTERS_RE
    from openpyxl.styles import Font
    from openpyxl.utils import get_column_letter

    sheet = book.create_sheet(title)
    sheet.append([heading for _, heading, _ in columns])
    for c in sheet[1]:
        c.font = Font(bold=True)
    sheet.freeze_panes = "A2"
    for r, row in enumerate(rows, start=2):
        for col, (field, _, kind) in enumerate(columns, start=1):
            value = row.get(field)
            target = sheet.cell(r, col)
            if isinstance(value, str):
                target.value = ILLEGAL_CHARACTERS_RE.sub("", value)
                target.data_type = "s"  # text stays text: never a formula, whatever it starts with
                target.quotePrefix = value.startswith(FORMULA)
            elif isinstance(value, int | float) and not isinstance(value, bool):
                target.value = value
                target.number_format = NUMBER_FORMATS.get(kind, "General")
            else:
                target.value = value
    if total:
        for c in sheet[sheet.max_row]:
            c.font = Font(bold=True)
    for col, (field, heading, _) in enumerate(columns, start=1):
        width = max([len(heading), *(len(str(row.get(field) or "")) for row in rows[:500])])
        sheet.column_dimensions[get_column_letter(col)].width = min(60, width + 2)


# -- the page -------------------------------------------------------------------------------------------------

def status_line(out: dict[str, Any]) -> str:
    if out["closed"]:
        return f"Closed {out['closed_at']} by {out['closed_by']}: this statement no longer changes."
    return "Open: its figures may change until the month is closed."


def _shown(field: str, kind: str, value: Any) -> str:
    if kind == "text":
        return escape(ABSENT.get(field, "-") if value is None else str(value))
    if kind in ("usd", "hours"):
        return "-" if value is None else plain(value)
    return "-" if value is None else str(value)


def _table(columns: list[Column], rows: list[dict[str, Any]], test_id: str, total: dict[str, Any] | None = None,
           empty: str = "None.") -> str:
    head = "".join(f'<th class="{kind}">{escape(heading)}</th>' for _, heading, kind in columns)
    body = "".join(f'<tr data-testid="{test_id}-row">'
                   + "".join(f'<td class="{kind}">{_shown(field, kind, row.get(field))}</td>'
                             for field, _, kind in columns) + "</tr>" for row in rows)
    if not rows:
        body = f'<tr><td colspan="{len(columns)}" class="muted">{escape(empty)}</td></tr>'
    if total is not None and rows:
        body += ('<tr class="total" data-testid="' + test_id + '-total">'
                 + "".join(f'<td class="{kind}">{_shown(field, kind, total.get(field))}</td>'
                           for field, _, kind in columns) + "</tr>")
    return f'<table data-testid="{test_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def to_html(out: dict[str, Any]) -> str:
    month, tenant = out["month"], out["tenant"]
    query = f"month={month}" + (f"&tenant={urllib.parse.quote(tenant, safe='')}" if tenant else "")
    links = (f'<p class="noprint"><a href="/admin/statements?{query}&format=csv">CSV</a> · '
             f'<a href="/admin/statements?{query}&format=xlsx">Excel workbook</a> · '
             f'<a href="/reports?month={month}">Finance page</a></p>')
    status = (f'<p><span class="status{" closed" if out["closed"] else ""}" data-testid="status">'
              f'{escape(status_line(out))}</span></p>')
    rec = out["reconciliation"]
    tenants = [_tenant_section(out, r) for r in out["tenants"]]
    body = (f'<h1>Statement {escape(month)}{" for " + escape(tenant) if tenant else ""}</h1>'
            f'<p class="muted" data-testid="period">{out["from"][:10]} to {_last_day(out["to"])} (UTC)</p>'
            f'{status}{links}'
            f'<h2>Summary by tenant</h2>'
            + _table(SUMMARY, out["tenants"], "summary", {"tenant": "Total", **out["total"]})
            + '<h2>Adjustments</h2><p class="muted">Records that reached a closed month after its close, carried '
              'here once.</p>' + _table(ADJUSTMENTS, out["adjustments"], "adjustments", empty="No adjustments.")
            + "".join(tenants)
            + '<section class="fleet"><h2>GPU idle by worker</h2><p class="muted">The workers\' hours no request '
              'ran in: never spread over tenants.</p>'
            + _table(IDLE, out["idle"], "idle", _sum_row(out["idle"], "worker", "Total"), "No worker hours.")
            + '<h2>Reconciliation</h2><table data-testid="reconciliation"><tbody>'
            + "".join(f'<tr><td>{label}</td><td data-testid="rec-{key}">{plain(rec[key])}</td></tr>'
                      for key, label in (("workers_cost_usd", "Workers' hours at their rate (USD)"),
                                         ("attributed_usd", "Tenants' GPU cost (USD)"),
                                         ("idle_usd", "Idle GPU cost (USD)"), ("difference_usd", "Difference (USD)")))
            + "</tbody></table></section>")
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<title>Tollgate statement {escape(month)}{" " + escape(tenant) if tenant else ""}</title>'
            f'<meta name="viewport" content="width=device-width"><style>{STYLE}</style></head><body>{body}</body>'
            '</html>')


def _last_day(end: str) -> str:
    return datetime.fromtimestamp(datetime.fromisoformat(end).timestamp() - 1, UTC).date().isoformat()


def _tenant_section(out: dict[str, Any], summary: dict[str, Any]) -> str:
    name = summary["tenant"]
    mine = closes.for_tenant(out, name)
    return (f'<section class="tenant" data-testid="tenant-section"><h2>Tenant {escape(name)} · {escape(out["month"])}'
            f'</h2><p class="muted">{out["from"][:10]} to {_last_day(out["to"])} (UTC). {escape(status_line(out))}</p>'
            + _table(SUMMARY, [summary], "tenant-summary")
            + "<h3>By model</h3>" + _table(BY_MODEL[1:], mine["by_model"], "tenant-model", empty="No requests.")
            + "<h3>By cost centre</h3>" + _table(BY_TAG[1:], mine["by_cost_centre"], "tenant-tag",
                                                 empty="No requests.")
            + "<h3>Adjustments</h3>" + _table(ADJUSTMENTS[:1] + ADJUSTMENTS[2:], mine["adjustments"],
                                              "tenant-adjustments", empty="No adjustments.")
            + "</section>")
