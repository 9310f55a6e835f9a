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
        page.screenshot(path=str(screenshot_to(tmp_path)), full_page=True)
        assert screenshot_to(tmp_path).stat().st_size > 10_000
        browser.close()
