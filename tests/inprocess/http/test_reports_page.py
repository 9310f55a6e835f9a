"""The finance page in-process: the period a query asks for (and the 400 with the form for one it cannot show),
the page behind its sign-in, nothing from a request or an alert rendered as markup, every tenant listed, plain
decimals, readable labels for absent values, the drill-down's own figures, and the daily chart's bars to scale.
(The page in a browser, its numbers against the API, is tests/process/test_finance_page.py.)"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.errors import InvalidRequest
from gateway.finance import page as finance_page
from gateway.finance.page import Range
from gateway.http import reports_page
from gateway.http.app import HotPaths, create_app
from gateway.ledger.stores import COLUMNS
from gateway.policy.loader import PolicySnapshot, PolicyStore
from gateway.policy.schema import Policy
from tests.conftest import DEMO_KEY, FINANCE_TOKEN, policy_dict

NOW = datetime(2026, 3, 15, 13, 30, tzinfo=UTC).timestamp()


def test_a_calendar_month_is_shown_against_the_month_before() -> None:
    shown = Range.of({"month": "2026-01"}, NOW)
    assert (shown.start, shown.end, shown.before) == (datetime(2026, 1, 1, tzinfo=UTC),
                                                      datetime(2026, 2, 1, tzinfo=UTC),
                                                      datetime(2025, 12, 1, tzinfo=UTC))
    assert (shown.days, shown.query, shown.csv) == (31, "month=2026-01", "month=2026-01"), \
        "the API is asked for the month itself, so its downloads are named for it"
    assert shown.describe().endswith("against 2025-12")
    december = Range.of({"month": "2025-12"}, NOW)
    assert december.end == datetime(2026, 1, 1, tzinfo=UTC), "a year rolls over"


def test_the_last_n_days_end_with_today_and_are_compared_with_the_n_before() -> None:
    shown = Range.of({"days": "7"}, NOW)
    assert (shown.start.date().isoformat(), shown.end.date().isoformat()) == ("2026-03-09", "2026-03-16")
    assert shown.before.date().isoformat() == "2026-03-02" and shown.csv == "from=2026-03-09&to=2026-03-15"


def test_without_a_period_the_page_shows_the_last_thirty_days() -> None:
    for query in ({}, {"days": ""}, {"month": ""}):
        shown = Range.of(query, NOW)
        assert shown.month is None and shown.days == 30 and (shown.end - shown.start).days == 30, query
    assert Range.of({"days": "366"}, NOW).days == 366 and Range.of({"days": "1"}, NOW).days == 1


@pytest.mark.parametrize(("query", "param", "says"), [
    ({"days": "0"}, "days", "from 1 to 366"), ({"days": "367"}, "days", "from 1 to 366"),
    ({"days": "-3"}, "days", "not '-3'"), ({"days": "ten"}, "days", "whole number"),
    ({"days": "\u00b2"}, "days", "whole number"), ({"days": "99999"}, "days", "from 1 to 366"),
    ({"month": "2026-13"}, "month", "YYYY-MM"), ({"month": "1969-12"}, "month", "1970-01"),
    ({"month": "26-01"}, "month", "YYYY-MM"), ({"month": "abc"}, "month", "not 'abc'"),
    ({"month": "9999-12"}, "month", "9998-12"),
    ({"days": "7", "month": "2026-01"}, "days", "not both")])
def test_a_period_the_page_cannot_show_is_refused_saying_what_is_accepted(query: dict[str, str], param: str,
                                                                          says: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        Range.of(query, NOW)
    assert refused.value.param == param and says in refused.value.message


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
    assert seen["finance"].status_code == 200 and 'data-testid="total-cost">0.00<' in page
    assert "Last 7 days" in page and "No requests in this range." in page
    assert hostile not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page, "the alert, escaped"
    assert 'data-testid="drill-title">Tenant demo<' in seen["drill"].text
    unknown = seen["unknown tenant"]
    assert unknown.status_code == 400 and hostile not in unknown.text and "drill-title" not in unknown.text
    assert "No tenant &#x27;&lt;script&gt;" in unknown.text and "bulk, demo, prem" in unknown.text, \
        "the name is shown escaped, with the tenants the policy names"


def test_without_a_ledger_the_page_says_so() -> None:
    store = PolicyStore(PolicySnapshot.build(Policy.model_validate(policy_dict(["http://127.0.0.1:9"])), "test"))

    async def main() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(store))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            return await client.get("/reports", headers={"authorization": f"Bearer {FINANCE_TOKEN}"})
    reply = asyncio.run(main())
    assert reply.status_code == 409 and "ledger is not enabled" in reply.text


def test_the_sign_in_form_is_read_up_to_login_bytes_and_no_further(tmp_path: Path) -> None:
    app = app_with_ledger(tmp_path)
    form = {"content-type": "application/x-www-form-urlencoded"}

    async def main() -> tuple[httpx.Response, httpx.Response]:
        async with app.app.router.lifespan_context(app.app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:  # type: ignore[arg-type]
            at_cap = b"token=" + b"x" * (reports_page.LOGIN_BYTES - len(b"token="))
            return (await client.post("/reports/login", content=at_cap, headers=form),
                    await client.post("/reports/login", content=at_cap + b"x", headers=form))
    at_cap, past = asyncio.run(main())
    assert at_cap.status_code == 401 and "does not open the reports" in at_cap.text, "read whole, and refused"
    assert past.status_code == 413


def test_the_daily_chart_stacks_each_days_tenants_to_scale() -> None:
    rows = [{"day": day, "tenant": tenant, "cost_usd": cost} for day, tenant, cost in (
        ("2026-03-01", "a", 3.0), ("2026-03-01", "b", 1.0), ("2026-03-02", "a", 2.0), ("2026-03-02", "b", None))]
    svg = finance_page._daily_chart(rows, width=460, height=240)
    heights = [float(h) for h in re.findall(r'<rect [^>]*height="([\d.]+)"', svg)]
    assert heights == [150.0, 50.0, 100.0, 0.0], "the peak day (4 USD) is the full 200 px; the rest in proportion"
    assert "4.00 USD<" in svg and "3.00 USD</title>" in svg and "03-01" in svg
    assert finance_page._daily_chart([]) == '<p class="muted">No spend in this range.</p>'


def record(n: int, tenant: str, **fields: Any) -> dict[str, Any]:
    """A ledger record as the writer stores it, at 10:00 UTC today (the page's ranges end with today)."""
    today = datetime.now(UTC).date().isoformat()
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row |= {"id": f"rec-{n}", "request_id": f"req-{n}", "time": f"{today}T10:00:00.{n:06d}Z", "tenant": tenant,
            "key_id": "key-abc", "tier": "standard", "service_class": "standard", "model": "sim-llama-8b",
            "endpoint": "chat", "stream": False, "status": 200, "prompt_tokens": 10, "completion_tokens": 5,
            "cached_tokens": 0, "estimated": False, "cost_usd": 0.000012}
    return row | fields


def exponents(html: str) -> list[str]:
    """Numbers in exponent notation (1e-05, 2.4E+3) in the page's text (its CSS colours aside)."""
    text = re.sub(r"<[^>]*>", " ", re.sub(r"<style>.*?</style>", " ", html, flags=re.S))
    return re.findall(r"(?<![\w.-])[-+]?\d+(?:\.\d+)?[eE][-+]?\d+(?![\w.])", text)


def test_the_page_lists_every_tenant_in_plain_decimals_and_drills_into_its_own_figures(tmp_path: Path) -> None:
    policy = policy_dict(["http://127.0.0.1:9"])
    policy["tenants"]["tiny"] = {"tier": "standard", "keys": [], "budget": {"period": "month", "limit_usd": 0.00001}}
    app = create_app(PolicyStore(PolicySnapshot.build(Policy.model_validate(policy), "test")), tmp_path)
    assert app.gateway.ledger is not None
    app.gateway.ledger.store.insert([
        record(1, "demo", prompt_tokens=1000, completion_tokens=500, cost_usd=0.00003),
        record(2, "demo", model=None, key_id=None, status=400, prompt_tokens=0, completion_tokens=0, cost_usd=0.0),
        record(3, "prem", tags="project=search,user=u1", cost_usd=0.000001),
        record(4, "prem", tags="project=search,user=u1"), record(5, "prem"),
        record(6, "gone", cost_usd=0.25)])  # a tenant that has left the policy

    async def main() -> dict[str, httpx.Response]:
        async with app.app.router.lifespan_context(app.app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:  # type: ignore[arg-type]
            finance = {"authorization": f"Bearer {FINANCE_TOKEN}"}
            return {name: await client.get("/reports", params=params, headers=finance) for name, params in (
                ("all", {"days": "7"}), ("demo", {"days": "7", "tenant": "demo"}),
                ("prem", {"days": "7", "tenant": "prem"}), ("gone", {"days": "7", "tenant": "gone"}),
                ("bad days", {"days": "abc", "tenant": "prem"}))}
    seen = asyncio.run(main())
    page = seen["all"].text
    assert seen["all"].status_code == 200
    tenants = re.findall(r'data-testid="tenant-row"><td><a [^>]*>([^<]+)</a></td><td>(\d+)</td>', page)
    assert tenants == [("gone", "1"), ("demo", "2"), ("prem", "3"), ("bulk", "0"), ("tiny", "0")], \
        "every tenant of the policy, and the one with records that left it; by spend, then name"
    assert exponents(page) == [], "no number in exponent notation"
    assert "0.00 / month" in page and 'data-testid="tenant-cost">0.00<' in page, "to the cent, never 1e-05"
    assert "(refused before a model)" in page and ">None<" not in page
    assert re.search(r'data-testid="tokens-p95">1500<', page), "the gateway's p95: demo's large request"
    demo = seen["demo"].text
    assert re.search(r'data-testid="tokens-p95">1500<', demo) and "(no key)" in demo and ">None<" not in demo
    prem = seen["prem"].text
    assert re.search(r'data-testid="tokens-p95">15<', prem), "prem's own p95, not the gateway's"
    tags = re.findall(r'data-testid="drill-tag"><td>([^<]+)</td><td>(\d+)</td>', prem)
    assert tags == [("(untagged)", "1"), ("project=search,user=u1", "2")], "by cost centre"
    assert 'group_by=tag&amp;tenant=prem&amp;from=' in prem
    assert seen["gone"].status_code == 200 and 'data-testid="drill-title">Tenant gone<' in seen["gone"].text, \
        "a tenant that left the policy is still reportable"
    bad = seen["bad days"]
    assert bad.status_code == 400 and "days takes a whole number of days from 1 to 366, not &#x27;abc&#x27;" in bad.text
    assert 'data-testid="show-days"' in bad.text and 'name="tenant" value="prem"' in bad.text, \
        "the form to put it right, keeping the tenant"
    assert 'data-testid="total-cost"' not in bad.text, "no figures for a period not asked for"
