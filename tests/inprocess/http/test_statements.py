"""Statements and closes through the app in-process: every format (JSON, CSV, a workbook, a printable page),
their file names, text a spreadsheet would run as a formula neutralised, Excel's sheet-name rules, who may close,
and each parameter that cannot be honoured answered with a 400 (or a 409) naming it."""

from __future__ import annotations

import asyncio
import csv
import io
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import openpyxl
import pytest
from starlette.requests import Request

from gateway.errors import InvalidRequest
from gateway.finance.reports import cell
from gateway.finance.statements import sheet_names
from gateway.http.app import HotPaths, create_app
from gateway.http.statements import parse_statement
from gateway.ledger.stores import COLUMNS
from gateway.policy.loader import PolicySnapshot, PolicyStore
from gateway.policy.schema import Policy
from tests.conftest import ADMIN_TOKEN, DEMO_KEY, FINANCE_TOKEN, policy_dict

WORKER = "http://127.0.0.1:9"
EXPONENT = re.compile(r"\d[eE][-+]?\d")
EVIL = "=HYPERLINK(\"http://x\")"  # a tenant that left the policy, named to be a formula
STATEMENTS, CLOSE = "/admin/statements", "/admin/statements/close"


def record(n: int, tenant: str, time: str, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    return row | {"id": f"rec-{n:04d}", "request_id": f"req-{n}", "time": f"{time}.{n:06d}Z", "tenant": tenant,
                  "key_id": "key-abc", "tier": "standard", "service_class": "standard", "model": "sim-llama-8b",
                  "endpoint": "chat", "stream": False, "status": 200, "prompt_tokens": 10, "completion_tokens": 5,
                  "cached_tokens": 2, "estimated": False, "cost_usd": 0.000024, "worker": WORKER,
                  "worker_ms": 1000.0, "total_ms": 1000.0} | fields


def app(data_dir: Path) -> HotPaths:
    data_dir.mkdir(exist_ok=True)
    policy = Policy.model_validate(policy_dict([WORKER], gpu_usd_per_hour=3.6))
    made = create_app(PolicyStore(PolicySnapshot.build(policy, "test")), data_dir)
    assert made.gateway.ledger is not None
    made.gateway.ledger.store.insert([
        record(1, "demo", "2026-10-03T10:00:00", tags="project=search"),
        record(2, "demo", "2026-10-03T10:00:01", model=None, status=400, prompt_tokens=0, completion_tokens=0,
               cost_usd=0.0, worker=None),
        record(3, "prem", "2026-10-04T10:00:00", cost_usd=0.00001, tags="project=ads"),
        record(4, EVIL, "2026-10-05T10:00:00", cost_usd=0.5),
        record(5, "ac me/é:[x]", "2026-10-06T10:00:00", cost_usd=0.25),  # sheet-name characters
    ])
    return made


def ask(made: HotPaths, *asks: tuple[Any, ...], key: str | None = FINANCE_TOKEN,
        late: list[dict[str, Any]] | None = None, after: int = 1) -> list[httpx.Response]:
    """Each (method, path, params[, its own key]) in turn, in one run of the app; ``late`` records are inserted
    after the first ``after`` answers."""
    async def main() -> list[httpx.Response]:
        async with made.app.router.lifespan_context(made.app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=made), base_url="http://gateway") as client:  # type: ignore[arg-type]
            out = []
            for method, path, params, *own in asks:
                token = own[0] if own else key
                headers = {"authorization": f"Bearer {token}"} if token else {}
                out.append(await client.request(method, path, params=params, headers=headers))
                if late and len(out) == after:
                    assert made.gateway.ledger is not None
                    made.gateway.ledger.store.insert(late)
            return out
    return asyncio.run(main())


def get(key: str | None = FINANCE_TOKEN, **params: str) -> tuple[Any, ...]:
    return "GET", STATEMENTS, params, key


def this_month() -> str:
    return datetime.now(UTC).strftime("%Y-%m")


