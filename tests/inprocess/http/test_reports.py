"""The report API in-process: its parameters (each wrong one refused with a 400 naming it), money as plain decimals
in its CSVs, download names that carry the period, filters and grouping, every tenant listed with zeros, the tag
filter, and the store queries behind them on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import csv
import io
import math
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.requests import Request

from gateway.errors import InvalidRequest
from gateway.finance.reports import cell
from gateway.http.app import HotPaths, create_app
from gateway.http.reports import download_name, parse_tag, period_label, time_range
from gateway.ledger.prices import plain
from gateway.ledger.stores import COLUMNS, OPEN_END, OPEN_START, SqliteLedger
from gateway.policy.loader import PolicySnapshot, PolicyStore
from gateway.policy.schema import Policy
from tests.conftest import DEMO_KEY, FINANCE_TOKEN, policy_dict

EXPONENT = re.compile(r"\d[eE][-+]?\d")


def asking(query: str) -> Request:
    """A Starlette request with only a query string: what the parse helpers read."""
    return Request({"type": "http", "method": "GET", "path": "/", "query_string": query.encode(), "headers": []})


def record(n: int, tenant: str, time: str = "2026-11-10T10:00:00", **fields: Any) -> dict[str, Any]:
    """A ledger record as the writer stores it."""
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row |= {"id": f"rec-{n:04d}", "request_id": f"req-{n}", "time": f"{time}.{n:06d}Z", "tenant": tenant,
            "key_id": "key-abc", "tier": "standard", "service_class": "standard", "model": "sim-llama-8b",
            "endpoint": "chat", "stream": False, "status": 200, "prompt_tokens": 10, "completion_tokens": 5,
            "cached_tokens": 0, "estimated": False, "cost_usd": 0.000024, "total_ms": 0.00005}
    return row | fields


# -- plain decimals ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "text"), [
    (1e-05, "0.00001"), (0.000024, "0.000024"), (0.0, "0.00"), (12, "12.00"), (0.5, "0.50"), (0.01, "0.01"),
    (123.456789012, "123.456789012"), (1e16, "10000000000000000.00"), (-2.5e-7, "-0.00000025"),
    (Decimal("1E-9"), "0.000000001"), (3.2e-10, "0.00000000032")])
def test_money_is_a_plain_decimal_with_at_least_cents(value: float | Decimal, text: str) -> None:
    assert plain(value) == text


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_float_reads_back_as_itself_without_an_exponent(value: float) -> None:
    text = plain(value)
    assert not EXPONENT.search(text) and "e" not in text.lower() and float(text) == value


def test_a_csv_cell_is_empty_for_nothing_and_plain_for_a_number() -> None:
    assert [cell(v) for v in (None, True, False, 2.4e-05, 7, "key-1")] == ["", "true", "false", "0.000024", 7,
                                                                          "key-1"]


def test_a_csv_cell_never_starts_a_formula_but_a_negative_amount_stays_a_number() -> None:
    assert [cell(v) for v in ("=HYPERLINK(\"x\")", "+1", "-rm", "@SUM(A1)", "\tx", -0.5)] == [
        "'=HYPERLINK(\"x\")", "'+1", "'-rm", "'@SUM(A1)", "'\tx", "-0.50"]


# -- parameters ----------------------------------------------------------------------------------------------

def test_a_month_is_its_first_moment_to_the_next_months() -> None:
    assert time_range(asking("month=2026-11")) == ("2026-11-01T00:00:00.000000Z", "2026-12-01T00:00:00.000000Z")
    assert time_range(asking("month=2026-12"))[1] == "2027-01-01T00:00:00.000000Z", "a year rolls over"
    assert time_range(asking("from=2026-11-01&to=2026-11-30")) == ("2026-11-01T00:00:00.000000Z",
                                                                   "2026-12-01T00:00:00.000000Z")
    assert time_range(asking("")) == (OPEN_START, OPEN_END)
    assert time_range(asking("from=2026-11-05&to=2026-11-05"))[0] == "2026-11-05T00:00:00.000000Z", \
        "one whole day: a date as to includes it"


@pytest.mark.parametrize(("query", "param", "says"), [
    ("from=2026-11-30&to=2026-11-01", "from", "must come before to"),
    ("from=2026-11-05T10:00:00Z&to=2026-11-05T10:00:00Z", "from", "must come before to"),
    ("from=2026-12-01&to=2026-11-30T23:00:00Z", "from", "must come before to"),
    ("month=2026-13", "month", "YYYY-MM"), ("month=abc", "month", "not 'abc'"), ("month=1969-12", "month", "1970"),
    ("month=2026-11&from=2026-11-01", "month", "not both"), ("month=2026-11&to=2026-11-30", "month", "not both"),
    ("from=yesterday", "from", "ISO date"), ("to=2026-02-30", "to", "ISO date")])
def test_a_range_that_cannot_be_reported_is_refused_naming_its_parameter(query: str, param: str, says: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        time_range(asking(query))
    assert refused.value.param == param and says in refused.value.message, refused.value.message


def test_a_tag_is_one_key_value_pair() -> None:
    assert parse_tag(asking("tag=project%3Dsearch")) == "project=search"
    assert parse_tag(asking("tag=Project%3D%20search%20")) == "project=search", "as records carry it"
    assert parse_tag(asking("")) is None and parse_tag(asking("tag=")) is None
    for bad in ("project", "=search", "project=", " = ", "a=1,b=2", "a=b=c", "k=" + "v" * 300):
        with pytest.raises(InvalidRequest) as refused:
            parse_tag(asking("tag=" + bad.replace("=", "%3D").replace(",", "%2C")))
        assert refused.value.param == "tag" and "key=value" in refused.value.message, bad


def test_a_download_is_named_for_its_period_filters_and_grouping() -> None:
    november = time_range(asking("from=2026-11-01&to=2026-11-30"))
    assert download_name("costs", *november, group_by=["tenant"]) == "costs_2026-11-01_2026-11-30_by-tenant.csv"
    assert download_name("costs", *time_range(asking("month=2026-11")), month="2026-11", tenant="acme",
                         group_by=["model"]) == "costs_2026-11_acme_by-model.csv"
    assert download_name("ledger", *november) == "ledger_2026-11-01_2026-11-30.csv"
    assert download_name("costs", OPEN_START, OPEN_END, group_by=["day", "tenant"]) == "costs_all_by-day-tenant.csv"
    assert download_name("ledger", *november, tenant='a"b/é;x', tag="project=search") == \
        "ledger_2026-11-01_2026-11-30_a_b___x_project_search.csv", "reduced to [A-Za-z0-9._-]"
    assert period_label("2026-11-01T00:00:00.000000Z", OPEN_END) == "2026-11-01_all"
    assert period_label(OPEN_START, "2026-11-30T12:00:00.000000Z") == "all_2026-11-30"
    assert period_label(OPEN_START, "2026-12-01T00:00:00.000000Z") == "all_2026-11-30", "the end is exclusive"


# -- the API -------------------------------------------------------------------------------------------------

def app_with_records(data_dir: Path) -> HotPaths:
    data_dir.mkdir(exist_ok=True)
    app = create_app(PolicyStore(PolicySnapshot.build(Policy.model_validate(policy_dict(["http://127.0.0.1:9"])),
                                                      "test")), data_dir)
    assert app.gateway.ledger is not None
    app.gateway.ledger.store.insert([
        record(1, "demo", tags="project=search,user=u1"), record(2, "demo", tags="project=Search"),
        record(3, "demo", model=None, key_id=None, status=400, prompt_tokens=0, completion_tokens=0, cost_usd=0.0),
        record(4, "prem", time="2026-11-20T08:00:00", cost_usd=0.00001, tags="project=search"),
        record(5, "ac me/é", time="2026-10-31T23:00:00", cost_usd=0.5),  # a tenant that has left the policy
    ])
    return app


def fetch(app: HotPaths, *asks: tuple[str, dict[str, str]], key: str = FINANCE_TOKEN) -> list[httpx.Response]:
    async def main() -> list[httpx.Response]:
        async with app.app.router.lifespan_context(app.app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:  # type: ignore[arg-type]
            return [await client.get(path, params=params, headers={"authorization": f"Bearer {key}"})
                    for path, params in asks]
    return asyncio.run(main())


COSTS, LEDGER = "/admin/reports/costs", "/admin/ledger"


def test_costs_by_tenant_list_every_tenant_of_the_policy_with_zeros(tmp_path: Path) -> None:
    by_tenant, one, gone, by_model = fetch(app_with_records(tmp_path), (COSTS, {"group_by": "tenant"}),
                                           (COSTS, {"group_by": "tenant", "tenant": "bulk"}),
                                           (COSTS, {"group_by": "tenant", "tenant": "ac me/é"}),
                                           (COSTS, {"group_by": "model", "month": "2026-11"}))
    rows = {r["tenant"]: r for r in by_tenant.json()["data"]}
    assert list(rows) == ["ac me/é", "demo", "prem", "bulk"], \
        "the tenants with records (the one that left the policy too), then the rest of the policy's at zero"
    assert rows["bulk"] == {"tenant": "bulk", "requests": 0, "prompt_tokens": 0, "completion_tokens": 0,
                                 "cached_tokens": 0, "cost_usd": 0.0, "cache_hits": 0, "cache_saved_tokens": 0,
                                 "errors": 0, "cost_per_1k_requests_usd": 0.0, "tokens_per_request": 0.0}
    assert rows["demo"]["requests"] == 3 and by_tenant.json()["total"]["requests"] == 5
    assert [r["tenant"] for r in one.json()["data"]] == ["bulk"], "a tenant filter lists that tenant alone"
    assert gone.status_code == 200 and gone.json()["data"][0]["cost_usd"] == 0.5, \
        "a tenant that left the policy is still reportable"
    assert [r["model"] for r in by_model.json()["data"]] == [None, "sim-llama-8b"], "only other groups list zeros"
    assert by_model.json()["total"]["requests"] == 4, "month=2026-11 leaves October's record out"


def test_each_parameter_the_report_cannot_honour_is_a_400_naming_it(tmp_path: Path) -> None:
    asks = [
        ((COSTS, {"from": "2026-11-30", "to": "2026-11-01"}), "from", "must come before to"),
        ((LEDGER, {"from": "2026-11-30", "to": "2026-11-01"}), "from", "must come before to"),
        ((COSTS, {"month": "2026-13"}), "month", "YYYY-MM"),
        ((COSTS, {"month": "abc"}), "month", "YYYY-MM"),
        ((COSTS, {"month": "2026-11", "from": "2026-11-01"}), "month", "not both"),
        ((COSTS, {"tenant": "nobody"}), "tenant", "bulk, demo, prem"),
        ((LEDGER, {"tenant": "nobody", "format": "csv"}), "tenant", "records of"),
        ((COSTS, {"tag": "project"}), "tag", "key=value"),
        ((LEDGER, {"tag": "a=1,b=2"}), "tag", "key=value"),
        ((COSTS, {"group_by": "tenant,planet"}), "group_by", "distinct names"),
        ((COSTS, {"format": "xlsx"}), "format", "json or csv"),
    ]
    for (ask, param, says), reply in zip(asks, fetch(app_with_records(tmp_path), *(a for a, _, _ in asks)),
                                         strict=True):
        error = reply.json()["error"]
        assert reply.status_code == 400 and error["param"] == param and says in error["message"], (ask, error)
        assert error["type"] == "invalid_request_error", error
    usage, = fetch(app_with_records(tmp_path / "u"), ("/v1/usage", {"month": "2026-13"}), key=DEMO_KEY)
    assert usage.status_code == 400 and usage.json()["error"]["param"] == "month"


def test_the_csvs_are_named_for_what_they_hold_in_plain_decimals_with_empty_cells_for_nothing(tmp_path: Path) -> None:
    by_tenant, month, records, everything, gone = fetch(
        app_with_records(tmp_path),
        (COSTS, {"format": "csv", "group_by": "tenant", "from": "2026-11-01", "to": "2026-11-30"}),
        (COSTS, {"format": "csv", "group_by": "model,key", "month": "2026-11", "tenant": "demo"}),
        (LEDGER, {"format": "csv", "from": "2026-11-01", "to": "2026-11-30"}),
        (LEDGER, {"format": "csv"}),
        (COSTS, {"format": "csv", "group_by": "day", "tenant": "ac me/é"}))
    disposition = [r.headers["content-disposition"] for r in (by_tenant, month, records, everything, gone)]
    assert disposition == ['attachment; filename="costs_2026-11-01_2026-11-30_by-tenant.csv"',
                           'attachment; filename="costs_2026-11_demo_by-model-key.csv"',
                           'attachment; filename="ledger_2026-11-01_2026-11-30.csv"',
                           'attachment; filename="ledger_all.csv"',
                           'attachment; filename="costs_all_ac_me___by-day.csv"']
    for reply in (by_tenant, month, records, everything):
        assert reply.status_code == 200 and not EXPONENT.search(reply.text), reply.text
    tenants = {r["tenant"]: r for r in csv.DictReader(io.StringIO(by_tenant.text))}
    assert list(tenants) == ["demo", "prem", "bulk"] and tenants["bulk"]["cost_usd"] == "0.00", \
        "the policy's tenants; one that left it, only with records in the range"
    assert tenants["prem"]["cost_usd"] == "0.00001" and tenants["prem"]["cost_per_1k_requests_usd"] == "0.01"
    rows = list(csv.DictReader(io.StringIO(month.text)))
    assert [(r["model"], r["key_id"]) for r in rows] == [("", ""), ("sim-llama-8b", "key-abc")], \
        "a refused request's model and key are empty cells, not 'None'"
    ledger_rows = list(csv.DictReader(io.StringIO(records.text)))
    assert len(ledger_rows) == 4 and {r["total_ms"] for r in ledger_rows} == {"0.00005"}
    assert "None" not in records.text and {r["stream"] for r in ledger_rows} == {"false"}
    assert len(list(csv.DictReader(io.StringIO(everything.text)))) == 5


def test_a_tag_filters_to_records_holding_that_exact_pair(tmp_path: Path) -> None:
    costs, by_tag, records, other_case = fetch(app_with_records(tmp_path),
                                               (COSTS, {"group_by": "tenant", "tag": "project=search"}),
                                               (COSTS, {"group_by": "tag", "tenant": "demo"}),
                                               (LEDGER, {"tag": "project=search", "format": "csv"}),
                                               (COSTS, {"group_by": "", "tag": "project=Search"}))
    usage, = fetch(app_with_records(tmp_path / "u"), ("/v1/usage", {"tag": "user=u1"}), key=DEMO_KEY)
    rows = {r["tenant"]: r["requests"] for r in costs.json()["data"]}
    assert rows == {"bulk": 0, "demo": 1, "prem": 1}, "project=search, not project=Search"
    assert [(r["tag"], r["requests"]) for r in by_tag.json()["data"]] == [
        (None, 1), ("project=Search", 1), ("project=search,user=u1", 1)]
    assert [r["request_id"] for r in csv.DictReader(io.StringIO(records.text))] == ["req-1", "req-4"]
    assert records.headers["content-disposition"] == 'attachment; filename="ledger_all_project_search.csv"'
    assert other_case.json()["total"]["requests"] == 1, "matched case-sensitively"
    assert usage.json()["total"]["requests"] == 1 and usage.json()["tenant"] == "demo"


# -- the store's queries (on PostgreSQL too: tests/process/http/test_reports.py) ------------------------------

@pytest.fixture(params=["sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    made = SqliteLedger(tmp_path / "ledger.sqlite3")
    yield made
    made.close()


def test_the_tag_filter_and_a_tenants_own_percentile_in_the_database(store: Any) -> None:
    store.insert([record(1, "a", tags="project=search,user=u1"), record(2, "a", tags="xproject=search"),
                  record(3, "a", tags="project=searches"), record(4, "b", tags="user=u1,project=search"),
                  record(5, "b", tags=None, prompt_tokens=900, completion_tokens=100),
                  record(6, "a", tags="project=Search")])
    assert [r["id"] for r in store.records(OPEN_START, OPEN_END, None, None, 10, "project=search")] == \
        ["rec-0001", "rec-0004"]
    assert [r["id"] for r in store.records(OPEN_START, OPEN_END, "b", None, 10, "user=u1")] == ["rec-0004"]
    assert store.totals(OPEN_START, OPEN_END, [], None, "project=search")[0]["requests"] == 2
    assert store.totals(OPEN_START, OPEN_END, [], None)[0]["requests"] == 6, "no tag: every record"
    assert store.tokens_percentile(OPEN_START, OPEN_END, 95) == 1000, "the gateway's p95: b's large request"
    assert store.tokens_percentile(OPEN_START, OPEN_END, 95, "a") == 15, "a's own"
    assert store.tokens_percentile(OPEN_START, OPEN_END, 95, "nobody") is None
    assert math.isclose(store.totals(OPEN_START, OPEN_END, ["tenant"], "b")[0]["cost_usd"], 0.000048)
