"""The cheapest configuration that meets the SLO: the workers the scaling signal would have run for the traffic
a GPU report saw, and what they would have cost, beside what ran.

The traffic is the pool's measured concurrency (requests running on its workers, from the ledger) in 30-second
steps. The most requests seen running on one of the pool's workers at once is taken as a worker at the
scale-out mark (``kv_out``, 80%): the ledger shows what the workers held, not how much more they could have
(reading that peak as full would call every pool short at its own peak). Each step is fed to the pool's own
``ScaleRules`` (gateway.ops.scaling), so the answer keeps the sources' rules, cooldown and scale-in quiet period
included: KV usage is read as the share of the workers' slots in use and the queue as the requests beyond them.
What ran meets the SLO when each tier's TTFT p95 on the pool is within its objective; when it missed, the count
is a floor (the ledger cannot say how many more would have met it), and the page says so.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.finance.gpu import GpuReport, Rates
from gateway.ops.scaling import ScaleRules, Signals
from gateway.policy.schema import Policy

STEP_S = 30.0


@dataclass(frozen=True, slots=True)
class Sizing:
    pool: str
    capacity_per_worker: int
    peak_running: int
    workers_ran: float  # mean over the period
    cost_ran_usd: float
    workers_needed: float  # mean over the period, as the scaling signal would have run them
    cost_needed_usd: float
    ttft_p95_ms: dict[str, float]  # by tier, what ran
    meets_slo: bool

    def public(self) -> dict[str, Any]:
        return {"pool": self.pool, "capacity_per_worker": self.capacity_per_worker,
                "peak_running": self.peak_running, "workers_ran": round(self.workers_ran, 3),
                "cost_ran_usd": round(self.cost_ran_usd, 6), "workers_needed": round(self.workers_needed, 3),
                "cost_needed_usd": round(self.cost_needed_usd, 6),
                "saving_usd": round(self.cost_ran_usd - self.cost_needed_usd, 6) + 0.0,  # never -0.0
                "ttft_p95_ms": {t: round(v, 1) for t, v in self.ttft_p95_ms.items()}, "meets_slo": self.meets_slo}


def cheapest(report: GpuReport, policy: Policy) -> list[Sizing]:
    """Per pool, over the part of the period its workers were paid for (a pool set up mid-month is sized for
    the days it ran, not the whole month)."""
    out = []
    for name, spec in policy.pools.items():
        workers = [w for w in report.workers.values() if w.pool == name and w.configured]
        if not workers:
            continue
        start = min(w.configured[0] for w in workers if w.configured)
        end = max(w.configured[1] for w in workers if w.configured)
        if end <= start:
            continue
        rates = report.rates.get(name) or Rates([])
        capacity = max(1, *(w.peak_running for w in workers))
        slots_per_worker = capacity / spec.autoscaling.kv_out
        starts, ends = array("d"), array("d")
        for w in workers:
            ran = report.runs.get(w.worker)
            if ran is not None:
                starts.extend(ran[0])
                ends.extend(ran[1])
        steps = _running_peaks(starts, ends, start, end)
        rules = ScaleRules(spec.autoscaling)
        needed_s = cost = 0.0
        for i, peak in enumerate(steps):
            now = start + i * STEP_S
            current = rules.desired if rules.desired is not None else max(spec.autoscaling.min_workers, 1)
            slots = max(current, 1) * slots_per_worker
            decision = rules.decide(now, Signals(current, min(1.0, peak / slots), max(0.0, peak - slots), None, 0))
            length = min(STEP_S, end - now)
            needed_s += decision.desired * length
            cost += decision.desired * rates.cost(now, now + length)
        p95 = {tier: _p95(v) for (pool, tier), v in report.ttft_ms.items() if pool == name and v}
        meets = all(v <= policy.tiers[t].slo.ttft_p95_ms for t, v in p95.items() if t in policy.tiers)
        span = end - start
        out.append(Sizing(name, capacity, max(steps, default=0), math.fsum(w.configured_s for w in workers) / span,
                          math.fsum(w.cost_usd for w in workers), needed_s / span, cost, p95, meets))
    return out


def _peaks(runs: list[tuple[float, float]], start: float, end: float) -> list[int]:
    """The most requests running at once in each step of [start, end), from (start, end) pairs."""
    return _running_peaks(array("d", (a for a, _ in runs)), array("d", (b for _, b in runs)), start, end)


def _running_peaks(starts: array[float], ends: array[float], start: float, end: float) -> list[int]:
    """The most requests running at once in each step of [start, end) (request i ran [starts[i], ends[i])): the
    moments in order, an end before a start at the same moment, from the two sorted apart (no object per
    moment: a month's requests are hundreds of thousands)."""
    steps = [0] * max(1, math.ceil((end - start) / STEP_S))
    running = 0
    last = 0
    for moment, delta in _moments(sorted(starts), sorted(ends)):
        i = min(len(steps) - 1, max(0, int((moment - start) // STEP_S)))
        for j in range(last + 1, i + 1):  # steps passed with no event hold the running count
            steps[j] = max(steps[j], running)
        last = max(last, i)
        running += delta
        steps[i] = max(steps[i], running)
    return steps


def _moments(starts: list[float], ends: list[float]) -> Iterator[tuple[float, int]]:
    """(moment, +1 for a start or -1 for an end), in order of moment, ends first at the same moment."""
    i = j = 0
    while i < len(starts) or j < len(ends):
        if j < len(ends) and (i >= len(starts) or ends[j] <= starts[i]):
            yield ends[j], -1
            j += 1
        else:
            yield starts[i], 1
            i += 1


def _p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(0.95 * len(ordered)) - 1))]
