"""The finance page in a real browser: Debian's chromium driven by Playwright, numbers checked against the API;
every tenant listed, no number in exponent notation, downloads named for what they hold, a drill-down's own p95,
and each parameter the page or the API cannot honour answered with a 400 that says so."""

from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import openpyxl
import pytest
from playwright.sync_api import sync_playwright

from gateway.auth import hash_key
from gateway.finance import money
from gateway.finance.reports import parse_month
from tests.conftest import DEMO_KEY, FINANCE_TOKEN, PREMIUM_KEY, Proc, policy_dict, wait_for

MODEL = "sim-llama-8b"
CHROMIUM = "/usr/bin/chromium"
EXPONENT = re.compile(r"(?<![\w.-])[-+]?\d+(?:\.\d+)?[eE][-+]?\d+(?![\w.])")  # 1e-05, 2.4E+3 as a whole word


def screenshot_to(tmp_path: Path, name: str = "finance-page.png") -> Path:
    """Where the screenshot goes: TOLLGATE_SCREENSHOT_DIR if set (to refresh the README's), else the test's tmp."""
    return Path(os.environ.get("TOLLGATE_SCREENSHOT_DIR", tmp_path)) / name


def test_finance_page_shows_what_the_api_reports(start_gateway: Callable[..., Proc],
                                                start_sim: Callable[..., Proc], tmp_path: Path) -> None:
    assert os.path.exists(CHROMIUM), "Debian's chromium is needed (.ci/run installs it)"
    sim = start_sim("--decode-base-ms", "2")
    policy = policy_dict([sim.url], gpu_usd_per_hour=2.5)
    policy["tenants"]["capped"] = {"tier": "standard", "keys": ["sha256:" + hash_key("tg-test-capped-key")],
                                   "budget": {"period": "month", "limit_usd": 0.01}}
    # no traffic, and a limit Python's repr and :g print as 1e-05
    policy["tenants"]["idle"] = {"tier": "standard", "keys": [], "budget": {"period": "day", "limit_usd": 0.00001}}
    gateway = start_gateway(policy)
    for key, n in ((DEMO_KEY, 6), (PREMIUM_KEY, 3), ("tg-test-capped-key", 4)):
        for i in range(n):
            # prem asks long questions: the gateway's p95 is one of them, demo's own far below it
            content = "a much longer question " * 60 if key == PREMIUM_KEY else f"question {i} " * (i + 1)
            answer = httpx.post(gateway.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                json={"model": MODEL, "max_tokens": 20 + i,
                                      "messages": [{"role": "user", "content": content}]})
            assert answer.status_code == 200
    finance = {"Authorization": f"Bearer {FINANCE_TOKEN}"}

    def report() -> dict[str, object]:
        return httpx.get(gateway.url + "/admin/reports/costs", params={"group_by": "day,tenant"},
                         headers=finance).json()
    assert wait_for(lambda: report()["total"]["requests"] == 13, timeout=15)  # type: ignore[index]
    total = report()["total"]
    assert isinstance(total, dict)
    records = httpx.get(gateway.url + "/admin/ledger", headers=finance).json()["data"]
    assert len(records) == 13

    # `tollgate costs` in an 80-column terminal: every column there, none cut to an ellipsis
    import subprocess
    import sys

    printed = subprocess.run([sys.executable, "-m", "gateway", "costs", "--url", gateway.url, "--token", FINANCE_TOKEN,
                              "--group-by", "tenant,model"], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "COLUMNS": "80", "TERM": "xterm"})
    assert printed.returncode == 0, printed.stderr
    lines = printed.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in printed.stdout, printed.stdout
    for word in ("tenant", "model", "requests", "prompt", "output", "cache", "cost", "TOTAL", "capped", MODEL):
        assert word in printed.stdout, (word, printed.stdout)
    assert money.amount(total["cost_usd"]) in printed.stdout, printed.stdout
    assert f"Costs, this month so far: {datetime.now(UTC):%Y-%m}-01 to now" in printed.stdout, printed.stdout
    by_pair = httpx.get(gateway.url + "/admin/reports/costs", params={"group_by": "tenant,model"},
                        headers=finance).json()["data"]
    for row in by_pair:  # each value whole on one line: never split mid-word or mid-number
        assert any(str(row["tenant"]) in line and money.amount(row["cost_usd"]) in line for line in lines), row

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1000, "height": 1200})
        page.goto(gateway.url + "/reports")
        page.fill("input[name=token]", PREMIUM_KEY)  # a tenant key does not open the reports
        page.click("button[type=submit]")
        assert "does not open the reports" in page.content()
        page.fill("input[name=token]", FINANCE_TOKEN)
        page.click("button[type=submit]")
        page.wait_for_selector("[data-testid=total-cost]")

        def shown(test_id: str) -> str:
            return page.inner_text(f"[data-testid={test_id}]")

        def plain_page() -> None:
            """No number on the page in exponent notation (its text, and its SVG's titles)."""
            text = page.inner_text("body") + " ".join(page.locator("svg title").all_text_contents())
            assert EXPONENT.findall(text) == [], EXPONENT.findall(text)

        def download(test_id_or_selector: str) -> tuple[str, list[dict[str, str]]]:
            """A CSV link's file name (content-disposition) and rows, fetched with the page's sign-in."""
            selector = test_id_or_selector if "[" in test_id_or_selector else f"[data-testid={test_id_or_selector}]"
            href = page.get_attribute(selector, "href")
            assert href is not None
            got = page.request.get(gateway.url + href)
            assert got.status == 200 and EXPONENT.search(got.text()) is None, got.text()
            name = re.fullmatch(r'attachment; filename="([A-Za-z0-9._-]+)"', got.headers["content-disposition"])
            assert name is not None, got.headers["content-disposition"]
            return name[1], list(csv.DictReader(io.StringIO(got.text())))
        assert shown("total-cost") == money.amount(total["cost_usd"])  # to the cent, as the statement and CLI
        assert int(shown("total-requests")) == 13
        assert shown("cost-per-1k") == money.rate(total["cost_per_1k_requests_usd"])
        everyone = sorted(r["prompt_tokens"] + r["completion_tokens"] for r in records)
        assert int(shown("tokens-p95")) == everyone[12], "the 95th percentile of 13: the largest"
        plain_page()
        first, last = re.search(r"(\d{4}-\d\d-\d\d) to (\d{4}-\d\d-\d\d)", shown("range")).groups()  # type: ignore[union-attr]
        assert page.locator("[data-testid=daily-chart] rect").count() >= 3  # one bar part per tenant today
        assert page.locator("[data-testid=model-row]").count() == 1
        budget = page.inner_text("[data-testid=budget-row]")
        assert "capped" in budget and "month" in budget
        # the CSV links work with the page's sign-in, sum to the same spend, and are named for what they hold
        name, rows = download("a[href*='format=csv&group_by=day,tenant,model']")
        assert name == f"costs_{first}_{last}_by-day-tenant-model.csv"
        assert sum(float(r["cost_usd"]) for r in rows) == pytest.approx(total["cost_usd"], abs=1e-6)
        name, rows = download("a[href*='/admin/ledger?format=csv']")
        assert name == f"ledger_{first}_{last}.csv" and len(rows) == 13
        # the tenant table: every tenant of the policy, each one's spend as the API reports it, its CSV the same
        by_tenant = {r["tenant"]: r for r in httpx.get(gateway.url + "/admin/reports/costs", headers=finance,
                                                         params={"group_by": "tenant"}).json()["data"]}
        assert set(by_tenant) == {"demo", "prem", "capped", "bulk", "idle"}
        rows = page.locator("[data-testid=tenant-row]")
        assert rows.count() == 5
        for i in range(5):
            cells = rows.nth(i).locator("td").all_inner_texts()
            assert cells[5] == money.amount(by_tenant[cells[0]]["cost_usd"])
            assert int(cells[1]) == by_tenant[cells[0]]["requests"]
            assert cells[8] == ("new" if by_tenant[cells[0]]["requests"] else "-")
        for quiet in ("bulk", "idle"):
            cells = page.locator("[data-testid=tenant-row]", has_text=quiet).locator("td").all_inner_texts()
            assert cells[1:6] == ["0", "0", "0", "0", "0.00"], (quiet, cells)
        capped_row = page.locator("[data-testid=tenant-row]", has_text="capped").locator("td").all_inner_texts()
        assert capped_row[6] == "0.01 / month" and capped_row[7].endswith("%")
        idle_row = page.locator("[data-testid=tenant-row]", has_text="idle").locator("td").all_inner_texts()
        assert idle_row[6] == "0.00 / day", idle_row  # an amount to the cent, never 1e-05
        assert "0.00" in page.locator("[data-testid=budget-row]", has_text="idle").inner_text()
        name, rows = download("tenant-csv")
        assert name == f"costs_{first}_{last}_by-tenant.csv" and {r["tenant"] for r in rows} == set(by_tenant)
        assert [r["cost_usd"] for r in rows if r["tenant"] in ("bulk", "idle")] == ["0.00", "0.00"]
        # the GPU section: the tenants' GPU cost as the GPU report gives it, the worker's hours, the cheapest line
        gpu = httpx.get(gateway.url + "/admin/reports/gpu", headers=finance,
                        params={"from": first, "to": last, "group_by": "tenant"}).json()
        gpu_rows = {r["tenant"]: r for r in gpu["data"] if r["kind"] == "usage"}
        shown_rows = page.locator("[data-testid=gpu-tenant-row]")
        assert shown_rows.count() == len(gpu_rows) == 5
        for i in range(5):
            cells = shown_rows.nth(i).locator("td").all_inner_texts()
            assert cells[3] == money.amount(gpu_rows[cells[0]]["gpu_cost_usd"])
            assert cells[4] == money.amount(by_tenant[cells[0]]["cost_usd"])
        assert gpu_rows["demo"]["gpu_cost_usd"] > 0 and gpu_rows["bulk"]["gpu_cost_usd"] == 0
        assert page.locator("[data-testid=gpu-idle-row]").count() == 1
        assert page.locator("[data-testid=gpu-worker-row]").count() == 1
        assert "2.50" in page.inner_text("[data-testid=gpu-worker-row]")
        assert "scaling rules would have run" in shown("cheapest")
        assert shown("gpu-idle-share").endswith("%")
        name, rows = download("gpu-csv")
        assert name == f"gpu_{first}_{last}_by-tenant.csv" and {r["kind"] for r in rows} == {"usage", "idle"}
        xlsx = page.request.get(gateway.url + str(page.get_attribute("[data-testid=statement-xlsx]", "href")))
        assert xlsx.status == 200 and xlsx.body()[:2] == b"PK"  # a workbook (a zip), with the page's sign-in
        assert "statement_" in xlsx.headers["content-disposition"]
        current = f"{datetime.now(UTC):%Y-%m}"  # the statement links open the month the selector shows
        assert f"month={current}" in str(page.get_attribute("[data-testid=statement-html]", "href"))
        sheet = {r[0]: r[1] for r in openpyxl.load_workbook(io.BytesIO(xlsx.body()))["Statement"].iter_rows(
            min_row=2, values_only=True)}
        assert sheet["Month"] == current and sheet["Period (UTC)"] == money.period(*parse_month(current))
        plain_page()
        page.locator("[data-testid=gpu-section]").screenshot(path=str(screenshot_to(tmp_path, "finance-gpu.png")))
        assert screenshot_to(tmp_path, "finance-gpu.png").stat().st_size > 10_000
        page.screenshot(path=str(screenshot_to(tmp_path)), full_page=True)
        # a calendar month: this one holds every request; the one before holds none
        this_month = page.locator("[data-testid=month] option").first.get_attribute("value")
        page.select_option("[data-testid=month]", this_month)
        page.click("[data-testid=show-month]")
        page.wait_for_selector("[data-testid=range]")
        assert f"Calendar month {this_month}" in shown("range") and int(shown("total-requests")) == 13
        name, _ = download("tenant-csv")
        assert name == f"costs_{this_month}_by-tenant.csv"
        plain_page()
        earlier = page.locator("[data-testid=month] option").nth(1).get_attribute("value")
        page.select_option("[data-testid=month]", earlier)
        page.click("[data-testid=show-month]")
        page.wait_for_selector("[data-testid=range]")
        assert f"Calendar month {earlier}" in shown("range") and int(shown("total-requests")) == 0
        assert "No requests in this range." in shown("tenant-empty")
        assert page.locator("[data-testid=tenant-row]").count() == 5, "every tenant, at zero"
        assert set(page.locator("[data-testid=tenant-cost]").all_inner_texts()) == {"0.00"}
        # a tenant's drill-down, by model, key and day, as the API reports it for that tenant
        page.goto(gateway.url + "/reports?days=7")
        week = re.search(r"(\d{4}-\d\d-\d\d) to (\d{4}-\d\d-\d\d)", shown("range")).groups()  # type: ignore[union-attr]
        page.click("[data-testid=tenant-row] a:text-is('demo')")
        page.wait_for_selector("[data-testid=drill-title]")
        assert shown("drill-title") == "Tenant demo" and int(shown("total-requests")) == 6
        demo = sorted(r["prompt_tokens"] + r["completion_tokens"] for r in records if r["tenant"] == "demo")
        assert int(shown("tokens-p95")) == demo[5] < everyone[12], "demo's own p95, not the gateway's"
        plain_page()
        api = httpx.get(gateway.url + "/admin/reports/costs", headers=finance,
                        params={"group_by": "key", "tenant": "demo"}).json()["data"]
        key_cells = page.locator("[data-testid=drill-key]").locator("td").all_inner_texts()
        assert len(api) == 1 and key_cells[0] == f"(a key of the policy file) {api[0]['key_id']}"
        assert key_cells[4] == money.amount(api[0]["cost_usd"])
        assert page.locator("[data-testid=drill-model]").count() == 1
        assert page.locator("[data-testid=drill-day]").count() == 1
        name, rows = download("drill-day-csv")
        assert name == f"costs_{week[0]}_{week[1]}_demo_by-day.csv"
        assert sum(float(r["cost_usd"]) for r in rows) == pytest.approx(by_tenant["demo"]["cost_usd"], abs=1e-6)
        tag_rows = page.locator("[data-testid=drill-tag]")  # cost centres: "(untagged)" for a request without
        assert sum(int(tag_rows.nth(i).locator("td").nth(1).inner_text()) for i in range(tag_rows.count())) == 6
        name, rows = download("drill-tag-csv")
        assert name == f"costs_{week[0]}_{week[1]}_demo_by-tag.csv" and sum(int(r["requests"]) for r in rows) == 6
        assert "None" not in page.locator("td").all_inner_texts(), "no absent value shown as Python's None"

        # each parameter the page cannot show: a 400, the page's form, what was wrong and what is accepted
        for query, says in (("days=0", "from 1 to 366, not '0'"), ("days=abc", "whole number of days"),
                            ("days=367", "from 1 to 366, not '367'"), ("month=2026-13", "YYYY-MM"),
                            ("month=abc", "YYYY-MM"),
                            ("tenant=nobody", "No tenant 'nobody': tenant takes one the policy names (bulk, capped, "
                                              "demo, idle, prem)"),
                            ("days=7&month=2026-11", "days or month, not both")):
            answer = page.goto(f"{gateway.url}/reports?{query}")
            assert answer is not None and answer.status == 400, query
            assert says in shown("problem"), (query, shown("problem"))
            assert page.locator("[data-testid=show-days]").is_visible() and page.locator("[data-testid=total-cost]"
                                                                                         ).count() == 0, query
        page.fill("[data-testid=days]", "7")  # corrected on the same page
        page.click("[data-testid=show-days]")
        page.wait_for_selector("[data-testid=total-cost]")
        assert "Last 7 days" in shown("range") and int(shown("total-requests")) == 13
        assert screenshot_to(tmp_path).stat().st_size > 10_000
        browser.close()

    # the API answers the same mistakes with OpenAI's error and the parameter's name
    for params, param in (({"from": "2026-11-30", "to": "2026-11-01"}, "from"), ({"tenant": "nobody"}, "tenant"),
                          ({"month": "2026-13"}, "month"), ({"month": "2026-11", "to": "2026-11-30"}, "month"),
                          ({"tag": "no-pair"}, "tag")):
        refused = httpx.get(gateway.url + "/admin/reports/costs", params=params, headers=finance)
        error = refused.json()["error"]
        assert refused.status_code == 400 and error["param"] == param and error["type"] == "invalid_request_error"
    month = httpx.get(gateway.url + "/admin/reports/costs", headers=finance,
                      params={"format": "csv", "group_by": "model", "month": this_month, "tenant": "demo"})
    assert month.headers["content-disposition"] == f'attachment; filename="costs_{this_month}_demo_by-model.csv"'
