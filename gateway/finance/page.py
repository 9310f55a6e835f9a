"""The finance page (GET /reports) as finance reads it: its period (``Range``: the last N days or a calendar
month, against the period before), its figures (``gather``) and its HTML (``draw``), with the pages for a period
it cannot show (``refused``), for a build already running (``busy``) and the sign-in form (``sign_in``); the
routes, the sign-in and the sessions are gateway.http.reports_page's.

For the last N days or a calendar month: a table of what each tenant used and spent (against its budget, and
against the period before; every tenant of the policy, with zeros for those without requests), spend by day and
tenant, top models, tokens per request p95, cost per 1,000 requests, cache savings, budget burn-down, recent
anomalies, and the GPU section (gateway.finance.gpu_page); a tenant's drill-down by model, key, day and cost
centre. Each table links its CSV, named for its period. Money is shown by gateway.finance.money: amounts to the
cent, rates to the significant digits they need, periods as their first and last day. Every figure comes from the
same store queries as /admin/reports/costs, so the page and the API agree.

Server-rendered HTML with SVG charts drawn here: no JavaScript, nothing fetched from a CDN, nothing to build.
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

from gateway.errors import InvalidRequest
from gateway.finance import gpu_costs, gpu_page, heavy, labels, money, words
from gateway.finance.reports import every_tenant, parse_month, sum_rows, with_rates
from gateway.ledger import centres
from gateway.ledger.stores import OPEN_END, LedgerStore
from gateway.ledger.times import period_start, sortable
from gateway.policy.loader import PolicySnapshot

MAX_DAYS = 366
DAYS = re.compile(r"[0-9]{1,4}")
# what a table shows for a group with no value: a request refused before a model was chosen, one without a key
ABSENT = {"model": "(refused before a model)", "key": "(no key)", "tag": "(untagged)", "worker": "(no worker)"}
# a drill-down's tables: (group_by, title, the row's field, its column's heading)
DRILLS = (("model", "By model", "model", "Model"), ("key", "By key", "key_id", "Key"), ("day", "By day", "day", "Day"),
          ("tag", "By cost centre (tags)", "tag", "Tags"))
COLORS = ("#3b6ea5", "#e07b39", "#4f9d69", "#b5485d", "#7d5ba6", "#c9a227", "#3a9ca6", "#8c6d46")
STYLE = """
body{font:14px/1.45 FONTS;margin:24px;color:#1d2330;background:#f7f8fa}svg text{font-family:FONTS}
h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px}
.cards{display:flex;gap:12px;flex-wrap:wrap}.card{background:#fff;border:1px solid #dde1e8;border-radius:6px;
padding:10px 14px;min-width:150px}.card b{display:block;font-size:20px}.muted{color:#667}
table{border-collapse:collapse;background:#fff}td,th{border:1px solid #dde1e8;padding:4px 8px;text-align:right}
th{background:#eef1f5}td:first-child,th:first-child{text-align:left}
.legend span{display:inline-block;margin-right:12px}.legend i{display:inline-block;width:10px;height:10px;
margin-right:4px}form.login{background:#fff;border:1px solid #dde1e8;padding:16px;max-width:360px}
form.range{display:inline-block;margin:8px 16px 8px 0}a.csv{font-size:12px;font-weight:normal;margin-left:8px}
h3{font-size:14px;margin:16px 0 6px}.problem{background:#fbeaec;border:1px solid #b5485d;padding:8px 12px;
max-width:760px}.lang{float:right}
""".replace("FONTS", words.FONTS)


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
        """The period in words, in the language spoken (gateway.finance.words)."""
        days = words.period(self.start, self.end)
        if self.month:
            return words.say("Calendar month {month}: {period} (UTC), against {before}", month=self.month,
                             period=days, before=self.before.strftime("%Y-%m"))
        return words.say("Last {days} days: {period} (UTC), against the {days} days before", days=self.days,
                         period=days)


def _next_month(day: datetime, step: int = 1) -> datetime:
    index = day.year * 12 + day.month - 1 + step
    return day.replace(year=index // 12, month=index % 12 + 1, day=1)


def draw(store: LedgerStore, snapshot: PolicySnapshot, shown: Range, tenant: str | None,
         live: list[dict[str, Any]], alerts: list[dict[str, Any]], keys: labels.Keys | None = None,
         lang: str = "en") -> heavy.Spool:
    """The page (blocking: on the report thread): its figures read and the HTML drawn, in ``lang`` and in the
    policy's currency at the rate in force on the period's first day. ``keys``: the runtime keys' names and
    budgets (gateway.finance.labels), read on the event loop."""
    body = heavy.Spool()
    data = gather(store, snapshot, shown, tenant, live, keys or {})
    with words.speaking(lang), money.shown_in(money.display_currency(snapshot.policy.finance, shown.start.date())):
        body.write(_dashboard(data, shown, alerts))
    return body


def gather(store: LedgerStore, snapshot: PolicySnapshot, shown: Range, tenant: str | None,
           live: list[dict[str, Any]], keys: labels.Keys | None = None) -> dict[str, Any]:
    """Every figure on the page, from the store (on a thread); ``live``: this process's open presence spans. A
    drill-down's cost centres are the tenant's centres.TOP largest and one line for the rest, as a statement
    shows them (its CSV lists each). The burn-down holds each tenant's budget and each key's own (a drill-down:
    that tenant's and its keys'), each spent over its own period so far."""
    keys = keys or {}
    now = time.time()
    start, end = sortable(shown.start), sortable(shown.end)
    by_day_tenant = store.totals(start, end, ["day", "tenant"], tenant)  # a drill-down's cards are its own
    by_tenant = [with_rates(r) for r in every_tenant(store.totals(start, end, ["tenant"], None),
                                                      snapshot.tenants)]
    before = {r["tenant"]: r["cost_usd"] or 0.0 for r in store.totals(sortable(shown.before), start, ["tenant"], None)}
    drill = {}
    if tenant:
        for group, *_ in DRILLS:
            rows = centres.Centres(store, start, end).totals(start, end, ["tenant", "tag"], tenant) \
                if group == "tag" else store.totals(start, end, [group], tenant)
            drill[group] = [with_rates(r) for r in rows]
    by_model = sorted((with_rates(r) for r in store.totals(start, end, ["model"], tenant)),
                      key=lambda r: -r["cost_usd"])
    total = with_rates(sum_rows(by_day_tenant))
    budgets = []
    for name, view in snapshot.tenants.items():
        if view.budget is None or (tenant is not None and name != tenant):
            continue
        rows = store.totals(period_start(view.budget.period, now), OPEN_END, [], name)
        spent = rows[0]["cost_usd"] if rows else 0.0
        budgets.append({"kind": "tenant", "who": name, "tenant": name, "period": view.budget.period,
                        "limit_usd": view.budget.limit_usd, "spent_usd": round(spent or 0.0, 9)})
    own = labels.budgeted(keys, tenant)
    for period in sorted({k.budget_period or "month" for k in own}):
        spent_by = {r["key_id"]: r["cost_usd"] or 0.0
                    for r in store.totals(period_start(period, now), OPEN_END, ["key"], tenant)}
        budgets += [{"kind": "key", "who": k.id, "tenant": k.tenant,
                     "period": period, "limit_usd": k.budget_usd, "spent_usd": round(spent_by.get(k.id, 0.0), 9)}
                    for k in own if (k.budget_period or "month") == period]
    gpu = gpu_costs.gather(store, snapshot.policy, shown.start.timestamp(), min(now, shown.end.timestamp()),
                           ["tenant", "tier"], live, tenant is None)  # the cheapest configuration is the fleet's
    return {"gpu": gpu, "tenants": sorted(snapshot.tenants), "from": start, "to": end,
            "by_day_tenant": by_day_tenant, "by_model": by_model, "total": total,
            "tokens_p95": store.tokens_percentile(start, end, 95, tenant), "budgets": budgets, "by_tenant": by_tenant,
            "before": before, "drill": drill, "tenant": tenant, "keys": keys}


def _controls(shown: Range, tenant: str | None) -> str:
    """The range picker: the last N days, or one of the last 13 calendar months (a plain GET form)."""
    this_month = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    months = [_next_month(this_month, -i).strftime("%Y-%m") for i in range(13)]
    options = "".join(f'<option value="{m}"{" selected" if m == shown.month else ""}>{m}</option>' for m in months)
    keep = f'<input type="hidden" name="tenant" value="{escape(tenant)}">' if tenant else ""
    keep += f'<input type="hidden" name="lang" value="{words.lang()}">'
    say = words.say
    return (f'<form method="get" action="/reports" class="range">{keep}<label>{say("Last")} <input type="number" '
            f'name="days" min="1" max="{MAX_DAYS}" required value="{shown.days if not shown.month else ""}" '
            f'style="width:5em" data-testid="days"> '
            f'{say("days")}</label> <button type="submit" data-testid="show-days">{say("Show")}</button></form>'
            f'<form method="get" action="/reports" class="range">{keep}<label>{say("Month")} <select name="month" '
            f'data-testid="month">{options}</select></label> <button type="submit" data-testid="show-month">'
            f'{say("Show")}</button></form>')


def _switch(shown: Range, tenant: str | None) -> str:
    """The language switch: this page in English and in Korean."""
    here = f"/reports?{shown.query}" + (f"&tenant={urllib.parse.quote(tenant)}" if tenant else "")
    return ('<p class="lang" data-testid="lang-switch">'
            + " · ".join(f'<a href="{escape(here)}&amp;lang={code}" lang="{code}" data-testid="lang-{code}">{name}</a>'
                         for code, name in (("en", "English"), ("ko", "한국어"))) + "</p>")


def _label(group: str, value: Any) -> str:
    """A group's value as a table shows it: a readable word for none (the CSV leaves that cell empty)."""
    return words.say(ABSENT[group]) if value is None and group in ABSENT else "-" if value is None else str(value)


def _usd(value: Any) -> str:
    """An amount as the page shows it; an alert's field that is not a number, as text."""
    return money.amount(value) if isinstance(value, int | float) and not isinstance(value, bool) else str(value)


def _change(now: float, before: float | None) -> str:
    if not before:
        return words.say("new") if now else "-"
    return f"{(now - before) / before * 100:+.1f}%"


def _tenant_table(data: dict[str, Any], shown: Range) -> str:
    budgets = {b["tenant"]: b for b in data["budgets"] if b["kind"] == "tenant"}
    rows = []
    for r in sorted(data["by_tenant"], key=lambda r: (-r["cost_usd"], str(r["tenant"]))):
        name = str(r["tenant"])
        budget = budgets.get(name)
        limit = f'{money.amount(budget["limit_usd"])} / {words.say(budget["period"])}' if budget else "-"
        share = f'{budget["spent_usd"] / budget["limit_usd"] * 100:.1f}%' if budget and budget["limit_usd"] else "-"
        link = f'/reports?{shown.query}&tenant={urllib.parse.quote(name)}&lang={words.lang()}'
        rows.append(f'<tr data-testid="tenant-row"><td><a href="{escape(link)}">{escape(name)}</a></td>'
                    f'<td>{r["requests"]}</td><td>{r["prompt_tokens"] or 0}</td><td>{r["completion_tokens"] or 0}</td>'
                    f'<td>{r["cached_tokens"] or 0}</td>'
                    f'<td data-testid="tenant-cost">{money.amount(r["cost_usd"])}</td>'
                    f'<td>{limit}</td><td>{share}</td>'
                    f'<td>{_change(r["cost_usd"], data["before"].get(r["tenant"]))}</td></tr>')
    csv = f"/admin/reports/costs?format=csv&group_by=tenant&{shown.csv}"
    say = words.say
    empty = f'<p class="muted" data-testid="tenant-empty">{say("No requests in this range.")}</p>' \
        if not data["total"]["requests"] else ""
    heads = "".join(f"<th>{say(h)}</th>" for h in (
        "Tenant", "Requests", "Input tokens", "Output tokens", "Cached tokens", "Spend (USD)", "Budget (USD)",
        "Budget used (its period)", "Change vs the period before"))
    return (f'<h2>{say("Spend by tenant")} <a class="csv" href="{csv}" data-testid="tenant-csv">CSV</a></h2>'
            f'<table data-testid="tenant-table"><tr>{heads}</tr>'
            + ("".join(rows) or f'<tr><td colspan="9">{say("The policy names no tenant.")}</td></tr>')
            + f"</table>{empty}")


def _drill_down(data: dict[str, Any], shown: Range) -> str:
    tenant = data["tenant"]
    say = words.say
    parts = [f'<h2 data-testid="drill-title">{escape(say("Tenant {name}", name=tenant))}</h2>'
             f'<p><a href="/reports?{shown.query}&amp;lang={words.lang()}">{say("All tenants")}</a></p>']
    for group, title, key, heading in DRILLS:
        csv = (f"/admin/reports/costs?format=csv&group_by={group}&tenant={urllib.parse.quote(tenant, safe='')}"
               f"&{shown.csv}")
        rows = "".join(f'<tr data-testid="drill-{group}"><td>{escape(_drilled(group, r[key], data["keys"]))}</td>'
                       f'<td>{r["requests"]}</td><td>{r["prompt_tokens"] or 0}</td>'
                       f'<td>{r["completion_tokens"] or 0}</td><td>{money.amount(r["cost_usd"])}</td></tr>'
                       for r in data["drill"][group])
        heads = "".join(f"<th>{say(h)}</th>" for h in (heading, "Requests", "Input tokens", "Output tokens",
                                                        "Spend (USD)"))
        parts.append(f'<h3>{say(title)} <a class="csv" href="{escape(csv)}" data-testid="drill-{group}-csv">CSV</a>'
                     f'</h3><table data-testid="drill-{group}-table"><tr>{heads}</tr>'
                     f'{rows or "<tr><td colspan=5>" + say("None.") + "</td></tr>"}</table>')
        if group == "key" and any(r[key] == labels.AUDIT_KEY for r in data["drill"][group]):
            parts.append(f'<p class="muted" data-testid="audit-key-note">{say(labels.AUDIT_NAME)} '
                         f'({labels.AUDIT_KEY}): {escape(say(labels.AUDIT_WHY))}.</p>')
    return "".join(parts)


def _drilled(group: str, value: Any, keys: labels.Keys) -> str:
    """A drill-down row's label: a key by its name with its id beside it, else as ``_label``."""
    return labels.name_of(value, keys) if group == "key" else _label(group, value)


def _dashboard(data: dict[str, Any], shown: Range, alerts: list[dict[str, Any]]) -> str:
    total = data["total"]
    p95 = data["tokens_p95"]
    say = words.say
    cards = "".join(f'<div class="card"><span class="muted">{say(label)}</span><b data-testid="{tid}">{value}</b>'
                    '</div>'
                    for label, tid, value in (
                        ("Spend (USD)", "total-cost", money.amount(total["cost_usd"])),
                        ("Requests", "total-requests", f"{total['requests']}"),
                        ("Cost per 1,000 requests", "cost-per-1k", money.rate(total["cost_per_1k_requests_usd"])),
                        ("Tokens per request p95", "tokens-p95", "-" if p95 is None else str(p95)),
                        ("Cache hits", "cache-hits", f"{total['cache_hits']}"),
                        ("Tokens saved by the cache", "cache-saved", f"{total['cache_saved_tokens']}")))
    models = "".join(
        f'<tr data-testid="model-row"><td>{escape(_label("model", r["model"]))}</td><td>{r["requests"]}</td>'
        f'<td>{r["prompt_tokens"]}</td><td>{r["completion_tokens"]}</td><td>{money.amount(r["cost_usd"])}</td>'
        f'<td>{money.rate(r["cost_per_1k_requests_usd"])}</td></tr>' for r in data["by_model"][:10])
    budgets = "".join(
        f'<tr data-testid="budget-row"><td>{escape(_who(b, data["keys"]))}</td><td>{say(b["period"])}</td>'
        f'<td>{money.amount(b["spent_usd"])}</td><td>{money.amount(b["limit_usd"])}</td>'
        f'<td>{_bar(b["spent_usd"] / b["limit_usd"] if b["limit_usd"] else 0)}</td></tr>' for b in data["budgets"])
    anomaly_rows = "".join(
        f'<tr data-testid="anomaly-row"><td>{escape(str(a.get("time")))}</td><td>{escape(str(a.get("kind")))}</td>'
        f'<td>{escape(str(a.get("action")))}</td><td>{escape(str(a.get("tenant", "")))}</td>'
        f'<td>{escape(_usd(a.get("worst_case_usd", a.get("hour_usd", a.get("spent_usd", "")))))}</td></tr>'
        for a in alerts)
    detail = _drill_down(data, shown) if data["tenant"] else _tenant_table(data, shown)
    def heads(*names: str) -> str:
        return "".join(f"<th>{say(n)}</th>" for n in names)

    body = f"""
{_switch(shown, data["tenant"])}<h1>{say("Tollgate costs")}</h1>
<p class="muted" data-testid="range">{escape(shown.describe())}.
<a href="/admin/reports/costs?format=csv&group_by=day,tenant,model&{shown.csv}">{say(
    "Download CSV by day, tenant and model")}</a> · <a href="/admin/ledger?format=csv&{shown.csv}">{say(
    "Download every record (CSV)")}</a></p>{_converted(shown)}
{_statements(shown, data["tenant"])}
{_controls(shown, data["tenant"])}
<form method="post" action="/reports/logout"><button>{say("Sign out")}</button></form>
<div class="cards">{cards}</div>
{detail}
{gpu_page.section(data["gpu"], shown.csv, data["tenant"], data["tenants"])}
<h2>{say("Daily spend by tenant (USD)")}</h2>{_daily_chart(data['by_day_tenant'])}
<h2>{say("Top models")}</h2>
<table><tr>{heads("Model", "Requests", "Prompt tokens", "Completion tokens", "Cost (USD)", "Per 1,000 requests")}
</tr>{models or '<tr><td colspan="6">' + say("No requests yet.") + '</td></tr>'}</table>
<h2>{say("Budget burn-down (this period)")}</h2>
<table><tr>{heads("Tenant or key", "Period", "Spent (USD)", "Limit (USD)", "Used")}</tr>
{budgets or '<tr><td colspan="5">' + say("No tenant or key has a budget.") + '</td></tr>'}</table>
<h2>{say("Recent anomalies and alerts")}</h2>
<table><tr>{heads("Time", "Kind", "Action", "Tenant", "USD")}</tr>
{anomaly_rows or '<tr><td colspan="5">' + say("None.") + '</td></tr>'}</table>"""
    return page_html(say("Tollgate costs"), body)


def _who(budget: dict[str, Any], keys: labels.Keys) -> str:
    """A burn-down row's owner: the tenant, or the key by its name and of which tenant."""
    if budget["kind"] == "tenant":
        return words.say("Tenant {name}", name=budget["tenant"])
    return words.say("Key {name} of {tenant}", name=labels.name_of(budget["who"], keys), tenant=budget["tenant"])


def _converted(shown: Range) -> str:
    """Which currency the amounts are in, and at what rate, when it is not the ledger's USD."""
    currency = money.current()
    if currency.code == "USD":
        return ""
    return ('<p class="muted" data-testid="currency">' + escape(words.say(
        "Amounts in {code}, converted from the ledger's {usd} at {rate} {code} per {usd} (the rate in force on {day}).",
        code=currency.code, rate=f"{currency.per_usd:,}", day=currency.since, usd="USD")) + "</p>")


def _statements(shown: Range, tenant: str | None) -> str:
    """Links to a month's statements (the month shown, else this month, as the month selector and the
    statement's own default): the printable page, its CSV and the workbook; a closed month's never change
    (POST /admin/statements/close, admin)."""
    month = shown.month or datetime.now(UTC).strftime("%Y-%m")
    query = f"month={month}" + (f"&tenant={urllib.parse.quote(tenant)}" if tenant else "")
    lang = "" if words.lang() == "en" else f"&lang={words.lang()}"
    links = " · ".join(f'<a href="/admin/statements?{escape(query)}&format={fmt}{lang if fmt != "csv" else ""}" '
                       f'data-testid="statement-{fmt}">{words.say(label)}</a>'
                       for fmt, label in (("html", "printable"), ("csv", "CSV"), ("xlsx", "Excel")))
    whose = words.say("tenant {name}", name=tenant) if tenant else words.say("every tenant")
    return (f'<p class="muted" data-testid="statements">'
            f'{escape(words.say("Statements for {month}, {whose}:", month=month, whose=whose))} {links}</p>')


def busy(shown: Range, tenant: str | None) -> str:
    """The page while another statement or report is being built in this process (one at a time)."""
    again = f"/reports?{shown.query}" + (f"&tenant={urllib.parse.quote(tenant)}" if tenant else "")
    say = words.say
    body = (f'<h1>{say("Tollgate costs")}</h1><div class="problem" role="alert" data-testid="busy"><b>'
            f'{say("Another statement or report is being built in this gateway.")}</b> '
            f'{say("Its figures are read one build at a time;")} <a href="{escape(again)}">{say("try again")}</a> '
            f'{say("in {seconds} seconds.", seconds=heavy.RETRY_AFTER_S)}</div>')
    return page_html(say("Tollgate costs: busy"), body)


def refused(problems: list[str], shown: Range, tenant: str | None) -> str:
    """The page for parameters it cannot honour: what was wrong and what is accepted, above the form to put it
    right (no figures: they would be for a period or tenant other than the one asked for)."""
    listed = "".join(f"<li>{escape(problem)}</li>" for problem in problems)
    say = words.say
    body = (f'<h1>{say("Tollgate costs")}</h1><div class="problem" role="alert" data-testid="problem"><b>'
            f'{say("This page cannot show that.")}</b><ul>{listed}</ul><a href="/reports">'
            f'{say("Show the last 30 days of every tenant")}</a></div>'
            f'{_controls(shown, tenant)}<form method="post" action="/reports/logout"><button>{say("Sign out")}'
            '</button></form>')
    return page_html(say("Tollgate costs: check the period"), body)


def _daily_chart(rows: list[dict[str, Any]], width: int = 760, height: int = 220) -> str:
    """Stacked bars: one per day, one colour per tenant."""
    if not rows:
        return f'<p class="muted">{words.say("No spend in this range.")}</p>'
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
                        f'{escape(tenant)}: {money.amount(value)} {money.current().code}</title></rect>')
        if len(days) <= 31:
            bars.append(f'<text x="{50 + i * slot + slot / 2:.1f}" y="{height - 5}" font-size="10" '
                        f'text-anchor="middle">{day[5:]}</text>')
    axis = (f'<text x="4" y="16" font-size="10">{money.amount(peak)} {money.current().code}</text>'
            f'<line x1="48" y1="{height - 20}" x2="{width}" y2="{height - 20}" stroke="#999"/>')
    legend = "".join(f'<span><i style="background:{COLORS[j % len(COLORS)]}"></i>{escape(t)}</span>'
                     for j, t in enumerate(tenants))
    return (f'<svg data-testid="daily-chart" width="{width}" height="{height}" role="img" '
            f'aria-label="{words.say("Daily spend by tenant")}">{axis}{"".join(bars)}</svg>'
            f'<div class="legend">{legend}</div>')


def _bar(share: float) -> str:
    used = max(0.0, min(share, 1.0))
    colour = "#b5485d" if share >= 1 else "#e07b39" if share >= 0.8 else "#4f9d69"
    return (f'<svg width="160" height="12"><rect width="160" height="12" fill="#eef1f5"/>'
            f'<rect width="{160 * used:.1f}" height="12" fill="{colour}"/></svg> {share * 100:.1f}%')


def sign_in(message: str = "", sso: bool = False) -> str:
    """The sign-in form (the finance or admin token; single sign-on first when ``sso``), with ``message`` above it
    when there is one."""
    say = words.say
    note = f'<p style="color:#b5485d">{escape(say(message))}</p>' if message else ""
    link = (f'<p><a data-testid="sso" href="/auth/sso/login?next=/reports">{say("Sign in with single sign-on")}'
            '</a></p>') if sso else ""
    body = (f'<h1>{say("Tollgate costs")}</h1>{note}{link}<form class="login" method="post" action="/reports/login">'
            f'<label>{say("Finance or admin token")}<br><input type="password" name="token" autocomplete="off" '
            f'style="width:100%"></label><p><button type="submit">{say("Sign in")}</button></p></form>')
    return page_html(say("Tollgate costs: sign in"), body)


def page_html(title: str, body: str) -> str:
    return (f'<!doctype html><html lang="{words.lang()}"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f'<meta name="viewport" content="width=device-width"><style>{STYLE}</style></head><body>{body}</body>'
            '</html>')
