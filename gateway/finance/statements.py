"""Monthly statements for finance, built from the ledger: the figures (``read``), the document in each format
(``document``: JSON, a printable HTML page, CSV, an Excel workbook) and a month's close (``close``);
gateway.ledger.closes holds the closes' table and the arithmetic, and gateway.http.statements the routes.

A statement is, per tenant of the live policy (each listed, zeros without traffic; tenants that left it but have
records too), or one tenant, the month's lines by model and by cost centre, its GPU cost, the workers' idle cost
apart, the reconciliation, and the adjustments for closed months that it carries; one tenant's statement
(``own``) holds its GPU cost alone, never the idle hours nor the fleet's reconciliation (``reconciliation`` is
null). JSON says ``closed`` and
``closed_at``. ``html`` is a printable page (a print stylesheet, each tenant on its own printed page; no
JavaScript, nothing fetched); ``csv`` is one table with a ``section`` column; ``xlsx`` is a workbook with a sheet
per view (and one per tenant when all are shown), numbers as numbers. The page and the workbook show money as
gateway.finance.money does everywhere (amounts to the cent, rates to the digits they need, the period as its first
and last day, the rounding said on the statement); the CSV and JSON carry the ledger's exact figures as plain
decimals (``gateway.ledger.prices.plain``). A text cell that a spreadsheet would read as a formula (it starts with
= + - @, a tab or a carriage return) is neutralised: a leading ' in the CSV, a text cell with Excel's quote prefix
in the workbook.

Each tenant's cost centres are its ``centres.TOP`` (200) largest by list-price spend, then one line,
"(other cost centres)", for the rest (gateway.ledger.centres): its lines still sum to its total, and a ``user``
tag no longer makes a line per end user. A statement (and a close) is read and written on the report thread, one
build at a time (gateway.finance.heavy), into a spooled body.
"""

from __future__ import annotations

import csv
import io
import re
import time
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape
from typing import IO, Any

import orjson

from gateway.errors import Conflict
from gateway.finance import gpu_costs, heavy, money, words
from gateway.finance.reports import FORMULA, cell, parse_month
from gateway.ledger import centres, closes
from gateway.ledger.stores import LedgerStore
from gateway.ledger.times import sortable
from gateway.policy.schema import Policy

FORMATS = ("json", "html", "csv", "xlsx")
ABSENT = {"model": "(refused before a model)", "tag": "(untagged)"}
# a column: (field, heading, kind); kind is text, count, usd (an amount), rate or hours
Column = tuple[str, str, str]
USAGE: list[Column] = [("requests", "Requests", "count"), ("prompt_tokens", "Input tokens", "count"),
                       ("completion_tokens", "Output tokens", "count"), ("cached_tokens", "Cached tokens", "count"),
                       ("cost_usd", "List-price spend (USD)", "usd")]
GPU: Column = ("gpu_cost_usd", "GPU cost (USD)", "usd")
SUMMARY: list[Column] = [("tenant", "Tenant", "text"), *USAGE, GPU, ("adjustments_usd", "Adjustments (USD)", "usd"),
                         ("billable_usd", "Billable (USD)", "usd")]
