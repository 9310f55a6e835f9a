"""What the GPUs cost, per tenant: a worker's hours at its pool's hourly rate, shared among the requests it ran.

A worker is paid for over the time it was configured: the union of every gateway process's presence spans
(gateway.ledger.presence) and of the time it was seen answering (a worker that answered was there). Of that
time, it was busy while at least one request ran on it (a ledger record's span: its end, less ``worker_ms``).

**The measure**: each moment of a worker's busy time is shared equally among the requests running on it then.
A continuous-batching engine (vLLM, and the simulator) runs one step for all its running sequences at a time,
so a request's share of a step is its share of the batch: a request that decodes three times the tokens holds
its place in the batch three times as long and pays three times as much, and prefill, prefix-cache hits and
waiting inside the engine count as they really took. Token-weighted shares need per-token weights that move
with the batch size and the prompt length; this measure needs none. Why, and how it was checked against the
engine's own per-request time: docs/decisions/005-gpu-cost-attribution.md.

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
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from gateway.policy.schema import GpuPrice, Pool

GROUPS = ("tenant", "model", "tier", "class", "worker", "tag", "key")
COLUMN = {"class": "service_class", "tag": "tags", "key": "key_id"}
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
    busy_starts: array[float] = field(default_factory=lambda: array("d"))  # each [start, end) while anything ran,
    busy_ends: array[float] = field(default_factory=lambda: array("d"))  # in time order
    configured: tuple[float, float] | None = None  # the first and last moment it was paid for

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
    runs: dict[str, tuple[array[float], array[float]]] = field(default_factory=dict)  # worker -> requests' starts, ends
    ttft_ms: dict[tuple[str, str], array[float]] = field(default_factory=dict)  # (pool, tier) -> answered TTFTs

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


def _united(spans: Iterable[tuple[float, float]], starts: array[float], ends: array[float]
            ) -> Iterator[tuple[float, float]]:
    """``union`` of ``spans`` and the spans [starts[i], ends[i]) (in order, none overlapping), one span at a time:
    a worker's busy spans are never listed whole."""
    few = sorted(s for s in spans if s[1] > s[0])
    i = j = 0
    now: tuple[float, float] | None = None
    while i < len(few) or j < len(starts):
        if j >= len(starts) or (i < len(few) and few[i] <= (starts[j], ends[j])):
            a, b = few[i]
            i += 1
        else:
            a, b = starts[j], ends[j]
            j += 1
            if b <= a:
                continue
        if now is not None and a <= now[1]:
            if b > now[1]:
                now = (now[0], b)
        else:
            if now is not None:
                yield now
            now = (a, b)
    if now is not None:
        yield now


def report(records: Iterable[Mapping[str, Any]], presence: Iterable[Mapping[str, Any]], pools: Mapping[str, Pool],
           start: float, end: float, group_by: Sequence[str]) -> GpuReport:
    """The GPU report for [start, end). ``records`` may include records that end after ``end`` (their part
    before it counts); ``presence`` the spans that overlap the period."""
    return reports(records, presence, pools, start, end, [group_by])[0]


def reports(records: Iterable[Mapping[str, Any]], presence: Iterable[Mapping[str, Any]], pools: Mapping[str, Pool],
            start: float, end: float, groupings: Sequence[Sequence[str]]) -> list[GpuReport]:
    """The GPU report for [start, end) once per grouping in ``groupings``, from one pass over ``records`` and one
    sweep of each worker's busy time: each report's rows hold exactly the figures ``report`` gives that grouping
    alone (the same shares, added in the same order), and all share one set of workers' hours. ``records`` is
    read once, as it comes (an iterator of pages is never held whole); a record needs ``time``, ``worker``,
    ``worker_ms`` (or ``total_ms`` and ``queue_wait_ms``), ``status``, ``tier``, ``ttft_ms``, the token counts,
    ``cost_usd`` and the grouped columns.

    A month holds hundreds of thousands of requests, and this runs beside the event loop: each request is kept as
    numbers in arrays (its start, its end, the index of its groups' rows), never as an object of its own, so the
    interpreter's collector has no per-request objects to walk with the GIL held, and nothing per request is
    freed at the end (why: docs/decisions/009-finance-reads-off-the-loop.md)."""
    rates = {name: Rates(pool.gpu_usd_per_hour) for name, pool in pools.items()}
    pool_of = {str(url).rstrip("/"): name for name, pool in pools.items() for url in pool.workers}
    tables: list[dict[tuple[Any, ...], Row]] = [{} for _ in groupings]
    columns = [[COLUMN.get(g, g) for g in group_by] for group_by in groupings]
    every = [c for cols in columns for c in cols]
    combos: list[tuple[Row, ...]] = []  # each distinct set of grouped values: its row in each grouping
    combo_of: dict[tuple[Any, ...], int] = {}
    runs: dict[str, _Runs] = {}
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
    ttft: dict[tuple[str, str], array[float]] = {}
    for record in records:
        finished = epoch(record["time"])
        worker = record.get("worker")
        began = finished - span_of(record, finished) if worker else finished
        if finished < start or began >= end:
            continue
        values = tuple(map(record.get, every))
        combo = combo_of.get(values)
        if combo is None:
            mine, at_ = [], 0
            for rows, cols in zip(tables, columns, strict=True):
                key = values[at_:at_ + len(cols)]
                at_ += len(cols)
                row = rows.get(key)
                if row is None:
                    row = rows[key] = Row(key)
                mine.append(row)
            combo = combo_of[values] = len(combos)
            combos.append(tuple(mine))
        if finished < end:
            ok = record["status"] < 400
            prompt, completion = record["prompt_tokens"] or 0, record["completion_tokens"] or 0
            cost = record["cost_usd"] or 0.0
            for row in combos[combo]:
                row.requests += 1
                row.successful += ok
                row.prompt_tokens += prompt
                row.completion_tokens += completion
                row.list_cost_usd += cost
        if worker:
            hours = workers.get(worker)
            if hours is None:
                hours = workers[worker] = WorkerHours(worker, pool_of.get(worker))
            hours.requests += finished < end
            if record.get("ttft_ms") is not None and record["status"] < 400 and finished < end:
                ttft.setdefault((hours.pool or "", record["tier"]), array("d")).append(record["ttft_ms"])
            mine_runs = runs.get(worker)
            if mine_runs is None:
                mine_runs = runs[worker] = _Runs()
            mine_runs.starts.append(max(began, start))
            mine_runs.ends.append(min(finished, end))
            mine_runs.combos.append(combo)
    for name, hours in workers.items():
        if hours.pool is None:
            hours.pool = pool_of.get(name)
        pool_rates = rates.get(hours.pool or "") or Rates([])
        _share(hours, runs.get(name) or _Runs(), combos, pool_rates)
        lengths, costs = array("d"), array("d")
        for a, b in _united(present.get(name, []), hours.busy_starts, hours.busy_ends):
            if hours.configured is None:
                hours.configured = (a, b)
            hours.configured = (hours.configured[0], b)
            lengths.append(b - a)
            costs.append(pool_rates.cost(a, b))
        hours.configured_s = math.fsum(lengths)
        hours.up_s = math.fsum(b - a for a, b in _united(up.get(name, []), hours.busy_starts, hours.busy_ends))
        hours.cost_usd = math.fsum(costs)
    spans = {w: (r.starts, r.ends) for w, r in runs.items()}
    return [GpuReport(start, end, list(group_by), rows, workers, rates, spans, ttft)
            for group_by, rows in zip(groupings, tables, strict=True)]


