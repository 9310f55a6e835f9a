"""Monthly statements against a gateway process on simulated workers: the month's requests of two tenants as JSON,
a CSV pandas reads as typed numbers, a workbook openpyxl and pandas read (a sheet per view and per tenant,
numbers as numbers, totals as the JSON), the printable page in Chromium printed to PDF (each tenant on its own
page); and a past month closed, which a record arriving after the close does not change, the next month carrying
that record as an adjustment; replicas on one PostgreSQL ledger share the closed months."""

from __future__ import annotations

import io
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import httpx
import openpyxl
import pandas as pd
import pytest
from playwright.sync_api import sync_playwright

from gateway.finance import money
from gateway.finance.reports import parse_month
from gateway.ledger.stores import COLUMNS, PostgresLedger, SqliteLedger
from gateway.ledger.times import at
from tests.conftest import (
    ADMIN_TOKEN,
    DEMO_KEY,
    FINANCE_TOKEN,
    PREMIUM_KEY,
    Proc,
    on_shared_state,
    policy_dict,
    wait_for,
)

MODEL = "sim-llama-8b"
CHROMIUM = "/usr/bin/chromium"
RATE = 36.0  # USD per worker-hour
EXPONENT = re.compile(r"(?<![\w.-])[-+]?\d+(?:\.\d+)?[eE][-+]?\d+(?![\w.])")
FINANCE = {"Authorization": f"Bearer {FINANCE_TOKEN}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def shown_on_excel(row: Any) -> list[str]:
    """The cells as a spreadsheet shows them: text as it is, an amount under its "#,##0.00" format."""
    out = []
    for cell in row:
        if isinstance(cell.value, str):
            out.append(cell.value)
            continue
        places = len(cell.number_format.partition(".")[2])
        figure = Decimal(repr(cell.value)).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
        out.append(f"{abs(figure) if figure == 0 else figure:,.{places}f}" if "." in cell.number_format
                   else str(cell.value))  # a count as the page prints it
    return out


def cell_texts(html: str, test_id: str) -> list[str]:
    return re.findall(rf'data-testid="{test_id}"[^>]*>([^<]*)<', html)


def statement(gateway: Proc, month: str, headers: dict[str, str] = FINANCE, **params: str) -> httpx.Response:
    asked = {"month": month} if month else {}
    return httpx.get(gateway.url + "/admin/statements", params={**asked, **params}, headers=headers,
                     timeout=60)


def month_of(moment: datetime) -> str:
    return moment.strftime("%Y-%m")


def record(n: int, tenant: str, when: datetime, worker: str, cost: float, **fields: Any) -> dict[str, Any]:
    """A record as the gateway's writer stores it, for a month before the gateway ran."""
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    return row | {"id": f"past-{n}", "request_id": f"past-req-{n}", "time": at(when.timestamp()), "tenant": tenant,
                  "tier": "standard", "service_class": "standard", "model": MODEL, "endpoint": "chat",
                  "stream": False, "status": 200, "prompt_tokens": 40, "completion_tokens": 12, "cached_tokens": 0,
                  "estimated": False, "cost_usd": cost, "worker": worker, "worker_ms": 1500.0, "total_ms": 1500.0,
                  "tags": "project=archive"} | fields


def test_a_months_statement_as_json_csv_workbook_and_printed_page(start_gateway: Callable[..., Proc],
                                                                  start_sim: Callable[..., Proc],
                                                                  tmp_path: Path) -> None:
    sim = start_sim("--decode-base-ms", "2")
    gateway = start_gateway(policy_dict([sim.url], gpu_usd_per_hour=RATE))
    month = month_of(datetime.now(UTC))
    for key, n, tags in ((DEMO_KEY, 4, "project=search"), (PREMIUM_KEY, 3, "project=ads,team=growth")):
        for i in range(n):
            answer = httpx.post(gateway.url + "/v1/chat/completions", timeout=30,
                                headers={"Authorization": f"Bearer {key}", "X-Tollgate-Tags": tags},
                                json={"model": MODEL, "max_tokens": 10 + i,
                                      "messages": [{"role": "user", "content": f"question {i}"}]})
            assert answer.status_code == 200
    assert wait_for(lambda: statement(gateway, month).json()["total"]["requests"] == 7, timeout=20)
    data = statement(gateway, month).json()
    assert data["closed"] is False and [r["tenant"] for r in data["tenants"]] == ["bulk", "demo", "prem"]
    total = data["total"]
    assert total["cost_usd"] > 0 and total["gpu_cost_usd"] > 0
    rec = data["reconciliation"]
    assert abs(rec["difference_usd"]) < 1e-9  # the rounded figures may differ by a micro-dollar
    assert rec["attributed_usd"] + rec["idle_usd"] == pytest.approx(rec["workers_cost_usd"], abs=3e-6)
    assert total["gpu_cost_usd"] == pytest.approx(rec["attributed_usd"], abs=1e-5)

    # the CSV: typed numbers in pandas, never an exponent in the text
    table = statement(gateway, month, format="csv", tenant="demo")
    assert table.headers["content-disposition"] == f'attachment; filename="statement_{month}_demo.csv"'
    assert EXPONENT.findall(table.text) == []
    frame = pd.read_csv(io.StringIO(table.text))
    for column in ("requests", "prompt_tokens", "cost_usd", "gpu_cost_usd", "billable_usd"):
        assert pd.api.types.is_numeric_dtype(frame[column]), (column, frame[column].dtype)
    demo = next(r for r in data["tenants"] if r["tenant"] == "demo")
    row = frame[frame.section == "tenant"].iloc[0]
    assert row["requests"] == 4 and row["cost_usd"] == pytest.approx(demo["cost_usd"], abs=1e-9)
    assert frame[frame.section == "cost_centre"]["tag"].tolist() == ["project=search"]

    # the workbook: a sheet per view and per tenant, numbers as numbers, totals as the JSON
    book = statement(gateway, month, format="xlsx")
    assert book.headers["content-disposition"] == f'attachment; filename="statement_{month}_all.xlsx"'
    wb = openpyxl.load_workbook(io.BytesIO(book.content))
    assert wb.sheetnames == ["Summary by tenant", "By model", "By cost centre", "GPU idle by worker", "Adjustments",
                             "Statement", "bulk", "demo", "prem"]
    summary = wb["Summary by tenant"]
    assert [r for r in wb["Statement"].iter_rows(values_only=True) if r[0] == "Period (UTC)"] == \
        [("Period (UTC)", money.period(*parse_month(month)))]
    assert summary.freeze_panes == "A2" and all(c.font.b for c in summary[1])
    assert all(isinstance(c.value, int | float) for r in summary.iter_rows(min_row=2) for c in r[1:])
    sheets = pd.read_excel(io.BytesIO(book.content), sheet_name=None)
    frame = sheets["Summary by tenant"].set_index("Tenant")
    for heading, key in (("Requests", "requests"), ("List-price spend (USD)", "cost_usd"),
                         ("GPU cost (USD)", "gpu_cost_usd"), ("Billable (USD)", "billable_usd")):
        assert pd.api.types.is_numeric_dtype(frame[heading]), heading
        assert frame.loc["Total", heading] == pytest.approx(total[key], abs=1e-9), heading
        assert frame.drop("Total")[heading].sum() == pytest.approx(total[key], abs=1e-6), heading
    by_model = sheets["By model"]
    assert by_model[by_model.Tenant != "Total"]["Requests"].sum() == 7
    idle = sheets["GPU idle by worker"]
    assert idle["Worker"].tolist() == [sim.url, "Total"] and idle["Idle cost (USD)"].dtype.kind == "f"
    assert sheets["prem"]["Requests"].iloc[-1] == 3, "a tenant's sheet ends on its total"

    # the printable page and the workbook: the same figures, as a spreadsheet shows them, and the same period;
    # with no month asked for, this month (as the finance page's selector)
    for printed in (statement(gateway, month, format="html").text, statement(gateway, "", format="html").text):
        assert cell_texts(printed, "period") == [f"{money.period(*parse_month(month))} (UTC)"]
        assert "rounded to the cent" in cell_texts(printed, "rounding")[0]
        for test_id, row in (("summary-row", summary[2]), ("summary-total", summary[summary.max_row])):
            tds = re.search(rf'<tr[^>]*data-testid="{test_id}"[^>]*>(.*?)</tr>', printed)
            assert tds is not None and re.findall(r"<td[^>]*>([^<]*)</td>", tds[1]) == shown_on_excel(row), test_id
        assert re.findall(r'<td class="usd">([^<]*)</td>', printed)[5] == money.amount(data["tenants"][1]["cost_usd"])

    # the page in a browser: printable, each tenant on its own page of the PDF
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(gateway.url + "/reports")
        page.fill("input[name=token]", FINANCE_TOKEN)
        page.click("button[type=submit]")
        page.wait_for_selector("[data-testid=total-cost]")
        answer = page.goto(f"{gateway.url}/admin/statements?month={month}&format=html")  # the page's sign-in
        assert answer is not None and answer.status == 200
        assert page.locator("[data-testid=tenant-section]").count() == 3
        cells = page.locator("[data-testid=summary-total] td").all_inner_texts()
        assert cells[0] == "Total" and int(cells[1]) == 7 and cells[5] == money.amount(total["cost_usd"])
        assert EXPONENT.findall(page.inner_text("body")) == []
        assert "Open:" in page.inner_text("[data-testid=status]")
        shot = Path(os.environ.get("TOLLGATE_SCREENSHOT_DIR", tmp_path)) / "statement.png"
        page.set_viewport_size({"width": 1000, "height": 900})
        page.screenshot(path=str(shot))  # the README's, when TOLLGATE_SCREENSHOT_DIR says where
        assert shot.stat().st_size > 10_000
        page.emulate_media(media="print")
        assert not page.locator("a:text('Excel workbook')").is_visible(), "the links are not printed"
        pdf = page.pdf(format="A4", landscape=True, print_background=True)
        pages = len(re.findall(rb"/Type\s*/Page\b(?!s)", pdf))
        assert pages >= 5, pages  # the summary, a page per tenant, the workers' hours
        (tmp_path / "statement.pdf").write_bytes(pdf)
        browser.close()


def test_a_closed_month_stays_as_closed_and_the_next_carries_what_came_late(start_gateway: Callable[..., Proc],
                                                                            start_sim: Callable[..., Proc],
                                                                            tmp_path: Path) -> None:
    sim = start_sim("--decode-base-ms", "2")
    data_dir = tmp_path / "gateway-data"
    gateway = start_gateway(policy_dict([sim.url], gpu_usd_per_hour=RATE), data_dir=data_dir)
    now = datetime.now(UTC)
    first = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    past = first - timedelta(days=20)  # a moment of last month
    last_month, this_month = month_of(past), month_of(now)
    ledger = SqliteLedger(data_dir / "ledger.sqlite3")  # the gateway's own ledger, beside it (WAL)
    try:
        ledger.insert([record(1, "demo", past, sim.url, 0.02), record(2, "prem", past + timedelta(hours=1), sim.url,
                                                                      0.03, model="other-model")])
        assert statement(gateway, last_month).json()["total"]["requests"] == 2

        assert httpx.post(gateway.url + "/admin/statements/close", params={"month": last_month}, headers=FINANCE
                          ).status_code == 403
        current = httpx.post(gateway.url + "/admin/statements/close", params={"month": this_month}, headers=ADMIN)
        assert current.status_code == 400 and current.json()["error"]["param"] == "month"
        closed = httpx.post(gateway.url + "/admin/statements/close", params={"month": last_month}, headers=ADMIN,
                            timeout=60)
        assert closed.status_code == 200, closed.text
        assert closed.json()["closed"] is True and closed.json()["total"]["requests"] == 2
        again = httpx.post(gateway.url + "/admin/statements/close", params={"month": last_month}, headers=ADMIN)
        assert again.status_code == 409 and again.json()["error"]["code"] == "month_closed"

        # a record for last month arrives after its close (a spool replayed late)
        ledger.insert([record(3, "demo", past + timedelta(hours=2), sim.url, 0.125)])
        after = statement(gateway, last_month).json()
        assert after == closed.json(), "the closed statement is what was closed"
        assert after["closed_at"] and after["closed_by"] == "admin"
        carried = statement(gateway, this_month).json()["adjustments"]
        assert [(a["label"], a["tenant"], a["model"], a["requests"], a["cost_usd"]) for a in carried] == [
            (f"adjustment for {last_month}", "demo", MODEL, 1, 0.125)]
        sheets = pd.read_excel(io.BytesIO(statement(gateway, this_month, format="xlsx").content), sheet_name=None)
        adjustments = sheets["Adjustments"]
        assert adjustments["Adjustment"].tolist() == [f"adjustment for {last_month}"]
        assert adjustments["List-price spend (USD)"].tolist() == [0.125]
        summary = sheets["Summary by tenant"].set_index("Tenant")
        assert summary.loc["demo", "Adjustments (USD)"] == 0.125
        listed = httpx.get(gateway.url + "/admin/statements/closes", headers=FINANCE).json()["data"]
        assert [c["month"] for c in listed] == [last_month]
        page = statement(gateway, last_month, format="html").text
        assert "Closed " in page and "no longer changes" in page
    finally:
        ledger.close()


def test_replicas_on_one_postgres_ledger_share_the_closed_months(start_gateway: Callable[..., Proc],
                                                                 start_sim: Callable[..., Proc], pg_dsn: str) -> None:
    sim = start_sim("--decode-base-ms", "2")
    policy = on_shared_state(policy_dict([sim.url], gpu_usd_per_hour=RATE), pg_dsn)
    replicas = [start_gateway(policy), start_gateway(policy)]
    past = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0) - timedelta(days=10)
    last_month, this_month = month_of(past), month_of(datetime.now(UTC))
    ledger = PostgresLedger(pg_dsn)
    try:
        ledger.insert([record(1, "prem", past, sim.url, 0.04)])
        closed = httpx.post(replicas[0].url + "/admin/statements/close", params={"month": last_month},
                            headers=ADMIN, timeout=60)
        assert closed.status_code == 200, closed.text
        again = httpx.post(replicas[1].url + "/admin/statements/close", params={"month": last_month},
                           headers=ADMIN, timeout=60)
        assert again.status_code == 409 and again.json()["error"]["code"] == "month_closed", "closed for every replica"
        ledger.insert([record(2, "prem", past + timedelta(minutes=5), sim.url, 0.5)])
        assert statement(replicas[1], last_month).json() == closed.json()
        carried = statement(replicas[1], this_month).json()["adjustments"]
        assert [(a["tenant"], a["requests"], a["cost_usd"]) for a in carried] == [("prem", 1, 0.5)]
    finally:
        ledger.close()
