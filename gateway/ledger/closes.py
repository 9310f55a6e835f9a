"""Closed months: a statement finance can close, which never changes after, and adjustments for what came late.

A month's **statement** is, per tenant, its lines by model and by cost centre (the ledger's ``tags``): requests,
input/output/cached tokens, list-price spend, and the GPU cost the GPU report shares out of the workers' hours
(gateway.finance.gpu); the month's idle GPU cost per worker apart (never spread over tenants); the reconciliation
(the tenants' GPU cost plus idle is the workers' hours at their rate); and its **adjustments**.

**Closing** a month stores its statement as it stands, every line, as a JSON snapshot in ``ledger_closes`` (in
the ledger's own store: the data directory's SQLite, or the PostgreSQL replicas share). From then on the
statement of that month is its snapshot, whatever reaches the ledger later (a spooled batch replayed, a batch
line finishing late, a replica's clock behind). Months close in order: after the first close, only the month
after the latest closed one may close (each close names the one before it, and the table holds each previous
month once, so two closes racing on any replicas leave one chain: the loser is told so and may retry). Months
before the first close stay open: their statements are read live. The first close names a month the ledger holds
something of (a record, or a worker's span: ``holds``), never one before the ledger began: a first close of
1970-01 would leave every real month out of order for good.

**Reopening** a mistaken close removes the latest closed month's snapshot (``reopen``): its statement is read live
again, and it may close again. Only the latest closes reopen: a month with a later month closed after it stays
closed (the later snapshot took its adjustments against it). A close racing a reopen of the month before it is
withdrawn (``close`` answers None), so the chain never names a previous month that is not closed.

**Adjustments**: a record that reaches a closed month after its close is carried by the first open month after
the latest close, as a line "adjustment for 2026-11" per tenant and model: what the ledger holds now for each
closed month, less that month's snapshot, less the adjustments for it that later closed months' snapshots have
taken. A closed month's snapshot keeps the adjustments it carried, so every record is counted once across the
closed statements. Adjustments carry the ledger's figures (requests, tokens, list-price spend); a closed month's
GPU cost stays as closed: its workers' hours are what they were, and the share a late record would have taken
stays in that month's idle (the hours are counted once either way).

**The race of a record committed while a close runs**: the snapshot's usage figures are one SQL statement (one
consistent view of the ledger in both databases), so a record is in them or not, never in one view and missing
from another; whatever commits after that statement is not in the snapshot, so the next open month carries it
as an adjustment. A close does not hold the ledger's writers back: nothing waits, nothing is lost.

Everything here blocks (store calls): run it on a thread. The GPU figures come from a callable (the edge passes
gateway.finance.gpu_costs.gather bound to its store, policy and live presence), so the ledger imports nothing above
it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from gateway.errors import Conflict
from gateway.ledger.stores import OPEN_END, OPEN_START, LedgerStore, _Sql
from gateway.ledger.times import at, sortable

VERSION = 1  # the snapshot's shape
COUNTS = ("requests", "prompt_tokens", "completion_tokens", "cached_tokens")
USAGE = (*COUNTS, "cost_usd")
LINE = (*USAGE, "gpu_cost_usd")
SUMMARY = (*LINE, "adjustments_usd", "billable_usd")
WORKER = ("usd_per_hour", "configured_hours", "busy_hours", "idle_hours", "cost_usd", "idle_cost_usd")
# (start, end, group_by) -> the GPU report (gateway.finance.gpu_costs.gather's answer)
GpuReport = Callable[[float, float, list[str]], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Close:
    month: str
    previous: str  # the closed month before it; '' for the first close
    closed_at: str
    closed_by: str
    snapshot: dict[str, Any]

    def statement(self) -> dict[str, Any]:
        """The month's statement, as it was closed."""
        return self.snapshot | {"closed": True, "closed_at": self.closed_at, "closed_by": self.closed_by}

    def public(self) -> dict[str, str | None]:
        return {"month": self.month, "previous": self.previous or None, "closed_at": self.closed_at,
                "closed_by": self.closed_by}