@dataclass(slots=True)
class _Runs:
    """A worker's requests as numbers: each one's start and end inside the period, and its groups' rows (an index
    into ``reports``' combinations)."""

    starts: array[float] = field(default_factory=lambda: array("d"))
    ends: array[float] = field(default_factory=lambda: array("d"))
    combos: array[int] = field(default_factory=lambda: array("q"))


def _share(hours: WorkerHours, runs: _Runs, combos: list[tuple[Row, ...]], rates: Rates) -> None:
    """One sweep over a worker's request boundaries: ``seconds`` and ``usd`` are the running integrals of 1/n and
    rate/n over busy time (n requests running), so a request's share is their growth between its start and end.
    The boundaries are taken in order of (moment; ends, then starts, then rate changes; the request's index), from
    the starts and the ends each sorted by index: no object per boundary."""
    starts, ends = runs.starts, runs.ends
    ran = [i for i in range(len(starts)) if ends[i] > starts[i]]
    if not ran:
        return
    by_start = sorted(ran, key=starts.__getitem__)  # stable: ties keep the index order
    by_end = sorted(ran, key=ends.__getitem__)
    del ran
    changes = rates.changes(starts[by_start[0]], ends[by_end[-1]])
    entered_s, entered_usd = array("d", bytes(8 * len(starts))), array("d", bytes(8 * len(starts)))
    seconds = usd = busy = busy_usd = 0.0
    running = 0
    now = starts[by_start[0]]
    rate = rates.at(now)
    busy_since = now
    inf = math.inf
    n_start, n_end, n_change = len(by_start), len(by_end), len(changes)
    i_start = i_end = i_change = 0
    while i_start < n_start or i_end < n_end or i_change < n_change:
        at_end = ends[by_end[i_end]] if i_end < n_end else inf
        at_start = starts[by_start[i_start]] if i_start < n_start else inf
        at_change = changes[i_change] if i_change < n_change else inf
        if at_end <= at_start and at_end <= at_change:
            moment, kind = at_end, 0
        elif at_start <= at_change:
            moment, kind = at_start, 1
        else:
            moment, kind = at_change, 2
        if running and moment > now:
            dt = moment - now
            seconds += dt / running
            usd += dt * rate / 3600 / running
            busy += dt
            busy_usd += dt * rate / 3600
        now = moment
        if kind == 2:
            rate = rates.at(moment)
            i_change += 1
        elif kind == 1:
            i = by_start[i_start]
            i_start += 1
            if running == 0:
                busy_since = moment
            running += 1
            hours.peak_running = max(hours.peak_running, running)
            entered_s[i], entered_usd[i] = seconds, usd
        else:
            i = by_end[i_end]
            i_end += 1
            for row in combos[runs.combos[i]]:
                row.gpu_seconds += seconds - entered_s[i]
                row.gpu_cost_usd += usd - entered_usd[i]
            running -= 1
            if running == 0:
                hours.busy_starts.append(busy_since)
                hours.busy_ends.append(moment)
    hours.busy_s = busy
    hours.busy_cost_usd = busy_usd


def day_range(first: date, last: date) -> tuple[float, float]:
    """[first 00:00, last + 1 day 00:00) UTC as Unix times."""
    a = datetime(first.year, first.month, first.day, tzinfo=UTC)
    b = datetime(last.year, last.month, last.day, tzinfo=UTC) + timedelta(days=1)
    return a.timestamp(), b.timestamp()
