"""The finance page (GET /reports): for the last N days or a calendar month (``?days=`` | ``?month=YYYY-MM``), a
table of what each tenant used and spent (against its budget, and against the period before; every tenant of
the policy, with zeros for those without requests), spend by day and tenant, top models, tokens per request
p95, cost per 1,000 requests, cache savings, budget burn-down and recent anomalies; ``?tenant=`` drills into one
tenant (its own cards and p95) by model, key, day and cost centre. Each table has its CSV, named for its period.

A parameter the page cannot honour (days outside 1-366 or not a number, a month not YYYY-MM, both days and a
month, a tenant neither the policy nor the ledger knows) is answered 400 with the page's form and a message
saying what was wrong and what is accepted, never replaced by another period or tenant: finance must not close
a month on figures for a period it did not ask for. Money is shown as plain decimals (``reports.plain``).

Server-rendered HTML with SVG charts drawn here: no JavaScript, nothing fetched from a CDN, nothing to build.
Sign-in takes the finance or admin token once and keeps it in an HttpOnly, SameSite=Strict cookie, which the
report API also accepts, so the CSV links work from the page. Every figure comes from the same store queries
as /admin/reports/costs, so the page and the API agree.
"""

from __future__ import annotations

import re
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from html import escape
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from gateway.auth import is_admin
from gateway.errors import InvalidRequest, NotPermitted
from gateway.http import gpu_page
from gateway.http.asgi import read_body, request_headers
from gateway.http.guards import gateway_of, holds_report_token, reads_reports, sessions_of
from gateway.http.reports import every_tenant, parse_month, parse_tenant, query, sum_rows, with_rates
from gateway.http.sessions import COOKIE, over_tls, same_origin
from gateway.ledger.prices import plain
from gateway.ledger.stores import OPEN_END, LedgerStore
from gateway.ledger.times import period_start, sortable
from gateway.ops import gpu_costs
from gateway.runtime import Gateway
from gateway.spend.alerts import public

LOGIN_BYTES = 4096
MAX_DAYS = 366
DAYS = re.compile(r"[0-9]{1,4}")
# what a table shows for a group with no value: a request refused before a model was chosen, one without a key
ABSENT = {"model": "(refused before a model)", "key": "(no key)", "tag": "(untagged)", "worker": "(no worker)"}
# a drill-down's tables: (group_by, title, the row's field, its column's heading)
DRILLS = (("model", "By model", "model", "Model"), ("key", "By key", "key_id", "Key"), ("day", "By day", "day", "Day"),
          ("tag", "By cost centre (tags)", "tag", "Tags"))
