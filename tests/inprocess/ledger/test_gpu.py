"""The GPU report's arithmetic: shares of busy time, idle as its own row, reconciliation, price versions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.finance.gpu import IDLE, Rates, report, union
from gateway.ledger.times import at
from gateway.policy.schema import GpuPrice, Pool

T0 = datetime(2026, 11, 3, 10, tzinfo=UTC).timestamp()
A, B = "http://gpu-a:8000", "http://gpu-b:8000"


def pools(rate: Any = 3.6) -> dict[str, Pool]:
    return {"gpu": Pool(workers=[A, B], gpu_usd_per_hour=rate)}


def record(tenant: str, worker: str | None, began: float, ended: float, completion: int = 10,
           status: int = 200, **extra: Any) -> dict[str, Any]:
    return {"time": at(T0 + ended), "worker": worker, "worker_ms": (ended - began) * 1000, "tenant": tenant,
            "model": "m", "tier": "standard", "service_class": "standard", "tags": None, "key_id": None,
            "status": status, "prompt_tokens": 5, "completion_tokens": completion, "cost_usd": 0.001, **extra}


def presence(worker: str, since: float, until: float, up: bool = True, replica: str = "r1") -> dict[str, Any]:
    return {"id": f"{replica}:{worker}:{since}", "replica": replica, "worker": worker, "pool": "gpu", "up": up,
            "since": at(T0 + since), "until": at(T0 + until)}


def by_tenant(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["tenant"]: r for r in data["data"] if r["kind"] == "usage"}


def test_a_moment_is_shared_among_the_requests_running_then() -> None:
    # one worker, 100 s present at $3.60/h (a cent a second... a thousandth of a dollar per second)
    records = [record("light", A, 0, 10), record("heavy", A, 0, 30)]
    data = report(records, [presence(A, 0, 100)], pools(), T0, T0 + 100, ["tenant"]).public()
    rows = by_tenant(data)
    # 0-10 s: two running, 5 s each; 10-30 s: heavy alone
    assert rows["light"]["gpu_seconds"] == pytest.approx(5)
    assert rows["heavy"]["gpu_seconds"] == pytest.approx(25)
    assert rows["heavy"]["gpu_cost_usd"] == pytest.approx(0.025, abs=1e-6)
    (worker,) = data["workers"]
    assert worker["busy_hours"] == pytest.approx(30 / 3600, abs=1e-6)
    assert worker["configured_hours"] == pytest.approx(100 / 3600, abs=1e-6)
    idle = [r for r in data["data"] if r["kind"] == "idle"]
    assert [(r["tenant"], r["worker"], r["gpu_cost_usd"]) for r in idle] == [(IDLE, A, pytest.approx(0.07))]
    rec = data["reconciliation"]
    assert rec["workers_cost_usd"] == pytest.approx(0.1)
    assert rec["attributed_usd"] + rec["idle_usd"] == pytest.approx(rec["workers_cost_usd"], abs=1e-9)


def test_three_times_the_decode_pays_three_times_on_a_shared_batch() -> None:
    records = []
    for i in range(40):  # a request of each every 5 s, the heavy one three times as long: 1 + 3 in the batch
        records += [record("light", A, i * 5, i * 5 + 5), record("heavy", A, i * 5, i * 5 + 15)]
    rows = by_tenant(report(records, [presence(A, 0, 800)], pools(), T0 + 15, T0 + 200, ["tenant"]).public())
    assert rows["heavy"]["gpu_cost_usd"] / rows["light"]["gpu_cost_usd"] == pytest.approx(3)


def test_a_request_alone_on_its_worker_holds_it_whole() -> None:
    records = [record("light", A, 0, 5), record("heavy", A, 0, 15)]
    rows = by_tenant(report(records, [presence(A, 0, 100)], pools(), T0, T0 + 100, ["tenant"]).public())
    assert rows["light"]["gpu_seconds"] == pytest.approx(2.5)
    assert rows["heavy"]["gpu_seconds"] == pytest.approx(2.5 + 10)


def test_a_worker_is_paid_for_while_down_and_busy_time_outside_presence_counts() -> None:
    spans = [presence(A, 0, 50, up=True), presence(A, 50, 100, up=False), presence(B, 0, 100, replica="r2")]
    records = [record("t", B, 120, 130)]  # B answered after its presence ended: it was there
    data = report(records, spans, pools(), T0, T0 + 200, ["tenant"]).public()
    workers = {w["worker"]: w for w in data["workers"]}
    assert workers[A]["down_hours"] == pytest.approx(50 / 3600, abs=1e-6)
    assert workers[A]["configured_hours"] == pytest.approx(100 / 3600, abs=1e-6)
    assert workers[B]["configured_hours"] == pytest.approx(110 / 3600, abs=1e-6)
    rec = data["reconciliation"]
    assert abs(rec["difference_usd"]) < 1e-9


def test_replicas_spans_are_united_not_added() -> None:
    spans = [presence(A, 0, 60, replica="r1"), presence(A, 30, 90, replica="r2")]
    data = report([], spans, pools(), T0, T0 + 100, ["tenant"]).public()
    assert data["workers"][0]["configured_hours"] == pytest.approx(90 / 3600, abs=1e-6)


def test_a_request_across_the_period_edge_counts_its_part_inside() -> None:
    records = [record("t", A, -10, 10)]
    inside = report(records, [presence(A, -100, 100)], pools(), T0, T0 + 100, ["tenant"]).public()
    before = report(records, [presence(A, -100, 100)], pools(), T0 - 100, T0, ["tenant"]).public()
    assert by_tenant(inside)["t"]["gpu_seconds"] == pytest.approx(10)
    assert by_tenant(inside)["t"]["requests"] == 1  # it ended inside
    assert by_tenant(before)["t"]["gpu_seconds"] == pytest.approx(10)
    assert by_tenant(before)["t"]["requests"] == 0


def test_a_price_version_never_reprices_the_past() -> None:
    change = datetime(2026, 11, 4, tzinfo=UTC)
    versions = [{"effective": "2026-11-01", "usd_per_hour": 1.0}, {"effective": "2026-11-04", "usd_per_hour": 2.0}]
    rates = Rates([GpuPrice.model_validate(v) for v in versions])
    day = 86400
    assert rates.cost(change.timestamp() - day, change.timestamp() + day) == pytest.approx(24 + 48)
    # a request spanning the change pays each side at its own rate
    records = [record("t", A, change.timestamp() - T0 - 1800, change.timestamp() - T0 + 1800)]
    data = report(records, [], pools(versions), T0, T0 + 2 * day, ["tenant"]).public()
    assert by_tenant(data)["t"]["gpu_cost_usd"] == pytest.approx(0.5 + 1.0)


def test_cache_hits_and_refusals_count_as_requests_with_no_gpu_share() -> None:
    records = [record("t", None, 0, 0), record("t", A, 0, 10), record("t", None, 1, 1, status=429)]
    row = by_tenant(report(records, [presence(A, 0, 10)], pools(), T0, T0 + 11, ["tenant"]).public())["t"]
    assert (row["requests"], row["successful_requests"]) == (3, 2)
    assert row["gpu_cost_per_1k_requests"] == pytest.approx(row["gpu_cost_usd"] * 500)


def test_union_merges_overlaps_and_drops_empty_spans() -> None:
    assert union([(5, 6), (0, 2), (1, 3), (4, 4)]) == [(0, 2 + 1), (5, 6)]
