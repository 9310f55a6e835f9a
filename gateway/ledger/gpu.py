"""What the GPUs cost, per tenant: a worker's hours at its pool's hourly rate, shared among the requests it ran.

A worker is paid for over the time it was configured: the union of every gateway process's presence spans
(gateway.ledger.presence) and of the time it was seen answering (a worker that answered was there). Of that
time, it was busy while at least one request ran on it (a ledger record's span: its end, less ``worker_ms``).

**The measure**: each moment of a worker's busy time is shared equally among the requests running on it then.
A continuous-batching engine (vLLM, and the simulator) runs one step for all its running sequences at a time,
so a request's share of a step is its share of the batch: a request that decodes three times the tokens holds
its place in the batch three times as long and pays three times as much, and prefill, prefix-cache hits and
waiting inside the engine count as they really took. Token-weighted shares need per-token weights that move
with the batch size and the prompt length; measured against the engine's own per-request time, this measure
needs none (loadtest/RESULTS.md, "What the GPUs cost").

The rest of the configured time is the worker's **idle** cost, reported as its own row, never spread over
tenants. Reconciliation is exact by construction: the requests' shares plus idle equal each worker's
configured time at its rate (``Reconciliation.difference_usd`` is float rounding, well under a micro-dollar).

Everything here is plain computation on rows already read (run it on a thread): one sweep over each worker's
request boundaries, O(n log n), with running integrals (no per-moment loop over the running set).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from gateway.policy.schema import GpuPrice, Pool

GROUPS = ("tenant", "model", "tier", "class", "worker", "tag", "key")
_COLUMN = {"class": "service_class", "tag": "tags", "key": "key_id"}
IDLE = "(idle)"


def epoch(text: str) -> float:
    """A ledger time ("2026-11-30T06:37:43.123456Z") as a Unix time."""
    return datetime.fromisoformat(text).timestamp()


class Rates:
    """A pool's hourly rate at any moment: its versions, by UTC day of effect."""

    def __init__(self, versions: Sequence[GpuPrice]) -> None:
        self.starts = [datetime(v.effective.year, v.effective.month, v.effective.day, tzinfo=UTC).timestamp()
                       for v in versions]
        self.rates = [v.usd_per_hour for v in versions]

    def at(self, moment: float) -> float:
        i = bisect.bisect_right(self.starts, moment) - 1
        return self.rates[i] if i >= 0 else 0.0

    def changes(self, start: float, end: float) -> list[float]:
        """The moments in (start, end) where the rate changes."""
        return [s for s in self.starts if start < s < end]

    def cost(self, start: float, end: float) -> float:
        """USD for one worker over [start, end)."""
        edges = [start, *self.changes(start, end), end]
        return math.fsum((b - a) * self.at(a) / 3600 for a, b in itertools.pairwise(edges))

    def version_on(self, day: date) -> float | None:
        moment = datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()
        i = bisect.bisect_right(self.starts, moment) - 1
        return self.rates[i] if i >= 0 else None


@dataclass(slots=True)
class WorkerHours:
    worker: str
    pool: str | None
    configured_s: float = 0.0
    up_s: float = 0.0
    busy_s: float = 0.0
    cost_usd: float = 0.0  # configured time at its rate
    busy_cost_usd: float = 0.0
    requests: int = 0  # ran here, ending in the period
    peak_running: int = 0  # the most requests seen running on it at once
    busy: list[tuple[float, float]] = field(default_factory=list)  # [start, end) while anything ran
    configured: list[tuple[float, float]] = field(default_factory=list)  # [start, end) while it was paid for

    @property
    def idle_s(self) -> float:
        return max(0.0, self.configured_s - self.busy_s)

    @property
    def idle_cost_usd(self) -> float:
        return self.cost_usd - self.busy_cost_usd

    def public(self, rate_now: float | None) -> dict[str, Any]:
        return {"worker": self.worker, "pool": self.pool, "usd_per_hour": rate_now,
                "configured_hours": round(self.configured_s / 3600, 6), "busy_hours": round(self.busy_s / 3600, 6),
                "idle_hours": round(self.idle_s / 3600, 6),
                "down_hours": round(max(0.0, self.configured_s - self.up_s) / 3600, 6),
                "utilisation": round(self.busy_s / self.configured_s, 4) if self.configured_s else 0.0,
                "cost_usd": round(self.cost_usd, 6), "busy_cost_usd": round(self.busy_cost_usd, 6),
                "idle_cost_usd": round(self.idle_cost_usd, 6), "requests": self.requests,
                "peak_running": self.peak_running}


