"""An ordinary month at scale against a gateway process: 200,000 ledger records with 20,000 end users (a ``user``
tag each) seeded into its ledger, the month's statement read as JSON and as a workbook while /healthz is polled
from another thread. The event loop keeps answering during each build, which runs on the report thread (the
gateway's log says so); each tenant's cost centres are its 200 largest and one "other" line; and the figures are
the ledger's own, summed here straight from its SQLite file."""

from __future__ import annotations

import io
import math
import re
import sqlite3
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import openpyxl
import pytest

from gateway.ledger.centres import OTHER, TOP
from gateway.ledger.times import at
from loadtest.harness.ledger import TENANTS, seed_month
from tests.conftest import FINANCE_TOKEN, Proc, policy_dict, wait_for

RECORDS, USERS = 200_000, 20_000
RATE = 36.0
FINANCE = {"Authorization": f"Bearer {FINANCE_TOKEN}"}
BUILT = re.compile(r"report built: statement (\S+) (\w+) in [0-9.]+ s on (\S+),")


def ledger_totals(path: Path, start: str, end: str) -> dict[str, dict[str, float]]:
    """Per tenant, the records' counts and spend, summed straight from the SQLite file (not through the
    gateway's code)."""
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT tenant, count(*), sum(prompt_tokens), sum(completion_tokens), sum(cost_usd), "
                          "count(DISTINCT tags) FROM ledger WHERE time >= ? AND time < ? GROUP BY tenant",
                          (start, end)).fetchall()
    return {r[0]: {"requests": r[1], "prompt_tokens": r[2], "completion_tokens": r[3], "cost_usd": r[4],
                   "centres": r[5]} for r in rows}


class Poller(threading.Thread):
    """GET /healthz back to back over one connection, each answer's moments kept (monotonic seconds)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop, self.ready = url, threading.Event(), threading.Event()
        self.answers: list[tuple[float, float]] = []
        self.failures = 0

    def run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                sent = time.monotonic()
                if client.get(self.url + "/healthz").status_code == 200:
                    self.answers.append((sent, time.monotonic()))
                    self.ready.set()
                else:
                    self.failures += 1

    def within(self, start: float, end: float) -> int:
        """Answers to requests sent after ``start`` and answered before ``end``."""
        return sum(1 for sent, answered in self.answers if sent >= start and answered <= end)


def build_while_polled(gateway: Proc, month: str, fmt: str) -> tuple[httpx.Response, int]:
    """The month's statement in ``fmt``, and how many /healthz answers came while it was being built: between
    the request and the first byte of its answer (a statement's body is complete before its answer starts)."""
    poller = Poller(gateway.url)
    poller.start()
    try:
        with httpx.Client(timeout=300) as client:
            assert poller.ready.wait(30), "the poller's connection is up and answering"
            asked = time.monotonic()
            with client.stream("GET", gateway.url + "/admin/statements", headers=FINANCE,
                               params={"month": month, "format": fmt}) as response:
                started = time.monotonic()
                response.read()
    finally:
        poller.stop.set()
        poller.join()
    assert poller.failures == 0
    return response, poller.within(asked, started)


def test_a_month_of_200000_records_and_20000_users_leaves_the_gateway_answering(
        start_gateway: Callable[..., Proc], start_sim: Callable[..., Proc], tmp_path: Path) -> None:
    sim = start_sim()
    this_month = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    first = (this_month - timedelta(days=1)).replace(day=1)
    month = first.strftime("%Y-%m")
    data_dir = tmp_path / "gateway-data"
    data_dir.mkdir()
    seed_month(data_dir / "ledger.sqlite3", first, RECORDS, USERS, sim.url, 43, prefix="scale")
    truth = ledger_totals(data_dir / "ledger.sqlite3", at(first.timestamp()), at(this_month.timestamp()))
    assert sum(t["requests"] for t in truth.values()) == RECORDS and all(t["centres"] > TOP for t in truth.values())
    gateway = start_gateway(policy_dict([sim.url], gpu_usd_per_hour=RATE), data_dir=data_dir)

    answer, during = build_while_polled(gateway, month, "json")
    assert answer.status_code == 200, answer.text
    # a build on the event loop answers no /healthz sent during it: at most one already in flight when it began,
    # and one handled just before its own answer is written
    assert during > 2, during
    out = answer.json()
    for tenant in TENANTS:
        summary = next(r for r in out["tenants"] if r["tenant"] == tenant)
        for key in ("requests", "prompt_tokens", "completion_tokens"):
            assert summary[key] == truth[tenant][key], (tenant, key)
        assert summary["cost_usd"] == pytest.approx(truth[tenant]["cost_usd"], abs=1e-8)
        lines = [r for r in out["by_cost_centre"] if r["tenant"] == tenant]
        tags = [r["tag"] for r in lines]
        assert len(lines) == len(set(tags)) <= TOP + 2, "its top cost centres, untagged, and one other line"
        assert OTHER in tags and None in tags and len({t for t in tags if t not in (None, OTHER)}) == TOP
        for key in ("requests", "prompt_tokens", "completion_tokens", "cached_tokens"):
            assert sum(r[key] for r in lines) == summary[key], (tenant, key)
        # each line is rounded (to 9 places, GPU cost to 6): the sum is within a rounding per line
        assert math.fsum(r["cost_usd"] for r in lines) == pytest.approx(summary["cost_usd"], abs=len(lines) * 1e-9)
        assert math.fsum(r["gpu_cost_usd"] for r in lines) == pytest.approx(summary["gpu_cost_usd"],
                                                                           abs=len(lines) * 1e-6)
        other = next(r for r in lines if r["tag"] == OTHER)
        kept = min(r["cost_usd"] for r in lines if r["tag"] not in (None, OTHER))
        assert other["requests"] > 0 and other["cost_usd"] > kept, "the rest, summed"
    assert out["total"]["requests"] == RECORDS
    rec = out["reconciliation"]
    assert rec["workers_cost_usd"] > 0 and abs(rec["difference_usd"]) < 1e-6
    assert out["total"]["gpu_cost_usd"] == pytest.approx(rec["attributed_usd"], abs=1e-4)

    book, during = build_while_polled(gateway, month, "xlsx")
    assert book.status_code == 200 and during > 2, (book.status_code, during)
    sheets = openpyxl.load_workbook(io.BytesIO(book.content), read_only=True)
    by_centre = list(sheets["By cost centre"].iter_rows(min_row=2, values_only=True))
    assert len(by_centre) == len(out["by_cost_centre"]) + 1, "each line and the total"
    assert by_centre[-1][0] == "Total" and by_centre[-1][2] == RECORDS

    assert wait_for(lambda: len(BUILT.findall(gateway.output())) == 2, timeout=10), gateway.output()[-2000:]
    built = BUILT.findall(gateway.output())
    assert [(m, fmt) for m, fmt, _ in built] == [(month, "json"), (month, "xlsx")], built
    assert all(thread.startswith("tollgate-report") for _, _, thread in built), "on the report thread"
