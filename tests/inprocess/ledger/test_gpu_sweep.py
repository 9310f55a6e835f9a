"""The GPU report's sweep over a worker's request boundaries, kept in arrays, against the plain reading of the
measure: every boundary as a (moment, kind, request) tuple sorted, ends before starts before a rate change at the
same moment. Random months of requests with many ties and a price change in the middle give the same shares,
to the last bit, and the same busy and paid hours; the cheapest configuration counts the same peaks."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.finance.gpu import Rates, report, union
from gateway.finance.sizing import STEP_S, _peaks
from gateway.ledger.times import at
from gateway.policy.schema import GpuPrice, Pool

A, B = "http://gpu-a:8000", "http://gpu-b:8000"
T0 = datetime(2026, 11, 3, tzinfo=UTC).timestamp()
VERSIONS = [{"effective": "2026-11-01", "usd_per_hour": 2.5}, {"effective": "2026-11-04", "usd_per_hour": 4.0}]


def plain_shares(runs: list[tuple[float, float, str]], rates: Rates) -> tuple[dict[str, list[float]], float, float,
                                                                               list[tuple[float, float]]]:
    """The measure read plainly: (seconds, usd) per tenant, busy seconds and cost, and the busy spans."""
    events = sorted([(a, 1, i) for i, (a, b, _) in enumerate(runs) if b > a]
                    + [(b, 0, i) for i, (a, b, _) in enumerate(runs) if b > a])
    events = sorted(events + [(m, 2, -1) for m in rates.changes(events[0][0], events[-1][0])])
    shares: dict[str, list[float]] = {}
    seconds = usd = busy = busy_usd = 0.0
    entered: dict[int, tuple[float, float]] = {}
    spans: list[tuple[float, float]] = []
    running, now, rate, since = 0, events[0][0], rates.at(events[0][0]), events[0][0]
    for moment, kind, i in events:
        if running and moment > now:
            dt = moment - now
            seconds += dt / running
            usd += dt * rate / 3600 / running
            busy += dt
            busy_usd += dt * rate / 3600
        now = moment
        if kind == 2:
            rate = rates.at(moment)
        elif kind == 1:
            since = moment if running == 0 else since
            running += 1
            entered[i] = (seconds, usd)
        else:
            s0, u0 = entered.pop(i)
            share = shares.setdefault(runs[i][2], [0.0, 0.0])
            share[0] += seconds - s0
            share[1] += usd - u0
            running -= 1
            if running == 0:
                spans.append((since, moment))
    return shares, busy, busy_usd, spans


def month(seed: int) -> list[dict[str, Any]]:
    """Requests on whole seconds (so many start and end together), some of no length, some across the price
    change and the period's edges, on two workers and none."""
    rng = random.Random(seed)
    out = []
    for n in range(400):
        began = T0 + rng.randrange(-600, 3 * 86400, 30) + rng.choice((0, 0, 10, 20))
        length = rng.choice((0, 10, 20, 30, 600, 3600))
        worker = rng.choice((A, A, B, None))
        out.append({"time": at(began + length), "worker": worker, "worker_ms": length * 1000.0, "status": 200,
                    "tenant": f"t{n % 5}", "tier": "standard", "prompt_tokens": 1, "completion_tokens": 1,
                    "cost_usd": 0.001, "ttft_ms": 5.0})
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_sweep_in_arrays_gives_the_plain_readings_shares_to_the_last_bit(seed: int) -> None:
    records = month(seed)
    pools = {"gpu": Pool(workers=[A, B], gpu_usd_per_hour=[GpuPrice.model_validate(v) for v in VERSIONS])}
    start, end = T0, T0 + 2.5 * 86400
    rates = Rates(pools["gpu"].gpu_usd_per_hour)
    got = report(records, [], pools, start, end, ["tenant"])
    expected: dict[str, list[float]] = {}
    for worker in (A, B):
        runs = []
        for r in records:
            finished = datetime.fromisoformat(r["time"]).timestamp()
            began = finished - r["worker_ms"] / 1000
            if r["worker"] == worker and finished >= start and began < end:
                runs.append((max(began, start), min(finished, end), r["tenant"]))
        shares, busy, busy_usd, spans = plain_shares(runs, rates)
        hours = got.workers[worker]
        assert (hours.busy_s, hours.busy_cost_usd) == (busy, busy_usd), worker
        assert list(zip(hours.busy_starts, hours.busy_ends, strict=True)) == spans, worker
        paid = union(spans)
        assert hours.configured == (paid[0][0], paid[-1][1])
        assert hours.configured_s == math.fsum(b - a for a, b in paid)
        assert hours.cost_usd == math.fsum(rates.cost(a, b) for a, b in paid)
        for tenant, (seconds, usd) in shares.items():
            into = expected.setdefault(tenant, [0.0, 0.0])
            into[0] += seconds
            into[1] += usd
    rows = {row.key[0]: row for row in got.rows.values()}
    for tenant, row in rows.items():  # each worker's shares added in the order of the workers' first requests
        assert row.gpu_seconds == pytest.approx(expected.get(tenant, [0.0])[0], rel=1e-12, abs=1e-9), tenant
        assert row.gpu_cost_usd == pytest.approx(expected.get(tenant, [0.0, 0.0])[1], rel=1e-12, abs=1e-12)


def test_peaks_count_an_end_before_a_start_at_the_same_moment() -> None:
    assert _peaks([(0, 30), (30, 60)], 0, 2 * STEP_S) == [1, 1], "one after the other, never two"
    assert _peaks([(0, 31), (30, 60)], 0, 2 * STEP_S) == [1, 2], "two at once from 30 s, in the second step"
    assert _peaks([(5, 5), (0, 100)], 0, STEP_S) == [1], "one of no length ends as it starts"
