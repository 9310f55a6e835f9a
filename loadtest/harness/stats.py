"""Percentiles, CDFs, goodput and per-class summaries of a run's results."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from loadtest.harness.client import Result
from loadtest.harness.spec import SLO

QUANTILES = (50, 95, 99)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default 'linear' method); None when empty."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError("q must be within [0, 100]")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def cdf(values: Iterable[float]) -> tuple[list[float], list[float]]:
    """Sorted values and the share of samples at or below each."""
    ordered = sorted(values)
    n = len(ordered)
    return ordered, [(i + 1) / n for i in range(n)]


def meets_slo(result: Result, slo: SLO | None) -> bool:
    """A request counts toward goodput if it succeeded within the class's TTFT and total thresholds."""
    if not result.ok:
        return False
    if slo is None:
        return True
    if slo.ttft_ms is not None and (result.ttft is None or result.ttft * 1000 > slo.ttft_ms):
        return False
    return not (slo.total_ms is not None and (result.total is None or result.total * 1000 > slo.total_ms))


def goodput(results: Sequence[Result], slo: SLO | None) -> float | None:
    if not results:
        return None
    return sum(meets_slo(r, slo) for r in results) / len(results)


@dataclass
class ClassSummary:
    name: str
    requests: int
    ok: int
    errors: dict[str, int]
    error_rate: float
    requests_per_s: float
    output_tokens_per_s: float
    goodput: float | None
    ttft_ms: dict[str, float | None]
    tpot_ms: dict[str, float | None]
    itl_ms: dict[str, float | None]
    total_ms: dict[str, float | None]
    server_ms: dict[str, dict[str, float | None]]
    cache: dict[str, int]

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def _quantiles(values: Sequence[float], scale: float = 1000.0) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for q in QUANTILES:
        v = percentile(values, q)
        out[f"p{q}"] = None if v is None else round(v * scale, 3)
    out["mean"] = round(sum(values) / len(values) * scale, 3) if values else None
    return out


def summarize(name: str, results: Sequence[Result], elapsed: float, slo: SLO | None) -> ClassSummary:
    ok = [r for r in results if r.ok]
    errors = Counter(r.error or f"http_{r.status}" for r in results if not r.ok)
    stages = sorted({stage for r in ok for stage in r.server})
    server = {stage: _quantiles([r.server[stage] for r in ok if stage in r.server], scale=1.0) for stage in stages}
    return ClassSummary(
        name=name, requests=len(results), ok=len(ok), errors=dict(errors),
        error_rate=(len(results) - len(ok)) / len(results) if results else 0.0,
        requests_per_s=len(ok) / elapsed if elapsed > 0 else 0.0,
        output_tokens_per_s=sum(r.output_tokens for r in ok) / elapsed if elapsed > 0 else 0.0,
        goodput=goodput(results, slo),
        ttft_ms=_quantiles([r.ttft for r in ok if r.ttft is not None]),
        tpot_ms=_quantiles([r.tpot for r in ok if r.tpot is not None]),
        itl_ms=_quantiles([g for r in ok for g in r.gaps]),
        total_ms=_quantiles([r.total for r in ok if r.total is not None]),
        server_ms=server,
        cache=dict(Counter(r.cache for r in ok if r.cache)),
    )
