"""The finance page in a real browser: Debian's chromium driven by Playwright, numbers checked against the API."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import sync_playwright

from gateway.auth import hash_key
from tests.conftest import DEMO_KEY, FINANCE_TOKEN, PREMIUM_KEY, Proc, policy_dict, wait_for

MODEL = "sim-llama-8b"
CHROMIUM = "/usr/bin/chromium"


def screenshot_to(tmp_path: Path) -> Path:
    """Where the screenshot goes: TOLLGATE_SCREENSHOT_DIR if set (to refresh the README's), else the test's tmp."""
    return Path(os.environ.get("TOLLGATE_SCREENSHOT_DIR", tmp_path)) / "finance-page.png"


def test_finance_page_shows_what_the_api_reports(start_gateway: Callable[..., Proc],
                                                start_sim: Callable[..., Proc], tmp_path: Path) -> None:
    assert os.path.exists(CHROMIUM), "Debian's chromium is needed (.ci/run installs it)"
    sim = start_sim("--decode-base-ms", "2")
    policy = policy_dict([sim.url])
    policy["tenants"]["capped"] = {"tier": "standard", "keys": ["sha256:" + hash_key("tg-test-capped-key")],
                                   "budget": {"period": "month", "limit_usd": 0.01}}
    gateway = start_gateway(policy)
    for key, n in ((DEMO_KEY, 6), (PREMIUM_KEY, 3), ("tg-test-capped-key", 4)):
        for i in range(n):
            answer = httpx.post(gateway.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                json={"model": MODEL, "max_tokens": 20 + i,
                                      "messages": [{"role": "user", "content": f"question {i} " * (i + 1)}]})
            assert answer.status_code == 200
    finance = {"Authorization": f"Bearer {FINANCE_TOKEN}"}

    def report() -> dict[str, object]:
        return httpx.get(gateway.url + "/admin/reports/costs", params={"group_by": "day,tenant"},
                         headers=finance).json()
    assert wait_for(lambda: report()["total"]["requests"] == 13, timeout=15)  # type: ignore[index]
    total = report()["total"]
    assert isinstance(total, dict)

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
    assert f"{total['cost_usd']:.6f}" in printed.stdout.replace(" ", ""), printed.stdout

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
        assert float(shown("total-cost")) == pytest.approx(total["cost_usd"], abs=1e-6)
        assert int(shown("total-requests")) == 13
        assert float(shown("cost-per-1k")) == pytest.approx(total["cost_per_1k_requests_usd"], abs=1e-6)
        assert int(shown("tokens-p95")) > 0
        assert page.locator("[data-testid=daily-chart] rect").count() >= 3  # one bar part per tenant today
        assert page.locator("[data-testid=model-row]").count() == 1
        budget = page.inner_text("[data-testid=budget-row]")
        assert "capped" in budget and "month" in budget
        # the CSV link works with the page's sign-in, and sums to the same spend
        link = page.get_attribute("a[href*='format=csv&group_by']", "href")
        assert link is not None
        download = page.request.get(gateway.url + link)
        assert download.status == 200
        rows = list(csv.DictReader(io.StringIO(download.text())))
        assert sum(float(r["cost_usd"]) for r in rows) == pytest.approx(total["cost_usd"], abs=1e-6)
        # the tenant table: each tenant's spend as the API reports it, its CSV the same
        by_tenant = {r["tenant"]: r for r in httpx.get(gateway.url + "/admin/reports/costs", headers=finance,
                                                         params={"group_by": "tenant"}).json()["data"]}
        rows = page.locator("[data-testid=tenant-row]")
        assert rows.count() == 3
        for i in range(3):
            cells = rows.nth(i).locator("td").all_inner_texts()
            assert float(cells[5]) == pytest.approx(by_tenant[cells[0]]["cost_usd"], abs=1e-6)
            assert int(cells[1]) == by_tenant[cells[0]]["requests"] and cells[8] == "new"
        capped_row = page.locator("[data-testid=tenant-row]", has_text="capped").locator("td").all_inner_texts()
        assert capped_row[6] == "0.01 / month" and capped_row[7].endswith("%")
        tenant_csv = page.request.get(gateway.url + page.get_attribute("[data-testid=tenant-csv]", "href"))
        assert {r["tenant"] for r in csv.DictReader(io.StringIO(tenant_csv.text()))} == set(by_tenant)
        page.screenshot(path=str(screenshot_to(tmp_path)), full_page=True)
        # a calendar month: this one holds every request; the one before holds none
        this_month = page.locator("[data-testid=month] option").first.get_attribute("value")
        page.select_option("[data-testid=month]", this_month)
        page.click("[data-testid=show-month]")
        page.wait_for_selector("[data-testid=range]")
        assert f"Calendar month {this_month}" in shown("range") and int(shown("total-requests")) == 13
        earlier = page.locator("[data-testid=month] option").nth(1).get_attribute("value")
        page.select_option("[data-testid=month]", earlier)
        page.click("[data-testid=show-month]")
        page.wait_for_selector("[data-testid=range]")
        assert f"Calendar month {earlier}" in shown("range") and int(shown("total-requests")) == 0
        assert "No requests in this range." in shown("tenant-table")
        # a tenant's drill-down, by model, key and day, as the API reports it for that tenant
        page.goto(gateway.url + "/reports?days=7")
        page.click("[data-testid=tenant-row] a:text-is('demo')")
        page.wait_for_selector("[data-testid=drill-title]")
        assert shown("drill-title") == "Tenant demo" and int(shown("total-requests")) == 6
        api = httpx.get(gateway.url + "/admin/reports/costs", headers=finance,
                        params={"group_by": "key", "tenant": "demo"}).json()["data"]
        key_cells = page.locator("[data-testid=drill-key]").locator("td").all_inner_texts()
        assert len(api) == 1 and key_cells[0] == api[0]["key_id"]
        assert float(key_cells[4]) == pytest.approx(api[0]["cost_usd"], abs=1e-6)
        assert page.locator("[data-testid=drill-model]").count() == 1
        assert page.locator("[data-testid=drill-day]").count() == 1
        day_csv = page.request.get(gateway.url + page.get_attribute("[data-testid=drill-day-csv]", "href"))
        assert sum(float(r["cost_usd"]) for r in csv.DictReader(io.StringIO(day_csv.text()))) == pytest.approx(
            by_tenant["demo"]["cost_usd"], abs=1e-6)
        assert screenshot_to(tmp_path).stat().st_size > 10_000
        browser.close()