BY_MODEL: list[Column] = [("tenant", "Tenant", "text"), ("model", "Model", "text"), *USAGE, GPU]
BY_TAG: list[Column] = [("tenant", "Tenant", "text"), ("tag", "Cost centre (tags)", "text"), *USAGE, GPU]
IDLE: list[Column] = [("worker", "Worker", "text"), ("pool", "Pool", "text"), ("usd_per_hour", "USD per hour", "rate"),
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
body{font:14px/1.45 FONTS;margin:24px;color:#1d2330;background:#f7f8fa}
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
""".replace("FONTS", words.FONTS)


@dataclass(frozen=True, slots=True)
class Inputs:
    """What a statement reads besides the ledger, taken on the event loop: the live policy's tenants (each
    listed), its pools and prices, this process's open presence spans as they stand, the moment, and the language
    the page and the workbook are written in (gateway.finance.words)."""

    tenants: list[str]
    policy: Policy
    live: list[dict[str, Any]]
    now: float
    lang: str = "en"


def read(store: LedgerStore, month: str, given: Inputs, chain: Sequence[closes.Close]) -> dict[str, Any]:
    """The month's statement (blocking: on the report thread): its snapshot when closed, else read live with
    each tenant's cost centres past its top centres.TOP as one line (gateway.ledger.centres) and the GPU figures
    by model and by cost centre from one pass over the records (gateway.finance.gpu_costs.OnePass)."""
    first, after = parse_month(month)
    view = centres.Centres(store, sortable(first), sortable(after))
    gpu = gpu_costs.OnePass(store, given.policy, given.live, [["tenant", "model"], ["tenant", "tag"]], view.fold)
    return closes.statement(view, month, given.tenants, gpu, given.now, chain)


def document(store: LedgerStore, month: str, tenant: str | None, fmt: str, given: Inputs) -> heavy.Spool:
    """The month's statement in ``fmt`` (blocking: on the report thread), for every tenant or one: the page and
    the workbook in ``given.lang`` and in the policy's currency at the rate in force on the month's first day; the
    CSV and JSON in the ledger's USD."""
    out = read(store, month, given, closes.chain(store))
    if tenant is not None:
        out = own(out, tenant)
    body = heavy.Spool()
    shown = money.display_currency(given.policy.finance, parse_month(month)[0].date())
    if fmt == "csv":
        body.csv(CSV_COLUMNS, ({k: cell(v) for k, v in row.items()} for row in csv_rows(out)))
    elif fmt == "xlsx":
        with words.speaking(given.lang), money.shown_in(shown):
            write_xlsx(out, body.writer())
    elif fmt == "html":
        with words.speaking(given.lang), money.shown_in(shown):
            body.write(to_html(out))
    else:
        body.write(orjson.dumps(out))
    return body


OWN_GPU = ("GPU cost here is this tenant's share of the workers' busy time alone: each moment a worker ran its "
           "requests, shared among the requests running then. Other tenants' cost and the workers' idle hours are "
           "not this tenant's; they are on the statement for every tenant.")


def own(out: dict[str, Any], tenant: str) -> dict[str, Any]:
    """One tenant's statement: its lines, adjustments and total, and nothing of the fleet's (no idle rows and no
    reconciliation of the workers' hours, which are everyone's: ``reconciliation`` is None)."""
    return closes.for_tenant(out, tenant) | {"idle": [], "reconciliation": None}


def close(store: LedgerStore, month: str, role: str, given: Inputs) -> closes.Close:
    """Close ``month`` (blocking: on the report thread): in order, once, on its live statement as it stands."""
    chain = closes.chain(store)
    closes.check(chain, month)
    if not chain:  # the first close names a month the ledger holds
        closes.check_first(chain, month, closes.holds(store, month), closes.first_month(store))
    figures = read(store, month, given, chain)
    stored = closes.close(store, month, role, time.time(), figures, chain)
    if stored is None:  # another close stood first: say which
        closes.check(closes.chain(store), month)
        raise Conflict("Another month was closed at the same moment; read /admin/statements/closes and retry.",
                       "close_conflict")
    return stored


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
    if rec is None:  # one tenant's statement: nothing of the fleet's
        return
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
NUMBER_FORMATS = {"count": "#,##0", "hours": "0.000000"}  # an amount's and a rate's: gateway.finance.money


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
    """The statement as a workbook's bytes (``write_xlsx`` into memory)."""
    data = io.BytesIO()
    write_xlsx(out, data)
    return data.getvalue()


def write_xlsx(out: dict[str, Any], into: IO[bytes] | io.RawIOBase) -> None:
    """The statement as a workbook written into ``into`` (blocking: on a thread). openpyxl's write-only mode:
    each sheet's rows go to a temporary file as they are appended, so a workbook costs its rows' text, not a
    cell object per value (a sheet per view, and one per tenant when all are shown)."""
    from openpyxl import Workbook

    book = Workbook(write_only=True)
    say = words.say
    book.properties.title = f"Tollgate statement {out['month']}"
    book.properties.subject = status_line(out)
    _sheet(book, say("Summary by tenant"), SUMMARY, [*out["tenants"], {"tenant": say("Total"), **out["total"]}])
    rec = out["reconciliation"]
    views = [("By model", BY_MODEL, out["by_model"], "tenant"),
             ("By cost centre", BY_TAG, out["by_cost_centre"], "tenant")]
    if rec is not None:  # the fleet's sheet: not on one tenant's statement
        views.append(("GPU idle by worker", IDLE, out["idle"], "worker"))
    for title, columns, rows, label in views:
        _sheet(book, say(title), columns, [*rows, _sum_row(rows, label, say("Total"))] if rows else [],
               total=bool(rows))
    _sheet(book, say("Adjustments"), ADJUSTMENTS, out["adjustments"], total=False)
    gpu_rows = [{"item": say("GPU cost of {tenant} (USD)", tenant=out["tenant"]),
                 "value": out["total"]["gpu_cost_usd"]},
                {"item": say("GPU cost"), "value": say(OWN_GPU)}] if rec is None else [
        {"item": say("Workers' hours at their rate (USD)"), "value": rec["workers_cost_usd"]},
        {"item": say("Tenants' GPU cost (USD)"), "value": rec["attributed_usd"]},
        {"item": say("Idle GPU cost (USD)"), "value": rec["idle_usd"]},
        {"item": say("Difference (USD)"), "value": rec["difference_usd"]}]
    _sheet(book, say("Statement"), [("item", "Item", "text"), ("value", "Value", "usd")], [
        {"item": say("Month"), "value": out["month"]}, {"item": say("Period (UTC)"), "value": period_of(out)},
        {"item": say("Tenant"), "value": out["tenant"] or say("(all)")},
        {"item": say("Closed"), "value": say("yes") if out["closed"] else
         say("no (figures may change until it is closed)")},
        {"item": say("Closed at"), "value": out["closed_at"]}, {"item": say("Closed by"), "value": out["closed_by"]},
        *gpu_rows, *_currency_rows(), {"item": say("Rounding"), "value": rounding()}], total=False)
    if out["tenant"] is None:
        names = sheet_names([r["tenant"] for r in out["tenants"]], book.sheetnames)
        for summary in out["tenants"]:
            lines = tenant_lines(out, summary["tenant"])
            _sheet(book, names[summary["tenant"]], LINES, [*lines, {"view": say("Total"), **summary}])
    book.save(into)


def _currency_rows() -> list[dict[str, Any]]:
    currency = money.current()
    if currency.code == "USD":
        return []
    return [{"item": words.say("Currency"), "value": currency_note()}]


def currency_note() -> str:
    """Which currency the amounts are in and at what rate ("" in the ledger's USD)."""
    currency = money.current()
    if currency.code == "USD":
        return ""
    return words.say("Amounts in {code}, converted from the ledger's {usd} at {rate} {code} per {usd} (the rate in "
                     "force on {day}).", code=currency.code, rate=f"{currency.per_usd:,}", day=currency.since,
                     usd="USD")


def rounding() -> str:
    """How the statement rounds, in the language spoken and the currency shown."""
    return words.say(money.ROUNDING_NOTE, unit=words.say(money.current().unit))


def tenant_lines(out: dict[str, Any], tenant: str) -> list[dict[str, Any]]:
    say = words.say
    return ([{"view": say("By model"), "for_month": out["month"], **r} for r in out["by_model"]
             if r["tenant"] == tenant]
            + [{"view": say("By cost centre"), "for_month": out["month"], **r} for r in out["by_cost_centre"]
               if r["tenant"] == tenant]
            + [{"view": say("Adjustment"), **r} for r in out["adjustments"] if r["tenant"] == tenant])


def _sum_row(rows: list[dict[str, Any]], label_field: str, label: str) -> dict[str, Any]:
    sums: dict[str, Any] = {label_field: label}
    for row in rows:
        for k, v in row.items():
            if isinstance(v, int | float) and not isinstance(v, bool) and k != "usd_per_hour":
                sums[k] = sums.get(k, 0) + v
    return {k: round(v, 9) if isinstance(v, float) else v for k, v in sums.items()}


def _sheet(book: Any, title: str, columns: list[Column], rows: list[dict[str, Any]], total: bool = True) -> None:
    """One view as a write-only sheet: a bold, frozen header row, numbers as numbers in their format, text as
    text (never a formula, whatever it starts with); the last row bold when it is the total."""
    from openpyxl.cell import WriteOnlyCell
    from openpyxl.cell.cell import ILLEGAL_CHARACTERS_RE
    from openpyxl.styles import Font
    from openpyxl.utils import get_column_letter

    sheet = book.create_sheet(title)
    sheet.freeze_panes = "A2"
    for col, (field, heading, _) in enumerate(columns, start=1):  # widths go before the rows in write-only mode
        width = max([len(words.say(heading)), *(len(str(row.get(field) or "")) for row in rows[:500])])
        sheet.column_dimensions[get_column_letter(col)].width = min(60, width + 2)
    bold = Font(bold=True)

    def text(value: str, strong: bool) -> Any:
        target = WriteOnlyCell(sheet, ILLEGAL_CHARACTERS_RE.sub("", value))
        target.data_type = "s"
        target.quotePrefix = value.startswith(FORMULA)
        if strong:
            target.font = bold
        return target

    sheet.append([text(words.say(heading), True) for _, heading, _ in columns])
    for r, row in enumerate(rows, start=1):
        strong = total and r == len(rows)
        values = []
        for field, _, kind in columns:
            value = row.get(field)
            if isinstance(value, str):
                values.append(text(value, strong))
            elif isinstance(value, int | float) and not isinstance(value, bool):
                money_kind = kind in ("usd", "rate")
                target = WriteOnlyCell(sheet, money.excel_value(value) if money_kind else value)
                target.number_format = money.excel_rate(value) if kind == "rate" else money.excel_amount() \
                    if kind == "usd" else NUMBER_FORMATS.get(kind, "General")
                if strong:
                    target.font = bold
                values.append(target)
            elif strong:
                target = WriteOnlyCell(sheet, value)
                target.font = bold
                values.append(target)
            else:
                values.append(value)
        sheet.append(values)


# -- the page -------------------------------------------------------------------------------------------------

def status_line(out: dict[str, Any]) -> str:
    if out["closed"]:
        return words.say("Closed {at} by {by}: this statement no longer changes.", at=out["closed_at"],
                         by=out["closed_by"])
    return words.say("Open: its figures may change until the month is closed.")


def _shown(field: str, kind: str, value: Any) -> str:
    if kind == "text":
        return escape(words.say(ABSENT[field]) if value is None and field in ABSENT else "-" if value is None
                      else str(value))
    if kind == "usd":
        return money.amount(value)
    if kind == "rate":
        return money.rate(value)
    if kind == "hours":
        return "-" if value is None else f"{value:.6f}"
    return "-" if value is None else str(value)


def _table(columns: list[Column], rows: list[dict[str, Any]], test_id: str, total: dict[str, Any] | None = None,
           empty: str = "None.") -> str:
    head = "".join(f'<th class="{kind}">{escape(words.say(heading))}</th>' for _, heading, kind in columns)
    body = "".join(f'<tr data-testid="{test_id}-row">'
                   + "".join(f'<td class="{kind}">{_shown(field, kind, row.get(field))}</td>'
                             for field, _, kind in columns) + "</tr>" for row in rows)
    if not rows:
        body = f'<tr><td colspan="{len(columns)}" class="muted">{escape(words.say(empty))}</td></tr>'
    if total is not None and rows:
        body += ('<tr class="total" data-testid="' + test_id + '-total">'
                 + "".join(f'<td class="{kind}">{_shown(field, kind, total.get(field))}</td>'
                           for field, _, kind in columns) + "</tr>")
    return f'<table data-testid="{test_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def to_html(out: dict[str, Any]) -> str:
    """The printable page, in the language spoken and the currency shown (gateway.finance.words, money)."""
    say = words.say
    month, tenant = out["month"], out["tenant"]
    query = f"month={month}" + (f"&tenant={urllib.parse.quote(tenant, safe='')}" if tenant else "")
    lang = f"&lang={words.lang()}"
    here = escape(f"/admin/statements?{query}&format=html")
    links = (f'<p class="noprint"><a href="/admin/statements?{query}&format=csv">CSV</a> · '
             f'<a href="/admin/statements?{query}&format=xlsx{lang}">{say("Excel workbook")}</a> · '
             f'<a href="/reports?month={month}{lang}">{say("Finance page")}</a> · '
             f'<span data-testid="lang-switch"><a href="{here}&amp;lang=en" lang="en">English</a> · '
             f'<a href="{here}&amp;lang=ko" lang="ko">한국어</a></span></p>')
    note = currency_note()
    converted = f'<p class="muted" data-testid="currency">{escape(note)}</p>' if note else ""
    status = (f'<p><span class="status{" closed" if out["closed"] else ""}" data-testid="status">'
              f'{escape(status_line(out))}</span></p>')
    rec = out["reconciliation"]
    tenants = [_tenant_section(out, r) for r in out["tenants"]]
    title = say("Statement {month} for {tenant}", month=month, tenant=tenant) if tenant else \
        say("Statement {month}", month=month)
    body = (f'<h1>{escape(title)}</h1>'
            f'<p class="muted" data-testid="period">{period_of(out)} (UTC)</p>'
            f'{status}{links}{converted}<p class="muted" data-testid="rounding">{escape(rounding())}</p>'
            f'<h2>{say("Summary by tenant")}</h2>'
            + _table(SUMMARY, out["tenants"], "summary", {"tenant": say("Total"), **out["total"]})
            + f'<h2>{say("Adjustments")}</h2><p class="muted">'
            + say("Records that reached a closed month after its close, carried here once.") + '</p>'
            + _table(ADJUSTMENTS, out["adjustments"], "adjustments", empty="No adjustments.")
            + "".join(tenants) + (_own_gpu() if rec is None else _fleet(out["idle"], rec)))
    return (f'<!doctype html><html lang="{words.lang()}"><head><meta charset="utf-8">'
            f'<title>Tollgate statement {escape(month)}{" " + escape(tenant) if tenant else ""}</title>'
            f'<meta name="viewport" content="width=device-width"><style>{STYLE}</style></head><body>{body}</body>'
            '</html>')


def _own_gpu() -> str:
    return f'<p class="muted" data-testid="own-gpu">{escape(words.say(OWN_GPU))}</p>'


def _fleet(idle: list[dict[str, Any]], rec: dict[str, Any]) -> str:
    """The workers' idle hours and the reconciliation: only the statement for every tenant shows them."""
    rows = (("workers_cost_usd", "Workers' hours at their rate (USD)"), ("attributed_usd", "Tenants' GPU cost (USD)"),
            ("idle_usd", "Idle GPU cost (USD)"), ("difference_usd", "Difference (USD)"))
    say = words.say
    return (f'<section class="fleet"><h2>{say("GPU idle by worker")}</h2><p class="muted">'
            + say("The workers' hours no request ran in: never spread over tenants.") + '</p>'
            + _table(IDLE, idle, "idle", _sum_row(idle, "worker", say("Total")), "No worker hours.")
            + f'<h2>{say("Reconciliation")}</h2><table data-testid="reconciliation"><tbody>'
            + "".join(f'<tr><td>{say(label)}</td><td data-testid="rec-{key}">{money.amount(rec[key])}</td></tr>'
                      for key, label in rows)
            + "</tbody></table></section>")


def period_of(out: dict[str, Any]) -> str:
    """The statement's month as its first and last day, inclusive: "2026-12-01 to 2026-12-31" (joined as the
    language spoken joins them)."""
    return words.period(datetime.fromisoformat(out["from"]), datetime.fromisoformat(out["to"]))


def _tenant_section(out: dict[str, Any], summary: dict[str, Any]) -> str:
    name = summary["tenant"]
    mine = closes.for_tenant(out, name)
    say = words.say
    return (f'<section class="tenant" data-testid="tenant-section"><h2>{escape(say("Tenant {name}", name=name))} · '
            f'{escape(out["month"])}</h2><p class="muted">{period_of(out)} (UTC). {escape(status_line(out))}</p>'
            + _table(SUMMARY, [summary], "tenant-summary")
            + f"<h3>{say('By model')}</h3>" + _table(BY_MODEL[1:], mine["by_model"], "tenant-model",
                                                     empty="No requests.")
            + f"<h3>{say('By cost centre')}</h3>" + _table(BY_TAG[1:], mine["by_cost_centre"], "tenant-tag",
                                                           empty="No requests.")
            + f"<h3>{say('Adjustments')}</h3>" + _table(ADJUSTMENTS[:1] + ADJUSTMENTS[2:], mine["adjustments"],
                                              "tenant-adjustments", empty="No adjustments.")
            + "</section>")
