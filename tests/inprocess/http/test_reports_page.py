"""The finance page in-process: the period a query asks for (and what it falls back to), the page behind its
sign-in, nothing from a request or an alert rendered as markup, and the daily chart's bars to scale. (The page
in a browser, its numbers against the API, is tests/process/test_finance_page.py.)"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from gateway.http import reports_page
from gateway.http.app import HotPaths, create_app
from gateway.http.reports_page import Range
from gateway.policy.loader import PolicySnapshot, PolicyStore
from gateway.policy.schema import Policy
from tests.conftest import DEMO_KEY, FINANCE_TOKEN, policy_dict

NOW = datetime(2026, 3, 15, 13, 30, tzinfo=UTC).timestamp()


def test_a_calendar_month_is_shown_against_the_month_before() -> None:
    shown = Range.of({"month": "2026-01"}, NOW)
    assert (shown.start, shown.end, shown.before) == (datetime(2026, 1, 1, tzinfo=UTC),
                                                      datetime(2026, 2, 1, tzinfo=UTC),
                                                      datetime(2025, 12, 1, tzinfo=UTC))
    assert (shown.days, shown.query, shown.csv) == (31, "month=2026-01", "from=2026-01-01&to=2026-01-31")
    assert shown.describe().endswith("against 2025-12")
    december = Range.of({"month": "2025-12"}, NOW)
    assert december.end == datetime(2026, 1, 1, tzinfo=UTC), "a year rolls over"


def test_the_last_n_days_end_with_today_and_are_compared_with_the_n_before() -> None:
    shown = Range.of({"days": "7"}, NOW)
    assert (shown.start.date().isoformat(), shown.end.date().isoformat()) == ("2026-03-09", "2026-03-16")
    assert shown.before.date().isoformat() == "2026-03-02" and shown.csv == "from=2026-03-09&to=2026-03-15"


@pytest.mark.parametrize("query", [{"days": "0"}, {"days": "367"}, {"days": "-3"}, {"days": "ten"},
                                   {"month": "2026-13"}, {"month": "1969-12"}, {"month": "26-01"}, {}])
def test_a_period_out_of_bounds_falls_back_to_thirty_days(query: dict[str, str]) -> None:
    shown = Range.of(query, NOW)
    assert shown.month is None and shown.days == 30 and (shown.end - shown.start).days == 30


def app_with_ledger(data_dir: Path) -> HotPaths:
    policy = policy_dict(["http://127.0.0.1:9"])
    return create_app(PolicyStore(PolicySnapshot.build(Policy.model_validate(policy), "test")), data_dir)


def test_the_page_is_behind_its_sign_in_and_renders_nothing_as_markup(tmp_path: Path) -> None:
    app = app_with_ledger(tmp_path)
    hostile = "<script>alert(1)</script>"

    async def main() -> dict[str, httpx.Response]:
        async with app.app.router.lifespan_context(app.app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:  # type: ignore[arg-type]
            app.gateway.alerts.raise_alert("cost_anomaly", "alert", None, tenant="demo", worst_case_usd=hostile)
            finance = {"authorization": f"Bearer {FINANCE_TOKEN}"}
            return {
                "anonymous": await client.get("/reports"),
                "tenant key": await client.get("/reports", headers={"authorization": f"Bearer {DEMO_KEY}"}),
                "finance": await client.get("/reports?days=7", headers=finance),
                "drill": await client.get("/reports?tenant=demo", headers=finance),
                "unknown tenant": await client.get(f"/reports?tenant={hostile}", headers=finance),
            }
    seen = asyncio.run(main())
    for who in ("anonymous", "tenant key"):
        assert seen[who].status_code == 200 and 'action="/reports/login"' in seen[who].text, who
        assert 'data-testid="total-cost"' not in seen[who].text
    page = seen["finance"].text
    assert seen["finance"].status_code == 200 and 'data-testid="total-cost">0.000000<' in page
    assert "Last 7 days" in page and "No requests in this range." in page
    assert hostile not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page, "the alert, escaped"
    assert 'data-testid="drill-title">Tenant demo<' in seen["drill"].text
    assert hostile not in seen["unknown tenant"].text and "drill-title" not in seen["unknown tenant"].text, \
        "a tenant the policy does not name is ignored, not echoed"


def test_without_a_ledger_the_page_says_so() -> None:
    store = PolicyStore(PolicySnapshot.build(Policy.model_validate(policy_dict(["http://127.0.0.1:9"])), "test"))

    async def main() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(store))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            return await client.get("/reports", headers={"authorization": f"Bearer {FINANCE_TOKEN}"})
    reply = asyncio.run(main())
    assert reply.status_code == 409 and "ledger is not enabled" in reply.text


def test_the_daily_chart_stacks_each_days_tenants_to_scale() -> None:
    rows = [{"day": day, "tenant": tenant, "cost_usd": cost} for day, tenant, cost in (
        ("2026-03-01", "a", 3.0), ("2026-03-01", "b", 1.0), ("2026-03-02", "a", 2.0), ("2026-03-02", "b", None))]
    svg = reports_page._daily_chart(rows, width=460, height=240)
    heights = [float(h) for h in re.findall(r'<rect [^>]*height="([\d.]+)"', svg)]
    assert heights == [150.0, 50.0, 100.0, 0.0], "the peak day (4 USD) is the full 200 px; the rest in proportion"
    assert "$4.0000" in svg and "03-01" in svg
    assert reports_page._daily_chart([]) == '<p class="muted">No spend in this range.</p>'