def test_the_statement_in_json_csv_and_a_page_lists_every_tenant(tmp_path: Path) -> None:
    out, table, page, one = ask(app(tmp_path), get(month="2026-10"), get(month="2026-10", format="csv"),
                                get(month="2026-10", format="html"), get(month="2026-10", tenant="demo",
                                                                         format="csv"))
    data = out.json()
    assert data["closed"] is False and data["closed_at"] is None and data["month"] == "2026-10"
    assert [r["tenant"] for r in data["tenants"]] == sorted(["bulk", "demo", "prem", EVIL, "ac me/é:[x]"])
    assert data["total"]["requests"] == 5 and data["total"]["cost_usd"] == pytest.approx(0.750034)
    (worker,) = data["idle"]  # there only while it ran: 4 s at $3.60/h, all of it the tenants'
    assert worker["worker"] == WORKER and worker["idle_cost_usd"] == 0 and worker["cost_usd"] == 0.004
    assert data["total"]["gpu_cost_usd"] == pytest.approx(0.004)
    assert [(r["model"], r["requests"]) for r in data["by_model"] if r["tenant"] == "demo"] == [
        (None, 1), ("sim-llama-8b", 1)]

    assert table.headers["content-disposition"] == 'attachment; filename="statement_2026-10_all.csv"'
    assert not EXPONENT.search(table.text), table.text
    rows = list(csv.DictReader(io.StringIO(table.text)))
    assert {r["section"] for r in rows} == {"tenant", "total", "model", "cost_centre", "idle",
                                             "reconciliation"}
    prem = next(r for r in rows if r["section"] == "tenant" and r["tenant"] == "prem")
    assert prem["cost_usd"] == "0.00001" and prem["month"] == "2026-10"
    assert [r["tag"] for r in rows if r["section"] == "cost_centre" and r["tenant"] == "demo"] == [
        "", "project=search"], "untagged is an empty cell"
    assert [r["model"] for r in rows if r["section"] == "model" and r["tenant"] == "demo"] == ["", "sim-llama-8b"]
    assert "None" not in table.text
    assert {r["tenant"] for r in rows if r["tenant"].startswith("'")} == {"'" + EVIL}, \
        "a cell that would be a formula is text"
    assert not any(r["tenant"].startswith(("=", "+", "-", "@")) for r in rows)

    assert one.headers["content-disposition"] == 'attachment; filename="statement_2026-10_demo.csv"'
    assert {r["tenant"] for r in csv.DictReader(io.StringIO(one.text)) if r["tenant"]} == {"demo"}

    html = page.text
    assert page.headers["content-type"].startswith("text/html")
    assert "@media print" in html and "break-before:page" in html and "<script" not in html.lower()
    assert not re.search(r"(src|href)=\"https?://", html), "nothing fetched from elsewhere"
    assert html.count('data-testid="tenant-section"') == 5
    assert "(refused before a model)" in html and "(untagged)" in html and "Open:" in html
    # the page shows amounts to the cent (gateway.finance.money): prem's $0.00001 is 0.00, never 1e-05, and the
    # statement says how its rounded lines relate to its totals
    assert not EXPONENT.search(re.sub(r"<style>.*?</style>", "", html, flags=re.S))
    assert "rounded to the cent from the ledger" in html and "0.00001" not in html
    assert EVIL.replace('"', "&quot;") in html, "escaped on the page"


