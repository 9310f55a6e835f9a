"""The cheapest configuration: measured concurrency replayed through the pool's own scaling rules."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.finance.gpu import report
from gateway.finance.sizing import STEP_S, _peaks, cheapest
from gateway.policy.schema import Policy
from tests.inprocess.ledger.test_gpu import T0, A, B, presence, record


def policy(**autoscaling: Any) -> Policy:
    return Policy.model_validate({"allow_empty": True, "pools": {"gpu": {
        "workers": [A, B], "gpu_usd_per_hour": 3.6, "autoscaling": autoscaling}}})


def test_peaks_hold_the_running_count_across_quiet_steps() -> None:
    assert _peaks([(0, 100), (10, 20)], 0, 4 * STEP_S) == [2, 1, 1, 1]
    assert _peaks([], 0, 2 * STEP_S) == [0, 0]


def test_two_workers_half_used_would_have_been_one() -> None:
    # A once ran 4 at once (its capacity, as far as anyone saw); after that each worker ran 1 at a time, in
    # turn: one worker at a quarter of its slots would have held all of it
    records = [record("t", A, 0, 10) for _ in range(4)]
    records += [record("t", A, i * 120, i * 120 + 60) for i in range(1, 10)]
    records += [record("t", B, i * 120 + 60, i * 120 + 120) for i in range(1, 10)]
    spans = [presence(A, 0, 1200), presence(B, 0, 1200)]
    rules = policy(min_workers=1, quiet_in_s=60, cooldown_s=0)
    (sizing,) = cheapest(report(records, spans, rules.pools, T0, T0 + 1200, ["tenant"]), rules)
    out = sizing.public()
    assert out["capacity_per_worker"] == 4 and out["workers_ran"] == pytest.approx(2)
    assert out["workers_needed"] < 1.5
    assert out["saving_usd"] > 0
    assert out["meets_slo"]
