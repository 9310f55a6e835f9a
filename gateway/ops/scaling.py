"""The autoscaling signal: how many workers each pool should have, and why, by the sources' rules.

Out when any of: KV-cache usage above ``kv_out`` (80%), requests queued (the gateway's queue plus the workers'
waiting) above ``queue_out`` (50), or a class's TTFT p95 over the last minute above ``ttft_slo_share`` (80%) of
that class's own SLO (each tier against its own objective: batch requests queued for seconds by design must
not read as a premium SLO miss). In when KV usage is below ``kv_in`` (30%) and nothing has
been queued for ``quiet_in_s`` (10 minutes). Never two changes within ``cooldown_s`` (5 minutes). One step
at a time, within [min_workers, max_workers].

The gateway only says the number (``tollgate_scale_desired_workers`` and GET /admin/scale); KEDA or any
autoscaler does the scaling (deploy/kubernetes/keda.yaml). ``ScaleRules`` is a pure state machine with the
time passed in, so a recorded trace can be replayed through it (tests/inprocess/ops/test_scaling.py).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from gateway.fleet.worker import Worker
from gateway.ops.metrics import GatewayMetrics
from gateway.policy.schema import Autoscaling, Policy
from gateway.policy.schema import Pool as PoolSpec


class ScaledPool(Protocol):
    """What the signal reads of a pool (gateway.upstream.pools.UpstreamPool is one): its spec and its workers."""

    spec: PoolSpec
    workers: list[Worker]


@dataclass(frozen=True, slots=True)
class Signals:
    workers: int  # workers the pool has now (healthy)
    kv_usage: float  # mean over the pool's healthy workers, 0-1
    queued: float  # gateway queue + workers' waiting
    ttft_p95_s: float | None  # of the class furthest over its SLO, over the last minute; None: too few samples
    ttft_slo_s: float  # that class's TTFT p95 objective
    tier: str = ""  # that class


@dataclass(slots=True)
class Decision:
    desired: int
    reason: str


@dataclass(slots=True)
class ScaleRules:
    spec: Autoscaling
    desired: int | None = None
    last_change: float | None = None  # when desired last moved
    busy_at: float | None = None  # the last time the pool was not quiet (queue or KV above the scale-in bar)

    def decide(self, now: float, s: Signals) -> Decision:
        spec = self.spec
        current = self.desired if self.desired is not None else max(spec.min_workers, s.workers)
        self.desired = current
        if self.busy_at is None or s.queued > 0 or s.kv_usage >= spec.kv_in:
            self.busy_at = now
        cooling = self.last_change is not None and now - self.last_change < spec.cooldown_s
        reasons = []
        if s.kv_usage > spec.kv_out:
            reasons.append(f"KV cache {s.kv_usage:.0%} > {spec.kv_out:.0%}")
        if s.queued > spec.queue_out:
            reasons.append(f"queue {s.queued:g} > {spec.queue_out}")
        if s.ttft_p95_s is not None and s.ttft_p95_s > spec.ttft_slo_share * s.ttft_slo_s:
            reasons.append(f"{s.tier + ' ' if s.tier else ''}TTFT p95 {s.ttft_p95_s * 1000:.0f} ms > "
                           f"{spec.ttft_slo_share:.0%} of {s.ttft_slo_s * 1000:.0f} ms")
        if reasons:
            if current >= spec.max_workers:
                return Decision(current, "at max_workers; would scale out: " + "; ".join(reasons))
            if cooling:
                return Decision(current, "cooldown; would scale out: " + "; ".join(reasons))
            return self._move(now, current + 1, "scale out: " + "; ".join(reasons))
        quiet_for = now - self.busy_at
        if quiet_for >= spec.quiet_in_s and current > spec.min_workers:
            if cooling:
                return Decision(current, "cooldown; would scale in")
            self.busy_at = now  # the next step in needs its own quiet period
            return self._move(now, current - 1, f"scale in: KV < {spec.kv_in:.0%} and no queue for "
                                                f"{quiet_for / 60:.0f} min")
        return Decision(current, "steady")

    def _move(self, now: float, desired: int, reason: str) -> Decision:
        self.desired = desired
        self.last_change = now
        return Decision(desired, reason)


class Autoscaler:
    """Feeds each pool's rules from the gateway's own view every ``interval_s``: scraped KV usage and waiting,
    the scheduler's queues, and TTFT p95 over the last minute from the TTFT histogram's bucket deltas (as
    Prometheus's histogram_quantile over a rate would)."""

    def __init__(self, metrics: GatewayMetrics, window_s: float = 60.0) -> None:
        self.metrics = metrics
        self.window_s = window_s
        self.rules: dict[str, ScaleRules] = {}
        self.last: dict[str, dict[str, object]] = {}
        self._history: collections.deque[tuple[float, dict[str, dict[tuple[str, float], float]]]] = \
            collections.deque()

    def step(self, now: float, policy: Policy, pools: Mapping[str, ScaledPool], queued: dict[str, int]) -> None:
        buckets = self._buckets(policy)
        self._history.append((now, buckets))
        while len(self._history) > 2 and self._history[1][0] <= now - self.window_s:
            self._history.popleft()
        for name, pool in pools.items():
            spec = pool.spec.autoscaling
            rules = self.rules.get(name)
            if rules is None or rules.spec != spec:
                rules = self.rules[name] = ScaleRules(spec, rules.desired if rules else None,
                                                      rules.last_change if rules else None)
            healthy = [w for w in pool.workers if w.observed.healthy]
            tier, p95, slo = self._worst_tier(name, buckets, policy)
            kv = sum(w.observed.kv_usage for w in healthy) / len(healthy) if healthy else 0.0
            waiting = queued.get(name, 0) + sum(w.observed.waiting for w in healthy)
            signals = Signals(len(healthy), kv, waiting, p95, slo, tier)
            decision = rules.decide(now, signals)
            self.metrics.scale_desired.labels(name).set(decision.desired)
            self.last[name] = {"current": signals.workers, "desired": decision.desired, "reason": decision.reason,
                               "signals": {"kv_usage": round(signals.kv_usage, 3), "queued": signals.queued,
                                           "ttft_p95_ms": None if p95 is None else round(p95 * 1000, 1),
                                           "ttft_slo_ms": slo * 1000, "ttft_tier": tier},
                               "last_change_s_ago": None if rules.last_change is None
                               else round(now - rules.last_change, 1)}

    def _buckets(self, policy: Policy) -> dict[str, dict[tuple[str, float], float]]:
        """Cumulative TTFT bucket counts per pool, by (tier, upper bound)."""
        out: dict[str, dict[tuple[str, float], float]] = {}
        for family in self.metrics.ttft.collect():
            for sample in family.samples:
                if not sample.name.endswith("_bucket"):
                    continue
                route = policy.models.get(sample.labels.get("model", ""))
                if route is None:
                    continue
                key = (sample.labels.get("tier", ""), float(sample.labels["le"]))
                pool = out.setdefault(route.pool, {})
                pool[key] = pool.get(key, 0.0) + sample.value
        return out

    def _worst_tier(self, pool: str, buckets: dict[str, dict[tuple[str, float], float]], policy: Policy
                    ) -> tuple[str, float | None, float]:
        """(tier, TTFT p95, its SLO) of the class the pool served furthest over its objective in the window."""
        worst: tuple[str, float | None, float] = ("", None, min(t.slo.ttft_p95_ms for t in policy.tiers.values())
                                                  / 1000)
        for tier, spec in policy.tiers.items():
            p95 = self._ttft_p95(pool, buckets, tier)
            slo = spec.slo.ttft_p95_ms / 1000
            if p95 is not None and (worst[1] is None or p95 / slo > worst[1] / worst[2]):
                worst = (tier, p95, slo)
        return worst

    def _ttft_p95(self, pool: str, now_buckets: dict[str, dict[tuple[str, float], float]], tier: str
                  ) -> float | None:
        """One class's TTFT p95 over the window, from the growth of its histogram buckets (None: < 20 answers)."""
        then = self._history[0][1].get(pool, {}) if self._history else {}
        delta: dict[float, float] = {}
        for (of, le), count in now_buckets.get(pool, {}).items():
            if of == tier:
                delta[le] = count - then.get((of, le), 0.0)
        total = delta.get(float("inf"), 0.0)
        if total < 20:
            return None
        rank, lower, below = 0.95 * total, 0.0, 0.0
        for le in sorted(delta):
            if delta[le] >= rank:
                if le == float("inf"):
                    return lower
                share = (rank - below) / max(delta[le] - below, 1e-9)
                return lower + (le - lower) * share
            lower, below = le, delta[le]
        return None