COLORS = ("#3b6ea5", "#e07b39", "#4f9d69", "#b5485d", "#7d5ba6", "#c9a227", "#3a9ca6", "#8c6d46")
STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1d2330;background:#f7f8fa}
h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px}
.cards{display:flex;gap:12px;flex-wrap:wrap}.card{background:#fff;border:1px solid #dde1e8;border-radius:6px;
padding:10px 14px;min-width:150px}.card b{display:block;font-size:20px}.muted{color:#667}
table{border-collapse:collapse;background:#fff}td,th{border:1px solid #dde1e8;padding:4px 8px;text-align:right}
th{background:#eef1f5}td:first-child,th:first-child{text-align:left}
.legend span{display:inline-block;margin-right:12px}.legend i{display:inline-block;width:10px;height:10px;
margin-right:4px}form.login{background:#fff;border:1px solid #dde1e8;padding:16px;max-width:360px}
form.range{display:inline-block;margin:8px 16px 8px 0}a.csv{font-size:12px;font-weight:normal;margin-left:8px}
h3{font-size:14px;margin:16px 0 6px}.problem{background:#fbeaec;border:1px solid #b5485d;padding:8px 12px;
max-width:760px}
"""


async def page(request: Request) -> Response:
    gw = gateway_of(request)
    if not await reads_reports(request, gw.store.current):
        return _login()
    if gw.ledger is None:
        return HTMLResponse(_html("Tollgate costs", "<p>The ledger is not enabled: start the gateway with a "
                                  "data directory.</p>"), 409)
    problems: list[str] = []
    try:
        shown = Range.of(request.query_params, time.time())
    except InvalidRequest as exc:
        shown, problems = Range.of({}, time.time()), [exc.message]
    try:
        tenant = await parse_tenant(request, gw.ledger.store)
    except InvalidRequest as exc:
        tenant = None
        problems.append(exc.message)
    if problems:
        return HTMLResponse(_refused(problems, shown, tenant), 400)
    live = gw.presence.live(time.time()) if gw.presence is not None else []
    data = await query(_gather, gw.ledger.store, gw, shown, tenant, live)
    return HTMLResponse(_dashboard(data, shown, [public(a) for a in gw.alerts.recent[-20:][::-1]]))


async def login(request: Request) -> Response:
    """Trade the finance or admin token for a session. The form is read from at most LOGIN_BYTES (no one signs
    in with more), and a POST from another site's page is refused."""
    if not same_origin(request):
        raise NotPermitted("Sign in from this gateway's own page.", "cross_origin")
    raw = await read_body(request.receive, request_headers(request.scope), LOGIN_BYTES)
    try:
        form = urllib.parse.parse_qs(raw.decode("latin-1"), max_num_fields=4)
    except ValueError:
        raise InvalidRequest("The sign-in form has too many fields.", "invalid_form") from None
    token = (form.get("token") or [""])[0]
    snapshot = gateway_of(request).store.current
    authorization = b"Bearer " + token.encode("latin-1", "replace")
    role = "admin" if is_admin(authorization, snapshot) else "finance" if holds_report_token(
        authorization, snapshot) else None
    if role is None:
        return _login("That token does not open the reports.", 401)
    response = RedirectResponse("/reports", 303)
    policy = snapshot.policy.server
    response.set_cookie(COOKIE, sessions_of(request).issue(snapshot, role), max_age=int(policy.session_s),
                        httponly=True, samesite="strict", path="/",
                        secure=over_tls(request, policy.trusted_proxies))  # type: ignore[arg-type]
    return response


async def logout(request: Request) -> Response:
    """End the caller's session; a cookie that holds none (forged, expired) is only cleared."""
    if not same_origin(request):
        raise NotPermitted("Sign out from this gateway's own page.", "cross_origin")
    await sessions_of(request).revoke(gateway_of(request).store.current, request.cookies.get(COOKIE))
    response = RedirectResponse("/reports", 303)
    response.delete_cookie(COOKIE, path="/")
    return response


ROUTES = [Route("/reports", page, methods=["GET"]), Route("/reports/login", login, methods=["POST"]),
          Route("/reports/logout", logout, methods=["POST"])]


@dataclass(frozen=True, slots=True)
class Range:
    """The period a page shows, [start, end) in UTC days, and the one of the same length just before it."""

    start: datetime
    end: datetime
    before: datetime
    month: str | None = None  # "2026-11" when a calendar month is shown
    days: int = 30

    @classmethod
    def of(cls, query: Mapping[str, str], now: float) -> Range:
        """The period ``days`` or ``month`` asks for (the last 30 days when neither does); InvalidRequest, with
        what is accepted, for anything else."""
        today = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        month, days = query.get("month", ""), query.get("days", "")
        if month and days:
            raise InvalidRequest(f"Give days or month, not both (days={days[:40]}, month={month[:40]}).",
                                 "invalid_range", param="days")
        if month:
            start, end = parse_month(month)
            return cls(start, end, _next_month(start, -1), month, (end - start).days)
        if days and not (DAYS.fullmatch(days) and 1 <= int(days) <= MAX_DAYS):
            raise InvalidRequest(f"days takes a whole number of days from 1 to {MAX_DAYS}, not '{days[:40]}'.",
                                 "invalid_days", param="days")
        n = int(days or 30)
        end = today + timedelta(days=1)
        return cls(end - timedelta(days=n), end, end - timedelta(days=2 * n), None, n)

    @property
    def query(self) -> str:
        """The page's own query for this range (kept by its links)."""
        return f"month={self.month}" if self.month else f"days={self.days}"

    @property
    def csv(self) -> str:
        """The report API's range for this period (a month as itself, so its downloads are named for it; else
        from and an inclusive to)."""
        if self.month:
            return f"month={self.month}"
        return f"from={self.start.date()}&to={(self.end - timedelta(days=1)).date()}"

    def describe(self) -> str:
        last = (self.end - timedelta(days=1)).date()
        if self.month:
            return (f"Calendar month {self.month}: {self.start.date()} to {last} (UTC), against "
                    f"{self.before.strftime('%Y-%m')}")
        return f"Last {self.days} days: {self.start.date()} to {last} (UTC), against the {self.days} days before"


def _next_month(day: datetime, step: int = 1) -> datetime:
    index = day.year * 12 + day.month - 1 + step
    return day.replace(year=index // 12, month=index % 12 + 1, day=1)


def _gather(store: LedgerStore, gw: Gateway, shown: Range, tenant: str | None,
            live: list[dict[str, Any]]) -> dict[str, Any]:
    """Every figure on the page, from the store (on a thread); ``live``: this process's open presence spans."""
    now = time.time()
    start, end = sortable(shown.start), sortable(shown.end)
    by_day_tenant = store.totals(start, end, ["day", "tenant"], tenant)  # a drill-down's cards are its own
    by_tenant = [with_rates(r) for r in every_tenant(store.totals(start, end, ["tenant"], None),
                                                      gw.store.current.tenants)]
    before = {r["tenant"]: r["cost_usd"] or 0.0 for r in store.totals(sortable(shown.before), start, ["tenant"], None)}
    drill = {group: [with_rates(r) for r in store.totals(start, end, [group], tenant)]
             for group, *_ in DRILLS} if tenant else {}
    by_model = sorted((with_rates(r) for r in store.totals(start, end, ["model"], tenant)),
                      key=lambda r: -r["cost_usd"])
    total = with_rates(sum_rows(by_day_tenant))
    budgets = []
    for name, view in gw.store.current.tenants.items():
        if view.budget is None:
            continue
        rows = store.totals(period_start(view.budget.period, now), OPEN_END, [], name)
        spent = rows[0]["cost_usd"] if rows else 0.0
        budgets.append({"tenant": name, "period": view.budget.period, "limit_usd": view.budget.limit_usd,
                        "spent_usd": round(spent or 0.0, 9)})
    gpu = gpu_costs.gather(store, gw.store.current.policy, shown.start.timestamp(),
                           min(now, shown.end.timestamp()), ["tenant", "tier"], live)
    return {"gpu": gpu, "tenants": sorted(gw.store.current.tenants), "from": start, "to": end,
            "by_day_tenant": by_day_tenant, "by_model": by_model, "total": total,
            "tokens_p95": store.tokens_percentile(start, end, 95, tenant), "budgets": budgets, "by_tenant": by_tenant,
            "before": before, "drill": drill, "tenant": tenant}


def _controls(shown: Range, tenant: str | None) -> str:
    """The range picker: the last N days, or one of the last 13 calendar months (a plain GET form)."""
    this_month = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    months = [_next_month(this_month, -i).strftime("%Y-%m") for i in range(13)]
    options = "".join(f'<option value="{m}"{" selected" if m == shown.month else ""}>{m}</option>' for m in months)
    keep = f'<input type="hidden" name="tenant" value="{escape(tenant)}">' if tenant else ""
    return (f'<form method="get" action="/reports" class="range">{keep}<label>Last <input type="number" '
            f'name="days" min="1" max="{MAX_DAYS}" required value="{shown.days if not shown.month else ""}" '
            f'style="width:5em" data-testid="days"> '
            f'days</label> <button type="submit" data-testid="show-days">Show</button></form>'
            f'<form method="get" action="/reports" class="range">{keep}<label>Month <select name="month" '
            f'data-testid="month">{options}</select></label> <button type="submit" data-testid="show-month">Show'
            f'</button></form>')


def _label(group: str, value: Any) -> str:
    """A group's value as a table shows it: a readable word for none (the CSV leaves that cell empty)."""
    return ABSENT.get(group, "-") if value is None else str(value)


def _usd(value: Any) -> str:
    """An amount as the page shows it; an alert's field that is not a number, as text."""
    return plain(value) if isinstance(value, int | float) and not isinstance(value, bool) else str(value)


def _change(now: float, before: float | None) -> str:
    if not before:
        return "new" if now else "-"
    return f"{(now - before) / before * 100:+.1f}%"


def _tenant_table(data: dict[str, Any], shown: Range) -> str:
    budgets = {b["tenant"]: b for b in data["budgets"]}
    rows = []
    for r in sorted(data["by_tenant"], key=lambda r: (-r["cost_usd"], str(r["tenant"]))):
        name = str(r["tenant"])
        budget = budgets.get(name)
        limit = f'{plain(budget["limit_usd"])} / {budget["period"]}' if budget else "-"
        share = f'{budget["spent_usd"] / budget["limit_usd"] * 100:.1f}%' if budget and budget["limit_usd"] else "-"
        link = f'/reports?{shown.query}&tenant={urllib.parse.quote(name)}'
        rows.append(f'<tr data-testid="tenant-row"><td><a href="{escape(link)}">{escape(name)}</a></td>'
                    f'<td>{r["requests"]}</td><td>{r["prompt_tokens"] or 0}</td><td>{r["completion_tokens"] or 0}</td>'
                    f'<td>{r["cached_tokens"] or 0}</td><td data-testid="tenant-cost">{plain(r["cost_usd"])}</td>'
                    f'<td>{limit}</td><td>{share}</td>'
                    f'<td>{_change(r["cost_usd"], data["before"].get(r["tenant"]))}</td></tr>')
    csv = f"/admin/reports/costs?format=csv&group_by=tenant&{shown.csv}"
    empty = '<p class="muted" data-testid="tenant-empty">No requests in this range.</p>' \
        if not data["total"]["requests"] else ""
    return (f'<h2>Spend by tenant <a class="csv" href="{csv}" data-testid="tenant-csv">CSV</a></h2>'
            '<table data-testid="tenant-table"><tr><th>Tenant</th><th>Requests</th><th>Input tokens</th>'
            '<th>Output tokens</th><th>Cached tokens</th><th>Spend (USD)</th><th>Budget (USD)</th>'
            '<th>Budget used (its period)</th><th>Change vs the period before</th></tr>'
            + ("".join(rows) or '<tr><td colspan="9">The policy names no tenant.</td></tr>') + f"</table>{empty}")


def _drill_down(data: dict[str, Any], shown: Range) -> str:
    tenant = data["tenant"]
    parts = [f'<h2 data-testid="drill-title">Tenant {escape(tenant)}</h2>'
             f'<p><a href="/reports?{shown.query}">All tenants</a></p>']
    for group, title, key, heading in DRILLS:
        csv = (f"/admin/reports/costs?format=csv&group_by={group}&tenant={urllib.parse.quote(tenant, safe='')}"
               f"&{shown.csv}")
        rows = "".join(f'<tr data-testid="drill-{group}"><td>{escape(_label(group, r[key]))}</td>'
                       f'<td>{r["requests"]}</td><td>{r["prompt_tokens"] or 0}</td>'
                       f'<td>{r["completion_tokens"] or 0}</td><td>{plain(r["cost_usd"])}</td></tr>'
                       for r in data["drill"][group])
        parts.append(f'<h3>{title} <a class="csv" href="{escape(csv)}" data-testid="drill-{group}-csv">CSV</a></h3>'
                     f'<table data-testid="drill-{group}-table"><tr><th>{heading}</th><th>Requests</th>'
                     '<th>Input tokens</th><th>Output tokens</th><th>Spend (USD)</th></tr>'
                     f'{rows or "<tr><td colspan=5>None.</td></tr>"}</table>')
    return "".join(parts)


def _dashboard(data: dict[str, Any], shown: Range, alerts: list[dict[str, Any]]) -> str:
    total = data["total"]
    p95 = data["tokens_p95"]
    cards = "".join(f'<div class="card"><span class="muted">{label}</span><b data-testid="{tid}">{value}</b></div>'
                    for label, tid, value in (
                        ("Spend (USD)", "total-cost", plain(total["cost_usd"])),
                        ("Requests", "total-requests", f"{total['requests']}"),
                        ("Cost per 1,000 requests", "cost-per-1k", plain(total["cost_per_1k_requests_usd"])),
                        ("Tokens per request p95", "tokens-p95", "-" if p95 is None else str(p95)),
                        ("Cache hits", "cache-hits", f"{total['cache_hits']}"),
                        ("Tokens saved by the cache", "cache-saved", f"{total['cache_saved_tokens']}")))
    models = "".join(
        f'<tr data-testid="model-row"><td>{escape(_label("model", r["model"]))}</td><td>{r["requests"]}</td>'
        f'<td>{r["prompt_tokens"]}</td><td>{r["completion_tokens"]}</td><td>{plain(r["cost_usd"])}</td>'
        f'<td>{plain(r["cost_per_1k_requests_usd"])}</td></tr>' for r in data["by_model"][:10])
    budgets = "".join(
        f'<tr data-testid="budget-row"><td>{escape(b["tenant"])}</td><td>{b["period"]}</td>'
        f'<td>{plain(b["spent_usd"])}</td><td>{plain(b["limit_usd"])}</td>'
        f'<td>{_bar(b["spent_usd"] / b["limit_usd"] if b["limit_usd"] else 0)}</td></tr>' for b in data["budgets"])
    anomaly_rows = "".join(
        f'<tr data-testid="anomaly-row"><td>{escape(str(a.get("time")))}</td><td>{escape(str(a.get("kind")))}</td>'
        f'<td>{escape(str(a.get("action")))}</td><td>{escape(str(a.get("tenant", "")))}</td>'
        f'<td>{escape(_usd(a.get("worst_case_usd", a.get("hour_usd", a.get("spent_usd", "")))))}</td></tr>'
        for a in alerts)
    detail = _drill_down(data, shown) if data["tenant"] else _tenant_table(data, shown)
    body = f"""
<h1>Tollgate costs</h1>
<p class="muted" data-testid="range">{escape(shown.describe())}.
<a href="/admin/reports/costs?format=csv&group_by=day,tenant,model&{shown.csv}">Download CSV by day,
tenant and model</a> · <a href="/admin/ledger?format=csv&{shown.csv}">Download every record (CSV)</a></p>
{_statements(shown, data["tenant"])}
{_controls(shown, data["tenant"])}
<form method="post" action="/reports/logout"><button>Sign out</button></form>
<div class="cards">{cards}</div>
{detail}
{gpu_page.section(data["gpu"], shown.csv, data["tenant"], data["tenants"])}
<h2>Daily spend by tenant (USD)</h2>{_daily_chart(data['by_day_tenant'])}
<h2>Top models</h2>
<table><tr><th>Model</th><th>Requests</th><th>Prompt tokens</th><th>Completion tokens</th><th>Cost (USD)</th>
<th>Per 1,000 requests</th></tr>{models or '<tr><td colspan="6">No requests yet.</td></tr>'}</table>
<h2>Budget burn-down (this period)</h2>
<table><tr><th>Tenant</th><th>Period</th><th>Spent (USD)</th><th>Limit (USD)</th><th>Used</th></tr>
{budgets or '<tr><td colspan="5">No tenant has a budget.</td></tr>'}</table>
<h2>Recent anomalies and alerts</h2>
<table><tr><th>Time</th><th>Kind</th><th>Action</th><th>Tenant</th><th>USD</th></tr>
{anomaly_rows or '<tr><td colspan="5">None.</td></tr>'}</table>"""
    return _html("Tollgate costs", body)


def _statements(shown: Range, tenant: str | None) -> str:
    """Links to the month's statements (this month's when a month is shown, else last month's): the printable
    page, its CSV and the workbook; a closed month's never change (POST /admin/statements/close, admin)."""
    month = shown.month or _next_month(datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0,
                                                                 microsecond=0), -1).strftime("%Y-%m")
    query = f"month={month}" + (f"&tenant={urllib.parse.quote(tenant)}" if tenant else "")
    links = " · ".join(f'<a href="/admin/statements?{escape(query)}&format={fmt}" data-testid="statement-{fmt}">'
                       f'{label}</a>' for fmt, label in (("html", "printable"), ("csv", "CSV"), ("xlsx", "Excel")))
    whose = f"tenant {escape(tenant)}" if tenant else "every tenant"
    return f'<p class="muted" data-testid="statements">Statements for {month}, {whose}: {links}</p>'


def _refused(problems: list[str], shown: Range, tenant: str | None) -> str:
    """The page for parameters it cannot honour: what was wrong and what is accepted, above the form to put it
    right (no figures: they would be for a period or tenant other than the one asked for)."""
    listed = "".join(f"<li>{escape(problem)}</li>" for problem in problems)
    body = (f'<h1>Tollgate costs</h1><div class="problem" role="alert" data-testid="problem"><b>This page cannot '
            f'show that.</b><ul>{listed}</ul><a href="/reports">Show the last 30 days of every tenant</a></div>'
            f'{_controls(shown, tenant)}<form method="post" action="/reports/logout"><button>Sign out</button>'
            '</form>')
    return _html("Tollgate costs: check the period", body)


def _daily_chart(rows: list[dict[str, Any]], width: int = 760, height: int = 220) -> str:
    """Stacked bars: one per day, one colour per tenant."""
    if not rows:
        return '<p class="muted">No spend in this range.</p>'
    days = sorted({r["day"] for r in rows})
    tenants = sorted({r["tenant"] for r in rows})
    cost = {(r["day"], r["tenant"]): r["cost_usd"] or 0.0 for r in rows}
    peak = max(sum(cost.get((d, t), 0.0) for t in tenants) for d in days) or 1.0
    slot = min((width - 60) / len(days), 48.0)
    bars = []
    for i, day in enumerate(days):
        y = height - 20.0
        for j, tenant in enumerate(tenants):
            value = cost.get((day, tenant), 0.0)
            h = value / peak * (height - 40)
            y -= h
            bars.append(f'<rect x="{50 + i * slot + slot * 0.1:.1f}" y="{y:.1f}" width="{slot * 0.8:.1f}" '
                        f'height="{h:.1f}" fill="{COLORS[j % len(COLORS)]}"><title>{escape(day)} '
                        f'{escape(tenant)}: ${plain(round(value, 9))}</title></rect>')
        if len(days) <= 31:
            bars.append(f'<text x="{50 + i * slot + slot / 2:.1f}" y="{height - 5}" font-size="10" '
                        f'text-anchor="middle">{day[5:]}</text>')
    axis = (f'<text x="4" y="16" font-size="10">${plain(round(peak, 9))}</text>'
            f'<line x1="48" y1="{height - 20}" x2="{width}" y2="{height - 20}" stroke="#999"/>')
    legend = "".join(f'<span><i style="background:{COLORS[j % len(COLORS)]}"></i>{escape(t)}</span>'
                     for j, t in enumerate(tenants))
    return (f'<svg data-testid="daily-chart" width="{width}" height="{height}" role="img" '
            f'aria-label="Daily spend by tenant">{axis}{"".join(bars)}</svg><div class="legend">{legend}</div>')


def _bar(share: float) -> str:
    used = max(0.0, min(share, 1.0))
    colour = "#b5485d" if share >= 1 else "#e07b39" if share >= 0.8 else "#4f9d69"
    return (f'<svg width="160" height="12"><rect width="160" height="12" fill="#eef1f5"/>'
            f'<rect width="{160 * used:.1f}" height="12" fill="{colour}"/></svg> {share * 100:.1f}%')


def _login(message: str = "", status: int = 200) -> HTMLResponse:
    note = f'<p style="color:#b5485d">{escape(message)}</p>' if message else ""
    body = (f'<h1>Tollgate costs</h1>{note}<form class="login" method="post" action="/reports/login">'
            '<label>Finance or admin token<br><input type="password" name="token" autocomplete="off" '
            'style="width:100%"></label><p><button type="submit">Sign in</button></p></form>')
    return HTMLResponse(_html("Tollgate costs: sign in", body), status)


def _html(title: str, body: str) -> str:
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f'<meta name="viewport" content="width=device-width"><style>{STYLE}</style></head><body>{body}</body>'
            '</html>')
