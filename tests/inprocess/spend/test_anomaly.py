"""A tenant's cost baseline: the rule's default until it has enough requests, no request moving it by more
than RAMP baselines (a slow step-up is still caught), a restart seeded from the ledger, and the spend-rate rule
alerting once an hour over k times the usual hour."""

from __future__ import annotations

import pytest

from gateway.policy.schema import AnomalyRule
from gateway.spend.anomaly import RAMP, Baselines

RULE = AnomalyRule(k=10, default_baseline_usd=0.001, min_samples=3)
HOUR = 3600.0


def test_the_default_baseline_stands_until_the_tenant_has_enough_requests() -> None:
    seen = Baselines()
    for _ in range(RULE.min_samples - 1):
        seen.observe("t", 0.0015, RULE)
    assert seen.known("t") and seen.baseline("t", RULE) == RULE.default_baseline_usd
    seen.observe("t", 0.0015, RULE)
    assert seen.baseline("t", RULE) == 0.0015, "a plain mean while warming up"
    assert not seen.known("other") and seen.baseline("other", RULE) == RULE.default_baseline_usd


def test_no_request_moves_the_baseline_by_more_than_ramp_baselines() -> None:
    seen = Baselines()
    for _ in range(RULE.min_samples):
        seen.observe("t", 0.001, RULE)
    seen.observe("t", 1_000.0, RULE)  # one huge request counts as RAMP baselines, not a thousand dollars
    counted = 0.001 * RAMP
    assert seen.baseline("t", RULE) == pytest.approx(0.001 + (counted - 0.001) / (RULE.min_samples + 1))


def test_a_tenant_stepping_up_just_under_k_takes_many_requests_to_move_its_baseline() -> None:
    seen = Baselines()
    for _ in range(RULE.min_samples):
        seen.observe("t", 0.001, RULE)
    steps = 0
    while seen.baseline("t", RULE) < 1.0 and steps < 10_000:  # each request just under k x the baseline
        seen.observe("t", seen.baseline("t", RULE) * RULE.k * 0.99, RULE)
        steps += 1
    assert steps > 100, f"a thousand-fold step-up in {steps} requests"


def test_a_seed_starts_a_tenant_but_never_overwrites_what_this_process_saw() -> None:
    seen = Baselines()
    seen.seed("t", 0.02, samples=50)
    assert seen.baseline("t", RULE) == 0.02
    seen.seed("t", 9.0, samples=50)
    assert seen.baseline("t", RULE) == 0.02
    seen.seed("few", 0.02, samples=1)
    assert seen.baseline("few", RULE) == RULE.default_baseline_usd, "a seed of too few requests is not trusted"


def test_spend_rate_alerts_once_an_hour_over_k_times_the_usual_and_needs_three_hours() -> None:
    seen = Baselines()
    for hour in range(2):
        assert seen.spend_rate_anomaly("t", 1.0, hour * HOUR, k=5) is None
    assert seen.spend_rate_anomaly("t", 100.0, 2 * HOUR, k=5) is None, "two hours of history are too few"
    assert seen.spend_rate_anomaly("t", 1.0, 3 * HOUR, k=5) is None
    usual = (1.0 + 1.0 + 100.0 + 1.0) / 4  # the mean of the previous hours with spend
    assert seen.spend_rate_anomaly("t", 5 * usual, 4 * HOUR, k=5) is None, "at k x, not over it"
    assert seen.spend_rate_anomaly("t", 1.0, 4 * HOUR + 10, k=5) == (5 * usual + 1.0, usual)
    assert seen.spend_rate_anomaly("t", 50.0, 4 * HOUR + 20, k=5) is None, "once this hour"
    assert seen.spend_rate_anomaly("other", 1_000.0, 4 * HOUR, k=5) is None, "each tenant its own history"
