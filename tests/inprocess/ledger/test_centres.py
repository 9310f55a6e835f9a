"""A statement's cost centres bounded (each tenant's largest, the rest as one line) over a real ledger (SQLite in
tmp_path; PostgreSQL: tests/process/ledger/test_centres.py): the folded lines sum to what the ledger holds, their
GPU cost goes with them, and the one-pass GPU figures are what the report gives each grouping alone; the store's
streamed sums are its sums."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gateway.finance import gpu
from gateway.finance.gpu_costs import OnePass, gather, gather_many
from gateway.ledger import closes
from gateway.ledger.centres import OTHER, Centres
from gateway.ledger.stores import COLUMNS, LedgerStore, SqliteLedger, iter_all
from gateway.ledger.times import at, sortable
from gateway.policy.schema import Policy

WORKER = "http://gpu-a:8000"
POLICY = Policy.model_validate({"allow_empty": True, "pools": {"main": {"workers": [WORKER],
                                                                        "gpu_usd_per_hour": 3.6}}})
FIRST, AFTER = datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC)
START, END = sortable(FIRST), sortable(AFTER)
NOW = datetime(2027, 1, 5, tzinfo=UTC).timestamp()
SUMS = ("requests", "prompt_tokens", "completion_tokens", "cached_tokens", "cache_hits", "errors")


def record(n: int, tenant: str, tags: str | None, cost: float, second: float, model: str = "m-small",
           ran_s: float = 2.0) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    return row | {"id": f"rec-{n:06d}", "request_id": f"req-{n}", "time": at(FIRST.timestamp() + 3600 + second),
                  "tenant": tenant, "tier": "standard", "service_class": "standard", "model": model,
                  "endpoint": "chat", "stream": False, "status": 200 if n % 7 else 500, "prompt_tokens": 10 + n,
                  "completion_tokens": 3 * n, "cached_tokens": n % 3, "estimated": False, "cost_usd": cost,
                  "worker": WORKER, "worker_ms": ran_s * 1000, "total_ms": ran_s * 1000, "tags": tags}


@pytest.fixture(params=["sqlite"])  # tests/process/ledger/test_centres.py runs these on PostgreSQL
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LedgerStore]:
    made = SqliteLedger(tmp_path / "ledger.sqlite3")
    yield made
    made.close()


def month_of_users(store: LedgerStore) -> None:
    """acme: seven end users of falling spend (u0 the most), a tie between u5 and u6 broken by requests, and
    untagged records; beta: two users. Requests overlap on the one worker, so GPU shares are fractions."""
    rows, n = [], 0
    for user, (cost, count) in enumerate(((0.9, 1), (0.5, 2), (0.3, 1), (0.2, 3), (0.1, 1), (0.05, 2), (0.05, 1))):
        for _ in range(count):
            n += 1
            rows.append(record(n, "acme", f"team=t{user % 2},user=u{user}", cost / count, n * 1.5,
                               model="m-large" if n % 2 else "m-small"))
    for i in range(2):
        n += 1
        rows.append(record(n, "acme", None, 0.01, n * 1.5))
        n += 1
        rows.append(record(n, "beta", f"user=b{i}", 0.02, n * 1.5, ran_s=3.0))
    store.insert(rows)


def test_each_tenant_keeps_its_top_cost_centres_and_sums_the_rest_into_one_line(ledger: LedgerStore) -> None:
    month_of_users(ledger)
    assert [(r["tenant"], r["tags"]) for r in ledger.top_tags(START, END, 3)] == [
        ("acme", "team=t0,user=u0"), ("acme", "team=t1,user=u1"), ("acme", "team=t0,user=u2"),
        ("beta", "user=b0"), ("beta", "user=b1")], "by spend; tags as text last"
    tie = [r["tags"] for r in ledger.top_tags(START, END, 6) if r["tenant"] == "acme"]
    assert tie[-1] == "team=t1,user=u5", "spend tied with u6: more requests first"

    view = Centres(ledger, START, END, top=3)
    whole = ledger.totals(START, END, ["tenant", "model", "tag"], None)
    folded = view.totals(START, END, ["tenant", "model", "tag"], None)
    kept = {"team=t0,user=u0", "team=t1,user=u1", "team=t0,user=u2"}
    assert {r["tag"] for r in folded if r["tenant"] == "acme"} == {None, OTHER, *kept}
    assert {r["tag"] for r in folded if r["tenant"] == "beta"} == {"user=b0", "user=b1"}, "two: nothing to fold"
    for tenant in ("acme", "beta"):
        for model in ("m-small", "m-large"):
            mine = [r for r in whole if (r["tenant"], r["model"]) == (tenant, model)]
            shown = [r for r in folded if (r["tenant"], r["model"]) == (tenant, model)]
            for name in SUMS:
                assert sum(r[name] for r in shown) == sum(r[name] for r in mine), (tenant, model, name)
            assert math.fsum(r["cost_usd"] for r in shown) == pytest.approx(math.fsum(r["cost_usd"] for r in mine),
                                                                          abs=1e-12)
    other = [r for r in folded if r["tag"] == OTHER]
    assert sum(r["requests"] for r in other) == 3 + 1 + 2 + 1, "u3, u4, u5 and u6's requests"
    keys = [(r["tenant"], r["model"], r["tag"] or "") for r in folded]
    assert keys == sorted(keys), "in order of the grouped values as text, an absent one first"
    assert view.totals(START, END, ["tenant", "model"], None) == ledger.totals(START, END, ["tenant", "model"], None)


def test_a_statement_with_folded_cost_centres_reconciles_and_their_gpu_cost_goes_with_them(
        ledger: LedgerStore) -> None:
    month_of_users(ledger)
    view = Centres(ledger, START, END, top=3)
    groupings = [["tenant", "model"], ["tenant", "tag"]]
    out = closes.statement(view, "2026-10", ["acme", "beta"], OnePass(ledger, POLICY, [], groupings, view.fold),
                           NOW, [])
    whole = closes.statement(ledger, "2026-10", ["acme", "beta"],
                             lambda start, end, group_by: gather(ledger, POLICY, start, end, group_by, []), NOW, [])
    assert out["by_model"] == whole["by_model"] and out["tenants"] == whole["tenants"], "by model: as it was"
    assert out["total"] == whole["total"] and out["reconciliation"] == whole["reconciliation"]
    acme = [r for r in out["by_cost_centre"] if r["tenant"] == "acme"]
    assert [r["tag"] for r in acme] == [None, OTHER, "team=t0,user=u0", "team=t0,user=u2", "team=t1,user=u1"]
    folded = {"team=t1,user=u3", "team=t0,user=u4", "team=t1,user=u5", "team=t0,user=u6"}
    was = [r for r in whole["by_cost_centre"] if r["tenant"] == "acme" and r["tag"] in folded]
    (other,) = (r for r in acme if r["tag"] == OTHER)
    assert other["requests"] == sum(r["requests"] for r in was) == 7
    assert other["cost_usd"] == pytest.approx(math.fsum(r["cost_usd"] for r in was), abs=1e-9)
    assert other["gpu_cost_usd"] == pytest.approx(math.fsum(r["gpu_cost_usd"] for r in was), abs=3e-6)
    assert other["gpu_cost_usd"] > 0
    for key in ("requests", "prompt_tokens", "completion_tokens", "cached_tokens"):
        assert sum(r[key] for r in out["by_cost_centre"]) == out["total"][key], key
    assert math.fsum(r["cost_usd"] for r in out["by_cost_centre"]) == pytest.approx(out["total"]["cost_usd"],
                                                                                    abs=1e-9)
    assert math.fsum(r["gpu_cost_usd"] for r in out["by_cost_centre"]) == pytest.approx(
        out["total"]["gpu_cost_usd"], abs=1e-5)


def test_one_pass_gives_each_grouping_what_the_report_gives_it_alone(store_path: Path) -> None:
    store = SqliteLedger(store_path)
    month_of_users(store)
    start, end = FIRST.timestamp(), AFTER.timestamp()
    groupings = [["tenant", "model"], ["tenant", "tag"], ["tier"], ["worker", "key"]]
    together = gather_many(store, POLICY, start, end, groupings, [], sizing_too=True)
    for grouping, got in zip(groupings, together, strict=True):
        assert got == gather(store, POLICY, start, end, grouping, []), grouping
    records = [r for page in iter_all(store, START, END, None) for r in page]
    reports = gpu.reports(records, [], POLICY.pools, start, end, groupings)
    for grouping, report in zip(groupings, reports, strict=True):
        assert report.public() == gpu.report(records, [], POLICY.pools, start, end, grouping).public()
    asked = OnePass(store, POLICY, [], groupings[:2])  # a statement's: no cheapest configuration
    assert asked(start, end, ["tenant", "tag"]) == together[1] | {"cheapest": []}
    assert asked(start, end, ["tenant", "model"]) == together[0] | {"cheapest": []}
    assert asked(start, end, ["tier"]) == gather(store, POLICY, start, end, ["tier"], [], False), "not one of its own"
    store.close()


def test_streamed_sums_are_the_stores_sums_in_its_order(ledger: LedgerStore) -> None:
    month_of_users(ledger)
    for group_by in (["tenant", "model", "tag"], ["tag"], ["key"], []):
        chunks = list(ledger.stream_totals(START, END, group_by, None, chunk=2))
        assert [r for chunk in chunks for r in chunk] == ledger.totals(START, END, group_by, None), group_by
        assert all(len(chunk) <= 2 for chunk in chunks)
    assert [r for c in ledger.stream_totals(START, END, ["tag"], "beta", "user=b1") for r in c] == \
        ledger.totals(START, END, ["tag"], "beta", "user=b1")


def test_a_reader_of_a_few_columns_gets_those_with_time_and_id(ledger: LedgerStore) -> None:
    month_of_users(ledger)
    lean = ledger.records(START, END, None, None, 5, columns=["tenant", "stream"])
    assert [set(r) for r in lean] == [{"time", "id", "tenant", "stream"}] * 5 and lean[0]["stream"] is False
    full = ledger.records(START, END, None, None, 5)
    assert [(r["time"], r["id"], r["tenant"]) for r in lean] == [(r["time"], r["id"], r["tenant"]) for r in full]
    with pytest.raises(ValueError, match="no ledger columns"):
        ledger.records(START, END, None, None, 5, columns=["tenant; DROP TABLE ledger"])


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite3"
