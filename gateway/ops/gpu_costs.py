"""The GPU report as the gateway reads it (ledger records and presence spans from the shared store), and the
Prometheus gauges fed from it.

The gauges cover the last ``WINDOW_S`` and are recomputed every ``REFRESH_S`` by a task of their own: a request
pays nothing for them. They are fleet-wide (every replica reads the same store), so every replica shows the same
values: aggregate them with max, not sum.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from gateway.ledger import gpu
from gateway.ledger.stores import LedgerStore, iter_all
from gateway.ledger.times import at
from gateway.ops import sizing
from gateway.ops.metrics import GatewayMetrics
from gateway.policy.schema import Policy

log = logging.getLogger("tollgate.gpu")
WINDOW_S = 900.0
REFRESH_S = 60.0


def gather(store: LedgerStore, policy: Policy, start: float, end: float, group_by: list[str],
           live: list[dict[str, Any]], sizing_too: bool = True) -> dict[str, Any]:
    """The report (blocking: on a thread). Records that end up to the longest answer deadline after ``end`` may
    have run inside the period: they are read too, and only their part inside counts. ``live``: this process's
    open presence spans as they stand, in place of their last written beat. ``sizing_too``: with the cheapest
    configuration (a replay of the period in 30 s steps: most of a month's report when the records are few)."""
    late = max((p.answer_deadline_s for p in policy.pools.values()), default=900.0)
    records = (r for page in iter_all(store, at(start), at(end + late), None) for r in page)
    spans = {s["id"]: s for s in store.presence(at(start), at(end))} | {s["id"]: s for s in live}
    report = gpu.report(records, spans.values(), policy.pools, start, end, group_by)
    out = report.public()
    out["cheapest"] = [s.public() for s in sizing.cheapest(report, policy)] if sizing_too else []
    return out


def zero_row(tenant: str) -> dict[str, Any]:
    """A tenant that ran nothing in the period, as a usage row."""
    return {"kind": "usage", "tenant": tenant} | gpu.Row(()).public([], "usage")


def publish(metrics: GatewayMetrics, out: dict[str, Any]) -> None:
    metrics.gpu_busy.clear()
    metrics.gpu_idle.clear()
    metrics.gpu_per_1k.clear()
    for w in out["workers"]:
        metrics.gpu_busy.labels(w["pool"] or "", w["worker"]).set(w["busy_hours"] * 3600)
        metrics.gpu_idle.labels(w["pool"] or "", w["worker"]).set(w["idle_hours"] * 3600)
    for row in out["data"]:
        if row["kind"] == "usage" and row["gpu_cost_per_1k_requests"] is not None:
            metrics.gpu_per_1k.labels(row["tier"]).set(row["gpu_cost_per_1k_requests"])


async def keep_gauges(metrics: GatewayMetrics, store: LedgerStore, policy: Callable[[], Policy],
                      live: Callable[[float], list[dict[str, Any]]]) -> None:
    while True:
        now = time.time()
        try:
            publish(metrics, await asyncio.to_thread(gather, store, policy(), now - WINDOW_S, now, ["tier"],
                                                     live(now), False))
        except Exception as exc:  # the store is down: the gauges keep their last values
            log.warning("GPU gauges not refreshed: %s", exc)
        await asyncio.sleep(REFRESH_S)