def test_the_workbook_has_a_sheet_per_view_and_per_tenant_with_numbers_as_numbers(tmp_path: Path) -> None:
    out, book, one = ask(app(tmp_path), get(month="2026-10"), get(month="2026-10", format="xlsx"),
                         get(month="2026-10", format="xlsx", tenant="prem"))
    assert book.headers["content-disposition"] == 'attachment; filename="statement_2026-10_all.xlsx"'
    assert one.headers["content-disposition"] == 'attachment; filename="statement_2026-10_prem.xlsx"'
    wb = openpyxl.load_workbook(io.BytesIO(book.content))
    fixed = ["Summary by tenant", "By model", "By cost centre", "GPU idle by worker", "Adjustments", "Statement"]
    assert wb.sheetnames[:6] == fixed
    tenants = wb.sheetnames[6:]
    assert len(tenants) == 5 and "ac me_é__x_" in tenants and "demo" in tenants
    assert all(len(n) <= 31 and not re.search(r"[\[\]:*?/\\]", n) for n in wb.sheetnames)
    summary = wb["Summary by tenant"]
    assert summary.freeze_panes == "A2" and all(c.font.b for c in summary[1])
    heads = [c.value for c in summary[1]]
    rows = {r[0].value: r for r in summary.iter_rows(min_row=2)}
    spend = heads.index("List-price spend (USD)")
    total = rows["Total"]
    assert isinstance(total[spend].value, float)
    assert total[spend].value == pytest.approx(out.json()["total"]["cost_usd"])
    assert total[spend].number_format == "#,##0.00", "to the cent, as the page shows it (the header names USD)"
    assert total[1].value == 5 and total[1].number_format == "#,##0"
    assert all(c.font.b for c in total)
    evil = rows[EVIL][0]
    assert evil.data_type == "s" and evil.value == EVIL and evil.quotePrefix, "text, never a formula"
    items = {r[0].value: r[1].value for r in wb["Statement"].iter_rows(min_row=2)}
    assert items["Closed"].startswith("no") and items["Period (UTC)"] == "2026-10-01 to 2026-10-31"
    single = openpyxl.load_workbook(io.BytesIO(one.content))
    assert single.sheetnames == [n for n in fixed if n != "GPU idle by worker"], \
        "one tenant: no sheet per tenant, and nothing of the fleet's (its idle hours)"
    assert [r[0].value for r in single["Summary by tenant"].iter_rows(min_row=2)] == ["prem", "Total"]


def test_sheet_names_keep_excels_rules() -> None:
    names = sheet_names(["a" * 40, "a" * 40 + "b", "x/y", "X/Y", "'quoted'", "history", "Summary by tenant", "ok"],
                        ["Summary by tenant"])
    assert names["a" * 40] == "a" * 31 and names["a" * 40 + "b"] == "a" * 27 + " (2)"
    assert names["x/y"] == "x_y" and names["X/Y"] == "X_Y (2)", "unique regardless of case"
    assert names["'quoted'"] == "quoted" and names["history"] == "history (2)" and names["ok"] == "ok"
    assert names["Summary by tenant"] == "Summary by tenant (2)"
    assert all(len(n) <= 31 for n in names.values()) and len({n.casefold() for n in names.values()}) == len(names)


def test_a_csv_cell_that_would_be_a_formula_is_text() -> None:
    assert [cell(v) for v in ("=1+2", "+1", "-x", "@SUM(A1)", "\tx", "plain", 1.5e-05, None, -3)] == [
        "'=1+2", "'+1", "'-x", "'@SUM(A1)", "'\tx", "plain", "0.000015", "", -3]


def test_a_statement_asks_for_a_month_that_has_begun_in_one_of_its_formats() -> None:
    def asked(query: str) -> Request:
        return Request({"type": "http", "method": "GET", "path": "/admin/statements", "headers": [],
                        "query_string": query.encode()})
    now = datetime(2026, 11, 17, tzinfo=UTC).timestamp()
    assert parse_statement(asked("month=2026-11"), now) == ("2026-11", "json"), "a month under way states so far"
    assert parse_statement(asked("month=2026-10&format=xlsx"), now) == ("2026-10", "xlsx")
    assert parse_statement(asked(""), now) == ("2026-11", "json"), "no month: this one, so far"
    for query, param in (("month=2026-12", "month"), ("month=2026-10&format=pdf", "format"),
                         ("month=2026-10&to=2026-10-31", "to"), ("month=2026-1", "month")):
        with pytest.raises(InvalidRequest) as refused:
            parse_statement(asked(query), now)
        assert refused.value.param == param, query