def bounds(month: str) -> tuple[datetime, datetime]:
    """A valid ``YYYY-MM`` as [its first moment, the next month's) in UTC."""
    year, number = int(month[:4]), int(month[5:7])
    return datetime(year, number, 1, tzinfo=UTC), datetime(year + number // 12, number % 12 + 1, 1, tzinfo=UTC)


def next_month(month: str) -> str:
    return bounds(month)[1].strftime("%Y-%m")


def chain(store: LedgerStore) -> list[Close]:
    """Every closed month, in order."""
    return [Close(r["month"], r["previous"], r["closed_at"], r["closed_by"], orjson.loads(r["snapshot"]))
            for r in store.closes()]


def check(closes: Sequence[Close], month: str) -> None:
    """Conflict unless ``month`` may close now: not closed yet, and the month after the latest closed one."""
    if any(c.month == month for c in closes):
        raise Conflict(f"{month} is closed already; its statement stays as it was closed.", "month_closed")
    if closes and month != next_month(closes[-1].month):
        if month < closes[0].month:
            raise Conflict(f"Months close in order from the first closed one ({closes[0].month}); {month} is before "
                           "it and stays open.", "close_out_of_order")
        raise Conflict(f"Months close in order: close {next_month(closes[-1].month)} before {month}.",
                       "close_out_of_order")


def holds(store: LedgerStore, month: str) -> bool:
    """Does the ledger hold anything from before ``month`` ended: a record, or a worker's span (a month of idle
    GPUs is a month of the ledger too)? A first close may name only such a month."""
    end = sortable(bounds(month)[1])
    return bool(store.records(OPEN_START, end, None, None, 1)) or bool(store.presence(OPEN_START, end))


def first_month(store: LedgerStore) -> str | None:
    """The month of the ledger's first record (None: it holds none)."""
    first = store.records(OPEN_START, OPEN_END, None, None, 1)
    return first[0]["time"][:7] if first else None


def check_first(closes: Sequence[Close], month: str, held: bool, first: str | None) -> None:
    """Conflict when ``month`` would be the first close and the ledger holds nothing of it or before it
    (``held``: ``holds(store, month)``; ``first``: ``first_month(store)``, to say where the ledger begins)."""
    if closes or held:
        return
    where = f"its first record is in {first}" if first else "it holds no record yet"
    raise Conflict(f"{month} is before the ledger began ({where}): the first close names a month the ledger "
                   "holds, as months then close in order from it.", "month_before_ledger", param="month")


def check_reopen(closes: Sequence[Close], month: str) -> None:
    """Conflict unless ``month`` is the latest closed month (the only one that may reopen)."""
    if not any(c.month == month for c in closes):
        raise Conflict(f"{month} is not closed: there is nothing to reopen.", "month_not_closed", param="month")
    if closes[-1].month != month:
        raise Conflict(f"{closes[-1].month} is closed after {month}: only the latest closed month reopens "
                       f"(reopen {closes[-1].month} first).", "reopen_out_of_order", param="month")


def reopen(store: LedgerStore, month: str) -> Close | None:
    """Remove ``month``'s close when no later month is closed after it (one statement: a close of the month after
    it racing this one either stands, and this removes nothing, or comes after and is withdrawn); the close
    removed, or None when it was not removed (not closed, or a later month is)."""
    stood = next((c for c in chain(store) if c.month == month), None)
    if stood is None:
        return None
    _delete(store, "DELETE FROM ledger_closes WHERE month = {m} AND closed_at = {m} AND NOT EXISTS "
                   "(SELECT 1 FROM ledger_closes AS later WHERE later.previous = {m})",
            (month, stood.closed_at, month))
    return None if any(c.month == month for c in chain(store)) else stood


def _delete(store: LedgerStore, sql: str, args: tuple[str, ...]) -> None:
    """A DELETE on ``ledger_closes`` through the store's own writer (``{m}``: its placeholder). The stores have
    no method that removes a close; both take any statement through ``_write``."""
    assert isinstance(store, _Sql), "the ledger stores are SQL"
    store._write(sql.format(m=store.mark), [args])


def statement(store: LedgerStore, month: str, tenants: Iterable[str], gpu: GpuReport, now: float,
              closes: Sequence[Close]) -> dict[str, Any]:
    """The month's statement: its snapshot when closed, else read live from the ledger (``tenants``: the live
    policy's, each listed even without traffic)."""
    closed = next((c for c in closes if c.month == month), None)
    if closed is not None:
        return closed.statement()
    return live(store, month, tenants, gpu, now, closes) | {"closed": False, "closed_at": None, "closed_by": None}


def live(store: LedgerStore, month: str, tenants: Iterable[str], gpu: GpuReport, now: float,
         closes: Sequence[Close]) -> dict[str, Any]:
    first, after = bounds(month)
    start, end = sortable(first), sortable(after)
    rows = store.totals(start, end, ["tenant", "model", "tag"], None)  # one statement: one view of the ledger
    span = (first.timestamp(), max(first.timestamp(), min(after.timestamp(), now)))  # a GPU bills until now
    by_model = gpu(*span, ["tenant", "model"])
    by_tag = gpu(*span, ["tenant", "tag"])
    return assemble(month, rows, by_model, by_tag, carried(store, month, closes), tenants)


def close(store: LedgerStore, month: str, by: str, now: float, figures: dict[str, Any],
          closes: Sequence[Close]) -> Close | None:
    """Store ``figures`` (the month's live statement, read after ``closes``) as the month's snapshot; the close
    that stands, or None when another close won the race (this month's, or one after the same previous) or the
    month before was reopened meanwhile (this close is withdrawn)."""
    snapshot = {k: v for k, v in figures.items() if k not in ("closed", "closed_at", "closed_by")}
    row = {"month": month, "previous": closes[-1].month if closes else "", "closed_at": at(now), "closed_by": by,
           "snapshot": orjson.dumps(snapshot).decode()}
    store.add_close(row)
    now_closed = chain(store)
    stored = next((c for c in now_closed if c.month == month), None)
    if stored is None or (stored.closed_at, stored.previous, stored.snapshot) != (row["closed_at"], row["previous"],
                                                                                  snapshot):
        return None
    if stored.previous and not any(c.month == stored.previous for c in now_closed):
        # the month before was reopened while this close ran: withdraw it, so the chain holds no gap
        _delete(store, "DELETE FROM ledger_closes WHERE month = {m} AND closed_at = {m}", (month, stored.closed_at))
        return None
    return stored


def carried(store: LedgerStore, month: str, closes: Sequence[Close]) -> list[dict[str, Any]]:
    """The adjustments ``month`` carries: only the first open month after the latest close carries any."""
    if not closes or month != next_month(closes[-1].month):
        return []
    taken: dict[tuple[str, str, str | None], dict[str, float]] = {}
    for c in closes:
        for line in c.snapshot["by_model"]:
            _take(taken, (c.month, line["tenant"], line["model"]), line)
        for line in c.snapshot["adjustments"]:
            _take(taken, (line["for_month"], line["tenant"], line["model"]), line)
    out = []
    for c in closes:
        first, after = bounds(c.month)
        held = {(c.month, r["tenant"], r["model"]): r
                for r in store.totals(sortable(first), sortable(after), ["tenant", "model"], None)}
        for key in sorted({*held, *(k for k in taken if k[0] == c.month)}, key=_order):
            holds, before = held.get(key, {}), taken.get(key, {})
            diff = {f: (holds.get(f) or 0) - before.get(f, 0) for f in USAGE}
            if any(diff[f] for f in COUNTS):  # records are only ever added: a late one adds a request
                out.append({"for_month": c.month, "label": f"adjustment for {c.month}", "tenant": key[1],
                            "model": key[2], **{f: diff[f] for f in COUNTS}, "cost_usd": round(diff["cost_usd"], 9)})
    return out


def assemble(month: str, rows: list[dict[str, Any]], gpu_by_model: dict[str, Any], gpu_by_tag: dict[str, Any],
             adjustments: list[dict[str, Any]], tenants: Iterable[str]) -> dict[str, Any]:
    """A statement from what was read: the ledger's sums by tenant, model and tags, the two GPU reports and the
    adjustments (pure; its figures are what a snapshot keeps)."""
    first, after = bounds(month)
    by_model = _lines(rows, gpu_by_model, "model")
    by_tag = _lines(rows, gpu_by_tag, "tag")
    names = sorted({*tenants, *(line["tenant"] for line in [*by_model, *by_tag, *adjustments])})
    summary = [_summary(name, by_model, adjustments) for name in names]
    idle = [{"worker": w["worker"], "pool": w["pool"], **{k: w[k] for k in WORKER}} for w in gpu_by_model["workers"]
            if w["configured_hours"] or w["cost_usd"]]  # a worker this process sees now, not one of that month
    return {"object": "statement", "version": VERSION, "month": month, "from": sortable(first),
            "to": sortable(after), "tenant": None, "tenants": summary, "by_model": by_model,
            "by_cost_centre": by_tag, "idle": idle, "adjustments": adjustments,
            "reconciliation": gpu_by_model["reconciliation"], "total": _total(summary)}


def for_tenant(statement: dict[str, Any], tenant: str) -> dict[str, Any]:
    """One tenant's statement: its lines, its adjustments and its total; the workers' idle rows and the
    reconciliation stay whole (the GPUs' hours are everyone's)."""
    summary = [r for r in statement["tenants"] if r["tenant"] == tenant] or [_summary(tenant, [], [])]
    return statement | {
        "tenant": tenant, "tenants": summary,
        "by_model": [r for r in statement["by_model"] if r["tenant"] == tenant],
        "by_cost_centre": [r for r in statement["by_cost_centre"] if r["tenant"] == tenant],
        "adjustments": [r for r in statement["adjustments"] if r["tenant"] == tenant], "total": _total(summary)}


def _lines(rows: list[dict[str, Any]], gpu: dict[str, Any], group: str) -> list[dict[str, Any]]:
    """The ledger's sums folded to (tenant, ``group``), with each one's GPU share (a request that ran into the
    month and ended after it has a share and no request here)."""
    lines: dict[tuple[str, str | None], dict[str, Any]] = {}
    for r in rows:
        line = lines.setdefault((r["tenant"], r[group]), {"tenant": r["tenant"], group: r[group],
                                                          **dict.fromkeys(LINE, 0)})
        for f in USAGE:
            line[f] += r[f] or 0
    for g in gpu["data"]:
        if g["kind"] == "usage" and g["gpu_cost_usd"]:
            line = lines.setdefault((g["tenant"], g[group]), {"tenant": g["tenant"], group: g[group],
                                                              **dict.fromkeys(LINE, 0)})
            line["gpu_cost_usd"] += g["gpu_cost_usd"]
    out = [lines[k] for k in sorted(lines, key=_order)]
    for line in out:
        line["cost_usd"] = round(line["cost_usd"], 9)
        line["gpu_cost_usd"] = round(line["gpu_cost_usd"], 6)
    return out


def _summary(tenant: str, by_model: list[dict[str, Any]], adjustments: list[dict[str, Any]]) -> dict[str, Any]:
    mine = [r for r in by_model if r["tenant"] == tenant]
    row: dict[str, Any] = {"tenant": tenant, **{f: sum(r[f] for r in mine) for f in COUNTS},
                           "cost_usd": round(math.fsum(r["cost_usd"] for r in mine), 9),
                           "gpu_cost_usd": round(math.fsum(r["gpu_cost_usd"] for r in mine), 6),
                           "adjustments_usd": round(math.fsum(a["cost_usd"] for a in adjustments
                                                              if a["tenant"] == tenant), 9)}
    row["billable_usd"] = round(row["cost_usd"] + row["adjustments_usd"], 9)
    return row


def _total(summary: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {f: sum(r[f] for r in summary) for f in COUNTS}
    for f, places in (("cost_usd", 9), ("gpu_cost_usd", 6), ("adjustments_usd", 9), ("billable_usd", 9)):
        out[f] = round(math.fsum(r[f] for r in summary), places)
    return out


def _take(taken: dict[tuple[str, str, str | None], dict[str, float]], key: tuple[str, str, str | None],
          line: dict[str, Any]) -> None:
    into = taken.setdefault(key, dict.fromkeys(USAGE, 0))
    for f in USAGE:
        into[f] += line[f]


def _order(key: tuple[Any, ...]) -> tuple[str, ...]:
    return tuple("" if k is None else str(k) for k in key)
