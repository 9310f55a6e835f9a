"""What counts as a cost anomaly for a tenant.

Per request: its worst-case cost (prompt estimate + max_tokens, priced) against the tenant's baseline, the mean
worst-case cost of its recent requests. Like is compared with like: the actual cost is only known at the end,
and a tenant that routinely asks for long answers has a high baseline of its own. Until a tenant has
``min_samples`` requests the rule's default baseline stands in. Anomalous requests do not move the baseline,
so a burst of them keeps being caught, and no request moves it by more than twice the baseline (``RAMP``): a
tenant stepping max_tokens up from 1 to 2,000 just under k x each time, which a plain mean follows in a dozen
requests, takes over a hundred to get there. A process that starts (or restarts) seeds each tenant's baseline
from the ledger's last day of its requests (their actual cost: a little under their usual worst case, so the
rule errs on the side of noticing).

Spend rate: the current UTC hour's spend over ``k`` times the tenant's mean hourly spend of the previous hours
(at least three of them with spend), alerted once per hour.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.policy.schema import AnomalyRule

ALPHA = 0.05  # EWMA weight: about the last 20-40 requests
RAMP = 2.0  # no request counts as more than this many baselines
HOURS = 24


@dataclass(slots=True)
class _Mean:
    value: float = 0.0
    samples: int = 0


@dataclass(slots=True)
class _Hours:
    spend: dict[int, float] = field(default_factory=dict)  # hour number -> USD
    alerted: int = -1
    usual_of: int = -1  # the hour ``usual`` was computed in
    usual: float | None = None  # the mean hourly spend of the hours before it (None: fewer than three)


class Baselines:
    def __init__(self) -> None:
        self._means: dict[str, _Mean] = {}
        self._hours: dict[str, _Hours] = {}

    def baseline(self, tenant: str, rule: AnomalyRule) -> float:
        mean = self._means.get(tenant)
        if mean is None or mean.samples < rule.min_samples:
            return rule.default_baseline_usd
        return mean.value

    def known(self, tenant: str) -> bool:
        return tenant in self._means

    def seed(self, tenant: str, mean_usd: float, samples: int) -> None:
        """Start a tenant from what the ledger says its requests cost (a restart keeps the rule's memory)."""
        if tenant not in self._means:
            self._means[tenant] = _Mean(mean_usd, samples)

    def observe(self, tenant: str, worst_usd: float, rule: AnomalyRule) -> None:
        worst_usd = min(worst_usd, RAMP * self.baseline(tenant, rule))
        mean = self._means.get(tenant)
        if mean is None:
            mean = self._means[tenant] = _Mean()
        mean.samples += 1
        # a plain mean while warming up, then an exponentially weighted one
        weight = max(ALPHA, 1.0 / mean.samples)
        mean.value += weight * (worst_usd - mean.value)

    def spend_rate_anomaly(self, tenant: str, cost_usd: float, now: float, k: float) -> tuple[float, float] | None:
        """Add spend; (this hour's spend, usual hourly spend) the first time this hour goes over k x usual."""
        hours = self._hours.get(tenant)
        if hours is None:
            hours = self._hours[tenant] = _Hours()
        hour = int(now // 3600)
        spent = hours.spend[hour] = hours.spend.get(hour, 0.0) + cost_usd
        if hours.usual_of != hour:  # the previous hours' mean, once an hour: they change only when it turns
            for old in [h for h in hours.spend if h < hour - HOURS]:
                del hours.spend[old]
            previous = [v for h, v in hours.spend.items() if h < hour and v > 0]
            hours.usual_of = hour
            hours.usual = sum(previous) / (HOURS if len(previous) >= HOURS else len(previous)) \
                if len(previous) >= 3 else None
        usual = hours.usual
        if usual is None or hours.alerted == hour:
            return None
        if spent > k * usual:
            hours.alerted = hour
            return hours.spend[hour], usual
        return None
