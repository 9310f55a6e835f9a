"""The GPU report as the gateway reads it (ledger records and presence spans from the shared store), its body as
GET /admin/reports/gpu answers it (``document``: JSON or CSV), and the Prometheus gauges fed from it.

The gauges cover the last ``WINDOW_S`` and are recomputed every ``REFRESH_S`` by a task of their own: a request
pays nothing for them. They are fleet-wide (every replica reads the same store), so every replica shows the same
values: aggregate them with max, not sum.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from gateway.finance import gpu, heavy, sizing
from gateway.finance.reports import cell
from gateway.ledger.stores import LedgerStore, iter_all
from gateway.ledger.times import at
from gateway.ops.metrics import GatewayMetrics
from gateway.policy.schema import Policy

log = logging.getLogger("tollgate.gpu")
WINDOW_S = 900.0
REFRESH_S = 60.0
COLUMNS = ("requests", "successful_requests", "prompt_tokens", "completion_tokens", "gpu_seconds", "gpu_cost_usd",
           "gpu_cost_per_1k_requests", "gpu_cost_per_1m_output_tokens", "list_cost_usd")

# what the GPU report reads of a record, besides the grouped columns (gateway.finance.gpu.reports)
READ = ("worker", "worker_ms", "total_ms", "queue_wait_ms", "status", "tier", "ttft_ms", "prompt_tokens",
        "completion_tokens", "cost_usd")


def gather(store: LedgerStore, policy: Policy, start: float, end: float, group_by: list[str],
           live: list[dict[str, Any]], sizing_too: bool = True) -> dict[str, Any]:
    """The report (blocking: on a thread). Records that end up to the longest answer deadline after ``end`` may
    have run inside the period: they are read too, and only their part inside counts. ``live``: this process's
    open presence spans as they stand, in place of their last written beat. ``sizing_too``: with the cheapest
    configuration (a replay of the period in 30 s steps: most of a month's report when the records are few)."""
    return gather_many(store, policy, start, end, [group_by], live, sizing_too)[0]


def gather_many(store: LedgerStore, policy: Policy, start: float, end: float, groupings: Sequence[Sequence[str]],
                live: list[dict[str, Any]], sizing_too: bool = False,
                fold: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """``gather`` for each of ``groupings`` from one read of the records and one sweep of the workers' hours
    (blocking: on a thread): the records' needed columns only, a page at a time. ``fold``: each record passes
    through it before it is grouped (a statement's cost centres past a tenant's top become one line)."""
    late = max((p.answer_deadline_s for p in policy.pools.values()), default=900.0)
    columns = [*READ, *(gpu.COLUMN.get(g, g) for grouping in groupings for g in grouping)]
    pages = iter_all(store, at(start), at(end + late), None, columns=columns)
    records = (fold(r) for page in pages for r in page) if fold else (r for page in pages for r in page)
    spans = {s["id"]: s for s in store.presence(at(start), at(end))} | {s["id"]: s for s in live}
    reports = gpu.reports(records, spans.values(), policy.pools, start, end, groupings)
    out = [report.public() for report in reports]
    out[0]["cheapest"] = [s.public() for s in sizing.cheapest(reports[0], policy)] if sizing_too else []
    for more in out[1:]:
        more["cheapest"] = out[0]["cheapest"]
    return out


class OnePass:
    """The GPU figures a statement asks for (gateway.ledger.closes.GpuReport: (start, end, group_by) -> report),
    every grouping of ``groupings`` gathered on the first call, from one read of the records, and answered from
    that for the same period: a statement's reports by model and by cost centre cost one pass, not two."""

    def __init__(self, store: LedgerStore, policy: Policy, live: list[dict[str, Any]],
                 groupings: Sequence[Sequence[str]], fold: Callable[[dict[str, Any]], dict[str, Any]] | None = None
                 ) -> None:
        self.store, self.policy, self.live, self.fold = store, policy, live, fold
        self.groupings = [list(g) for g in groupings]
        self._period: tuple[float, float] | None = None
        self._reports: list[dict[str, Any]] = []

    def __call__(self, start: float, end: float, group_by: list[str]) -> dict[str, Any]:
        if list(group_by) not in self.groupings:
            return gather(self.store, self.policy, start, end, group_by, self.live, False)
        if self._period != (start, end):
            self._reports = gather_many(self.store, self.policy, start, end, self.groupings, self.live, False,
                                        self.fold)
            self._period = (start, end)
        return self._reports[self.groupings.index(list(group_by))]


def zero_row(tenant: str) -> dict[str, Any]:
    """A tenant that ran nothing in the period, as a usage row."""
    return {"kind": "usage", "tenant": tenant} | gpu.Row(()).public([], "usage")


def document(store: LedgerStore, policy: Policy, start: float, end: float, group_by: list[str],
             live: list[dict[str, Any]], names: list[str], tenant: str | None, fmt: str) -> heavy.Spool:
    """The report's body (blocking: on the report thread). ``names``: tenants listed with zeros when they ran
    nothing (grouped by tenant alone); ``tenant``: that tenant's GPU cost alone, its usage rows and nothing of the
    fleet's (no idle rows, workers, reconciliation nor cheapest configuration: those are everyone's, and the
    report for every tenant holds them)."""
    out = gather(store, policy, start, end, group_by, live, sizing_too=tenant is None)
    named = {r["tenant"] for r in out["data"]} if names else set()
    out["data"] += [zero_row(name) for name in names if name not in named]
    if tenant is not None:
        out["data"] = [r for r in out["data"] if r["kind"] == "usage" and r.get("tenant") == tenant]
        out = {"tenant": tenant, "data": out["data"]}
    body = heavy.Spool()
    if fmt == "csv":
        body.csv(["kind", *dict.fromkeys([*group_by, "worker"]), *COLUMNS],
                 ({k: cell(v) for k, v in row.items()} for row in out["data"]))
    else:
        body.write(orjson.dumps({"object": "gpu_cost_report", "from": at(start), "to": at(end), **out}))
    return body


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
