"""The GPU report as the gateway reads it (ledger records and presence spans from the shared store), its body as
GET /admin/reports/gpu answers it (``document``: JSON or CSV), and the Prometheus gauges fed from it.

The gauges cover ``WINDOW_S`` as steps of ``REFRESH_S`` aligned on the clock (``Window``), each gathered once by
a task of their own: a request pays nothing for them on its path, and each ledger record is read by two steps,
whatever the window (the whole window read at each refresh read a record 15 times, 4-5 us a read). A step
counts the requests that finished by the end of the step after it, and is gathered a step later still (the
writers' batches and a short store outage have landed by then): the newest step ends two to three steps ago.

What that leaves out of the gauges, never out of the reports: a request's time in a step counts if it finished
by the end of the next step, so a request that ran longer than a step counts only its last one to two steps
(a 5-minute answer's last 1-2 minutes); a record that reached the store more than a step late (a spool replayed
after an outage) is missing from the steps already gathered. The steps are fleet-wide (every replica reads the
same store) and the same periods on every replica, so replicas that read the same records show the same values:
aggregate them with max, not sum.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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
STEPS = round(WINDOW_S / REFRESH_S)
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
    reports = _reports(store, policy, start, end, end + late, groupings, live, fold)
    out = [report.public() for report in reports]
    out[0]["cheapest"] = [s.public() for s in sizing.cheapest(reports[0], policy)] if sizing_too else []
    for more in out[1:]:
        more["cheapest"] = out[0]["cheapest"]
    return out


def _reports(store: LedgerStore, policy: Policy, start: float, end: float, until: float,
             groupings: Sequence[Sequence[str]], live: list[dict[str, Any]],
             fold: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> list[gpu.GpuReport]:
    """The reports for [start, end) from the records that finished in [start, until)."""
    columns = [*READ, *(gpu.COLUMN.get(g, g) for grouping in groupings for g in grouping)]
    pages = iter_all(store, at(start), at(until), None, columns=columns)
    records = (fold(r) for page in pages for r in page) if fold else (r for page in pages for r in page)
    spans = {s["id"]: s for s in store.presence(at(start), at(end))} | {s["id"]: s for s in live}
    return gpu.reports(records, spans.values(), policy.pools, start, end, groupings)


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


@dataclass(slots=True)
class Step:
    """One step of the fleet's GPU time, in the sums the gauges add up: seconds by (pool, worker), and the
    successful requests that ended in it and the GPU cost of every request's time in it, by tier."""

    end: float
    busy_s: dict[tuple[str, str], float] = field(default_factory=dict)
    idle_s: dict[tuple[str, str], float] = field(default_factory=dict)
    cost_usd: dict[str, float] = field(default_factory=dict)
    successful: dict[str, int] = field(default_factory=dict)


def step(store: LedgerStore, policy: Policy, start: float, end: float, live: list[dict[str, Any]]) -> Step:
    """The step [start, end), from the records that finished by one step after its end (blocking: on a
    thread)."""
    report = _reports(store, policy, start, end, end + (end - start), [["tier"]], live)[0]
    out = Step(end)
    for w in report.workers.values():
        out.busy_s[(w.pool or "", w.worker)] = w.busy_s
        out.idle_s[(w.pool or "", w.worker)] = w.idle_s
    for row in report.rows.values():
        out.cost_usd[row.key[0]] = row.gpu_cost_usd
        out.successful[row.key[0]] = row.successful
    return out


class Window:
    """The gauges' last ``WINDOW_S``: its ``STEPS`` steps of ``REFRESH_S``, each gathered once. ``refresh`` is
    its one writer (blocking: on a thread), ``publish`` its reader, never at the same time."""

    def __init__(self, store: LedgerStore) -> None:
        self.store = store
        self.steps: deque[Step] = deque(maxlen=STEPS)

    @staticmethod
    def newest(now: float) -> int:
        """The index (its end over ``REFRESH_S``) of the newest step gathered at ``now``: one whose records are
        read up to a step after its end, and whose read is a step later still."""
        return math.floor(now / REFRESH_S) - 2

    def refresh(self, now: float, policy: Policy, live: list[dict[str, Any]]) -> None:
        """Gathers the steps due at ``now`` that are not held, oldest first. On the store's error the steps
        gathered so far are kept, the rest are gathered at the next refresh, and the oldest held steps stand in
        for them meanwhile."""
        newest = self.newest(now)
        while self.steps and round(self.steps[-1].end / REFRESH_S) > newest:  # the clock went back
            self.steps.pop()
        first = newest - STEPS + 1
        if self.steps:
            first = max(first, round(self.steps[-1].end / REFRESH_S) + 1)
        for index in range(first, newest + 1):
            self.steps.append(step(self.store, policy, (index - 1) * REFRESH_S, index * REFRESH_S, live))

    def totals(self) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float], dict[str, float]]:
        """The held steps' busy and idle seconds by (pool, worker), and the GPU cost of 1,000 successful
        requests by tier (a tier with none has no figure)."""
        busy: dict[tuple[str, str], list[float]] = {}
        idle: dict[tuple[str, str], list[float]] = {}
        cost: dict[str, list[float]] = {}
        successful: dict[str, int] = {}
        for held in self.steps:
            for place, seconds in held.busy_s.items():
                busy.setdefault(place, []).append(seconds)
            for place, seconds in held.idle_s.items():
                idle.setdefault(place, []).append(seconds)
            for tier, usd in held.cost_usd.items():
                cost.setdefault(tier, []).append(usd)
            for tier, count in held.successful.items():
                successful[tier] = successful.get(tier, 0) + count
        return ({place: math.fsum(parts) for place, parts in busy.items()},
                {place: math.fsum(parts) for place, parts in idle.items()},
                {tier: math.fsum(costs) * 1000 / successful[tier] for tier, costs in cost.items()
                 if successful.get(tier)})

    def publish(self, metrics: GatewayMetrics) -> None:
        """The gauges set to ``totals``: a worker or tier the held steps do not name has no series."""
        busy, idle, per_1k = self.totals()
        metrics.gpu_busy.clear()
        metrics.gpu_idle.clear()
        metrics.gpu_per_1k.clear()
        for (pool, worker), seconds in busy.items():
            metrics.gpu_busy.labels(pool, worker).set(seconds)
        for (pool, worker), seconds in idle.items():
            metrics.gpu_idle.labels(pool, worker).set(seconds)
        for tier, usd in per_1k.items():
            metrics.gpu_per_1k.labels(tier).set(usd)


async def keep_gauges(metrics: GatewayMetrics, store: LedgerStore, policy: Callable[[], Policy],
                      live: Callable[[float], list[dict[str, Any]]]) -> None:
    """Refreshes and publishes the gauges at each minute of the clock, for ever (a task of its own)."""
    window = Window(store)
    due = time.time()
    while True:
        now = max(time.time(), due)  # a timer that fires a little before the minute still gathers its step
        try:
            await asyncio.to_thread(window.refresh, now, policy(), live(now))
        except Exception as exc:  # the store is down: the steps held stand until the next refresh gathers more
            log.warning("GPU gauges not refreshed: %s", exc)
        try:
            window.publish(metrics)
        except Exception:  # never the end of the task: the next refresh publishes again
            log.exception("GPU gauges not published")
        due = (math.floor(now / REFRESH_S) + 1) * REFRESH_S
        await asyncio.sleep(due - time.time())