def test_closing_takes_the_admin_token_and_a_month_that_has_ended_once_and_in_order(tmp_path: Path) -> None:
    late = [record(9, "demo", "2026-10-30T23:59:59", cost_usd=0.125, prompt_tokens=100, completion_tokens=7),
            record(10, "prem", "2026-11-02T09:00:00", cost_usd=0.01)]
    *refused, now, again, before, after, november, listed, early, current, page = ask(
        app(tmp_path), *(("POST", CLOSE, {"month": "2026-10"}, k) for k in (FINANCE_TOKEN, DEMO_KEY, None)),
        ("POST", CLOSE, {"month": "2026-10"}), ("POST", CLOSE, {"month": "2026-10"}), get(month="2026-10"),
        get(month="2026-10", format="csv"), get(month="2026-11"), ("GET", "/admin/statements/closes", {}),
        ("POST", CLOSE, {"month": "2026-09"}), ("POST", CLOSE, {"month": this_month()}),
        get(month="2026-11", format="html"), key=ADMIN_TOKEN, late=late, after=4)
    assert [r.status_code for r in refused] == [403, 403, 401]
    assert "admin token" in refused[0].json()["error"]["message"]
    closed = now.json()
    assert now.status_code == 200 and closed["closed"] is True and closed["closed_by"] == "admin"
    assert closed["total"]["requests"] == 5
    assert again.status_code == 409 and again.json()["error"]["code"] == "month_closed"
    assert before.json() == closed, "a late record does not change the closed statement"
    assert sum(1 for r in csv.DictReader(io.StringIO(after.text)) if r["section"] == "tenant") == 5
    (carried,) = november.json()["adjustments"]
    assert (carried["label"], carried["tenant"], carried["requests"], carried["cost_usd"]) == (
        "adjustment for 2026-10", "demo", 1, 0.125)
    demo = next(r for r in november.json()["tenants"] if r["tenant"] == "demo")
    assert demo["adjustments_usd"] == 0.125 and demo["billable_usd"] == 0.125
    assert [(c["month"], c["closed_by"]) for c in listed.json()["data"]] == [("2026-10", "admin")]
    assert early.status_code == 409 and early.json()["error"]["code"] == "close_out_of_order"
    assert current.status_code == 400 and current.json()["error"]["param"] == "month"
    assert "has not ended" in current.json()["error"]["message"]
    assert "adjustment for 2026-10" in page.text


def test_each_parameter_that_cannot_be_honoured_is_a_400_naming_it(tmp_path: Path) -> None:
    future = datetime.fromtimestamp(time.time() + 40 * 86400, UTC).strftime("%Y-%m")
    asks = [(get(month="2026-13"), "month", "YYYY-MM"), (get(month="abc"), "month", "YYYY-MM"),
            (get(month="2026-10-01"), "month", "YYYY-MM"), (get(month=future), "month", "has not begun"),
            (get(month="2026-10", **{"from": "2026-10-01"}), "from", "calendar month"),
            (get(month="2026-10", tenant="nobody"), "tenant", "bulk, demo, prem"),
            (get(month="2026-10", format="pdf"), "format", "json, html, csv, xlsx"),
            (("POST", CLOSE, {"month": "2026-13"}), "month", "YYYY-MM"),
            (("POST", CLOSE, {"month": future}), "month", "has not ended"),
            (("POST", CLOSE, {}), "month", "required")]
    replies = ask(app(tmp_path), *(a for a, _, _ in asks), get(month="2026-10", key=DEMO_KEY), key=ADMIN_TOKEN)
    for (ask_, param, says), reply in zip(asks, replies, strict=False):
        error = reply.json()["error"]
        assert reply.status_code == 400 and error["param"] == param and says in error["message"], (ask_, error)
        assert error["type"] == "invalid_request_error"
    assert replies[-1].status_code == 403, "a tenant's key reads its own usage, not statements"
