"""The GPU gauges: fed from a report over a real SQLite ledger, fleet-wide figures by worker and tier."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.finance.gpu_costs import gather, publish
from gateway.ledger.stores import SqliteLedger
from gateway.ops.metrics import GatewayMetrics
from gateway.policy.schema import Policy
from tests.inprocess.ledger.test_gpu import T0, A, B, presence, record


def value(metrics: GatewayMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_the_gauges_show_busy_and_idle_seconds_per_worker_and_cost_per_1k_per_tier(tmp_path: Path) -> None:
    store = SqliteLedger(tmp_path / "ledger.sqlite3")
    rows = [record("t", A, 0, 10, id=f"r{i}", request_id=f"q{i}", endpoint="chat", stream=False, error=None,
                   cached_tokens=0, cache=None, estimated=False, batch=None, price_version=None, queue_wait_ms=0.0,
                   ttft_ms=5.0, total_ms=10000.0) for i in range(2)]
    store.insert(rows)
    store.extend_presence([presence(A, 0, 100), presence(B, 0, 100, replica="r2")])
    policy = Policy.model_validate({"allow_empty": True, "pools": {"gpu": {"workers": [A, B],
                                                                            "gpu_usd_per_hour": 3.6}}})
    metrics = GatewayMetrics()
    publish(metrics, gather(store, policy, T0, T0 + 100, ["tier"], []))
    assert value(metrics, "tollgate_gpu_busy_seconds", pool="gpu", worker=A) == pytest.approx(10, abs=0.01)
    assert value(metrics, "tollgate_gpu_idle_seconds", pool="gpu", worker=A) == pytest.approx(90, abs=0.01)
    assert value(metrics, "tollgate_gpu_idle_seconds", pool="gpu", worker=B) == pytest.approx(100, abs=0.01)
    # 10 s at $3.60/h is a cent, shared by two requests: $5 per 1,000
    assert value(metrics, "tollgate_gpu_cost_per_1k_requests_usd", tier="standard") == pytest.approx(5.0, abs=0.01)