@dataclass(slots=True)
class Row:
    """One group's usage and its GPU share."""

    key: tuple[Any, ...]
    requests: int = 0
    successful: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    list_cost_usd: float = 0.0
    gpu_seconds: float = 0.0
    gpu_cost_usd: float = 0.0

    def public(self, group_by: Sequence[str], kind: str) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": kind, **dict(zip(group_by, self.key, strict=True))}
        out.update(requests=self.requests, successful_requests=self.successful, prompt_tokens=self.prompt_tokens,
                   completion_tokens=self.completion_tokens, gpu_seconds=round(self.gpu_seconds, 6),
                   gpu_cost_usd=round(self.gpu_cost_usd, 6),
                   gpu_cost_per_1k_requests=round(self.gpu_cost_usd * 1000 / self.successful, 6)
                   if self.successful else None,
                   gpu_cost_per_1m_output_tokens=round(self.gpu_cost_usd * 1e6 / self.completion_tokens, 6)
                   if self.completion_tokens else None,
                   list_cost_usd=round(self.list_cost_usd, 9))
        return out


@dataclass(slots=True)
class GpuReport:
    start: float
    end: float
    group_by: list[str]
    rows: dict[tuple[Any, ...], Row]
    workers: dict[str, WorkerHours]
    rates: dict[str, Rates]  # by pool
    runs: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # worker -> each request's span
    ttft_ms: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (pool, tier) -> answered TTFTs

    def rate_now(self, w: WorkerHours) -> float | None:
        rates = self.rates.get(w.pool or "")
        return rates.at(self.end - 1e-6) if rates else None

    @property
    def workers_cost_usd(self) -> float:
        return math.fsum(w.cost_usd for w in self.workers.values())

    @property
    def attributed_usd(self) -> float:
        return math.fsum(r.gpu_cost_usd for r in self.rows.values())

    @property
    def idle_usd(self) -> float:
        return math.fsum(w.idle_cost_usd for w in self.workers.values())

    def public(self) -> dict[str, Any]:
        usage = [r.public(self.group_by, "usage") for r in sorted(self.rows.values(), key=_order)]
        idle = []
        for w in sorted(self.workers.values(), key=lambda w: w.worker):
            row = dict.fromkeys(self.group_by)
            row.update(tenant=IDLE) if "tenant" in self.group_by else None
            idle.append({"kind": "idle", **row, "worker": w.worker, "requests": 0, "successful_requests": 0,
                         "prompt_tokens": 0, "completion_tokens": 0, "gpu_seconds": round(w.idle_s, 6),
                         "gpu_cost_usd": round(w.idle_cost_usd, 6), "gpu_cost_per_1k_requests": None,
                         "gpu_cost_per_1m_output_tokens": None, "list_cost_usd": 0.0})
        total = Row(())
        for r in self.rows.values():
            _add(total, r)
        workers = self.workers_cost_usd
        return {"group_by": self.group_by, "data": usage + idle,
                "total": total.public([], "usage") | {"idle_cost_usd": round(self.idle_usd, 6),
                                                       "workers_cost_usd": round(workers, 6)},
                "workers": [w.public(self.rate_now(w)) for w in sorted(self.workers.values(), key=lambda w: w.worker)],
                "reconciliation": {"workers_cost_usd": round(workers, 6),
                                   "attributed_usd": round(self.attributed_usd, 6),
                                   "idle_usd": round(self.idle_usd, 6),
                                   "difference_usd": round(workers - self.attributed_usd - self.idle_usd, 9)}}


def _order(row: Row) -> tuple[str, ...]:
    return tuple("" if k is None else str(k) for k in row.key)


def _add(into: Row, r: Row) -> None:
    into.requests += r.requests
    into.successful += r.successful
    into.prompt_tokens += r.prompt_tokens
    into.completion_tokens += r.completion_tokens
    into.list_cost_usd += r.list_cost_usd
    into.gpu_seconds += r.gpu_seconds
    into.gpu_cost_usd += r.gpu_cost_usd


def span_of(record: Mapping[str, Any], end: float) -> float:
    """How long a record's request ran on its worker, in seconds (records made before ``worker_ms``: its total
    less the queue wait)."""
    ms = record.get("worker_ms")
    if ms is None:
        total, queued = record.get("total_ms"), record.get("queue_wait_ms")
        ms = (total or 0.0) - (queued or 0.0)
    return max(0.0, float(ms) / 1000)


def union(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if merged and a <= merged[-1][1]:
            if b > merged[-1][1]:
                merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return merged


def report(records: Iterable[Mapping[str, Any]], presence: Iterable[Mapping[str, Any]], pools: Mapping[str, Pool],
           start: float, end: float, group_by: Sequence[str]) -> GpuReport:
    """The GPU report for [start, end). ``records`` may include records that end after ``end`` (their part
    before it counts); ``presence`` the spans that overlap the period."""
    rates = {name: Rates(pool.gpu_usd_per_hour) for name, pool in pools.items()}
    pool_of = {str(url).rstrip("/"): name for name, pool in pools.items() for url in pool.workers}
    rows: dict[tuple[Any, ...], Row] = {}
    runs: dict[str, list[tuple[float, float, Row]]] = {}  # worker -> (start, end, its row) of each request
    workers: dict[str, WorkerHours] = {}
    present: dict[str, list[tuple[float, float]]] = {}
    up: dict[str, list[tuple[float, float]]] = {}
    for span in presence:
        a, b = max(start, epoch(span["since"])), min(end, epoch(span["until"]))
        w = span["worker"]
        workers.setdefault(w, WorkerHours(w, span["pool"]))
        present.setdefault(w, []).append((a, b))
        if span["up"]:
            up.setdefault(w, []).append((a, b))
    columns = [_COLUMN.get(g, g) for g in group_by]
    ttft: dict[tuple[str, str], list[float]] = {}
    for record in records:
        finished = epoch(record["time"])
        worker = record.get("worker")
        began = finished - span_of(record, finished) if worker else finished
        if finished < start or began >= end:
            continue
        key = tuple(record.get(c) for c in columns)
        row = rows.get(key)
        if row is None:
            row = rows[key] = Row(key)
        if finished < end:
            row.requests += 1
            row.successful += record["status"] < 400
            row.prompt_tokens += record["prompt_tokens"] or 0
            row.completion_tokens += record["completion_tokens"] or 0
            row.list_cost_usd += record["cost_usd"] or 0.0
        if worker:
            hours = workers.get(worker)
            if hours is None:
                hours = workers[worker] = WorkerHours(worker, pool_of.get(worker))
            hours.requests += finished < end
            if record.get("ttft_ms") is not None and record["status"] < 400 and finished < end:
                ttft.setdefault((hours.pool or "", record["tier"]), []).append(record["ttft_ms"])
            runs.setdefault(worker, []).append((max(began, start), min(finished, end), row))
    for name, hours in workers.items():
        if hours.pool is None:
            hours.pool = pool_of.get(name)
        pool_rates = rates.get(hours.pool or "") or Rates([])
        _share(hours, runs.get(name, []), pool_rates)
        configured = hours.configured = union([*present.get(name, []), *hours.busy])
        hours.configured_s = math.fsum(b - a for a, b in configured)
        hours.up_s = math.fsum(b - a for a, b in union([*up.get(name, []), *hours.busy]))
        hours.cost_usd = math.fsum(pool_rates.cost(a, b) for a, b in configured)
    return GpuReport(start, end, list(group_by), rows, workers, rates,
                     {w: [(a, b) for a, b, _ in spans] for w, spans in runs.items()}, ttft)


def _share(hours: WorkerHours, runs: list[tuple[float, float, Row]], rates: Rates) -> None:
    """One sweep over a worker's request boundaries: ``seconds`` and ``usd`` are the running integrals of 1/n and
    rate/n over busy time (n requests running), so a request's share is their growth between its start and end."""
    events: list[tuple[float, int, int]] = []  # (moment, 0 end | 1 start | 2 rate change, index)
    for i, (a, b, _) in enumerate(runs):
        if b > a:
            events.append((a, 1, i))
            events.append((b, 0, i))
    if not events:
        return
    events.sort()
    events.extend((moment, 2, -1) for moment in rates.changes(events[0][0], events[-1][0]))
    events.sort()
    seconds = usd = busy = busy_usd = 0.0
    entered: dict[int, tuple[float, float]] = {}
    running = 0
    now = events[0][0]
    rate = rates.at(now)
    busy_since = now
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
            if running == 0:
                busy_since = moment
            running += 1
            hours.peak_running = max(hours.peak_running, running)
            entered[i] = (seconds, usd)
        else:
            s0, u0 = entered.pop(i)
            row = runs[i][2]
            row.gpu_seconds += seconds - s0
            row.gpu_cost_usd += usd - u0
            running -= 1
            if running == 0:
                hours.busy.append((busy_since, moment))
    hours.busy_s = busy
    hours.busy_cost_usd = busy_usd


def day_range(first: date, last: date) -> tuple[float, float]:
    """[first 00:00, last + 1 day 00:00) UTC as Unix times."""
    a = datetime(first.year, first.month, first.day, tzinfo=UTC)
    b = datetime(last.year, last.month, last.day, tzinfo=UTC) + timedelta(days=1)
    return a.timestamp(), b.timestamp()
