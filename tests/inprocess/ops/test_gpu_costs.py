"""The GPU gauges: fed from steps of a real SQLite ledger, fleet-wide figures by worker and tier. Each step is
gathered once, so the gauges read a record about twice however long their window (the window read whole at each
refresh read it 15 times), and the steps add up to the report over the same period."""

from __future__ import annotations

import asyncio
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.finance import gpu_costs
from gateway.finance.gpu import report
from gateway.finance.gpu_costs import REFRESH_S, STEPS, Window, gather
from gateway.ledger.stores import SqliteLedger
from gateway.ops.metrics import GatewayMetrics
from gateway.policy.schema import Policy
from tests.inprocess.ledger.test_gpu import T0, A, B, presence, record

POLICY = Policy.model_validate({"allow_empty": True, "pools": {"gpu": {"workers": [A, B], "gpu_usd_per_hour": 3.6}}})
assert T0 % REFRESH_S == 0  # T0 is a step's start: T0 + s below is s seconds into the steps from T0


def value(metrics: GatewayMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def stored(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """As the ledger holds them: with the columns the GPU report does not read."""
    return [r | {"id": f"r{i}", "request_id": f"q{i}", "endpoint": "chat", "stream": False, "estimated": False,
                 "cached_tokens": 0} for i, r in enumerate(records)]


class CountingLedger(SqliteLedger):
    """A ledger that counts how often each record was read."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.reads: Counter[str] = Counter()

    def records(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        rows = super().records(*args, **kwargs)
        self.reads.update(r["id"] for r in rows)
        return rows


@contextmanager
def ledger(records: Sequence[dict[str, Any]], spans: Sequence[dict[str, Any]]) -> Iterator[CountingLedger]:
    with tempfile.TemporaryDirectory() as where:
        store = CountingLedger(Path(where) / "ledger.sqlite3")
        store.insert(stored(records))
        store.extend_presence(spans)
        try:
            yield store
        finally:
            store.close()


def test_the_gauges_show_busy_and_idle_seconds_per_worker_and_cost_per_1k_per_tier() -> None:
    rows = [record("t", A, 0, 10, status=200) for _ in range(2)]
    with ledger(rows, [presence(A, 0, 100), presence(B, 0, 100, replica="r2")]) as store:
        window = Window(store)
        window.refresh(T0 + 4 * REFRESH_S, POLICY, [])  # the newest step gathered ends at T0 + 2 steps
        metrics = GatewayMetrics()
        window.publish(metrics)
    assert value(metrics, "tollgate_gpu_busy_seconds", pool="gpu", worker=A) == pytest.approx(10, abs=1e-6)
    assert value(metrics, "tollgate_gpu_idle_seconds", pool="gpu", worker=A) == pytest.approx(90, abs=1e-6)
    assert value(metrics, "tollgate_gpu_idle_seconds", pool="gpu", worker=B) == pytest.approx(100, abs=1e-6)
    # 10 s at $3.60/h is a cent, shared by two requests: $5 per 1,000
    assert value(metrics, "tollgate_gpu_cost_per_1k_requests_usd", tier="standard") == pytest.approx(5.0, abs=1e-9)


def mismatches(records: list[dict[str, Any]], spans: list[dict[str, Any]], steps: int) -> list[str]:
    """Where the window's steps, gathered at the moment its newest is due, differ from the report over the same
    period computed at once from the same records."""
    now = T0 + (steps + 2) * REFRESH_S
    with ledger(records, spans) as store:
        window = Window(store)
        window.refresh(now, POLICY, [])
    start, end = T0 + (steps - STEPS) * REFRESH_S, T0 + steps * REFRESH_S
    whole = report(records, spans, POLICY.pools, start, end, ["tier"])
    busy, idle, per_1k = window.totals()
    wrong = []
    for w in whole.workers.values():
        if busy.get((w.pool or "", w.worker), 0.0) != pytest.approx(w.busy_s, abs=1e-6):
            wrong.append(f"busy {w.worker}: {busy.get((w.pool or '', w.worker))} against {w.busy_s}")
        if idle.get((w.pool or "", w.worker), 0.0) != pytest.approx(w.idle_s, abs=1e-6):
            wrong.append(f"idle {w.worker}: {idle.get((w.pool or '', w.worker))} against {w.idle_s}")
    expected = {row.key[0]: row.gpu_cost_usd * 1000 / row.successful for row in whole.rows.values() if row.successful}
    if per_1k.keys() != expected.keys() or any(per_1k[t] != pytest.approx(v, rel=1e-9, abs=1e-12)
                                               for t, v in expected.items()):
        wrong.append(f"per 1k: {per_1k} against {expected}")
    return wrong


@st.composite
def traffic(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Up to 40 requests on two workers over a window, each shorter than a step (the steps' stated bound), some
    across a step's edge or the window's, in two tiers, some refused; and the workers' presence spans."""
    steps = draw(st.integers(1, STEPS + 3))
    span = steps * REFRESH_S
    records = []
    for _ in range(draw(st.integers(0, 40))):
        began = draw(st.floats(-REFRESH_S, span, allow_nan=False))
        length = draw(st.floats(0, REFRESH_S * 0.99, allow_nan=False))
        records.append(record("t", draw(st.sampled_from([A, B])), began, began + length,
                              status=draw(st.sampled_from([200, 200, 429, 502])),
                              tier=draw(st.sampled_from(["standard", "premium"]))))
    spans = [presence(w, draw(st.floats(-span, span)), span + REFRESH_S, replica=f"r{i}")
             for i, w in enumerate(draw(st.lists(st.sampled_from([A, B]), max_size=3)))]
    return records, spans, steps


@settings(max_examples=60, deadline=None)
@given(drawn=traffic())
def test_the_steps_add_up_to_the_report_over_their_window(
        drawn: tuple[list[dict[str, Any]], list[dict[str, Any]], int]) -> None:
    records, spans, steps = drawn
    assert mismatches(records, spans, steps) == []


def test_the_control_steps_that_read_only_their_own_finishers_lose_a_request_across_an_edge() -> None:
    """The positive control: a step that reads only the records that finished inside it loses the part of a
    request that began in the step before, and the property above catches it."""
    records = [record("t", A, REFRESH_S - 20, REFRESH_S + 20)]
    spans = [presence(A, 0, 4 * REFRESH_S)]
    assert mismatches(records, spans, 2) == []
    real = gpu_costs._reports

    def own_finishers(store: Any, policy: Policy, start: float, end: float, until: float, *rest: Any) -> Any:
        return real(store, policy, start, end, end, *rest)

    with mock.patch.object(gpu_costs, "_reports", own_finishers):
        assert mismatches(records, spans, 2) != []


def test_a_record_is_read_at_most_twice_by_refreshes_at_every_step_and_by_a_start_amid_them() -> None:
    """A refresh at each step's start for an hour, and a second window started half an hour in (a restart), on
    a copy of the ledger: each reads a record in two steps at most, and both hold the same steps. The control,
    the window's whole period read at each refresh as before, reads a record 15 times."""
    records = [record("t", A, s, s + (s % 29)) for s in range(0, 3600, 3)]
    spans = [presence(A, 0, 3600)]
    with ledger(records, spans) as store, ledger(records, spans) as copy:
        window, restarted = Window(store), Window(copy)
        for minute in range(61):
            now = T0 + minute * REFRESH_S + 0.25
            assert (now - 3 * REFRESH_S) < Window.newest(now) * REFRESH_S <= now - 2 * REFRESH_S
            window.refresh(now, POLICY, [])
            if minute >= 30:
                restarted.refresh(now, POLICY, [])
        assert max(store.reads.values()) == 2 and max(copy.reads.values()) == 2
        assert len(window.steps) == STEPS and window.totals() == restarted.totals()
        store.reads.clear()
        for minute in range(15, 61):
            now = T0 + minute * REFRESH_S
            gather(store, POLICY, now - gpu_costs.WINDOW_S, now, ["tier"], [], False)
        assert max(store.reads.values()) >= 15, "the control: the whole window read at each refresh"


def test_a_refresh_that_fails_keeps_the_steps_gathered_and_the_next_gathers_the_rest() -> None:
    records = [record("t", A, s, s + 10) for s in range(0, 900, 7)]
    with ledger(records, [presence(A, 0, 900)]) as store:
        failing, steady = Window(store), Window(store)
        now = T0 + 17 * REFRESH_S
        real = gpu_costs.step
        calls = iter(range(100))

        def fails_fourth(*args: Any) -> gpu_costs.Step:
            if next(calls) == 3:
                raise OSError("the store is down")
            return real(*args)

        with mock.patch.object(gpu_costs, "step", fails_fourth), pytest.raises(OSError):
            failing.refresh(now, POLICY, [])
        assert len(failing.steps) == 3
        failing.refresh(now, POLICY, [])
        steady.refresh(now, POLICY, [])
        assert failing.totals() == steady.totals()


def test_a_clock_set_back_drops_the_steps_from_the_future_and_gathers_the_window_again() -> None:
    records = [record("t", A, s, s + 10) for s in range(0, 900, 7)]
    with ledger(records, [presence(A, 0, 900)]) as store:
        jumped, steady = Window(store), Window(store)
        now = T0 + 17 * REFRESH_S
        jumped.refresh(now + 86_400, POLICY, [])
        jumped.refresh(now, POLICY, [])
        steady.refresh(now, POLICY, [])
        assert [s.end for s in jumped.steps] == [s.end for s in steady.steps]
        assert jumped.totals() == steady.totals() and steady.totals()[0]


def test_a_request_longer_than_a_step_counts_its_last_one_to_two_steps_as_stated() -> None:
    """The steps' stated bound, both ways: a 5-minute request alone on its worker shows in the gauges only its
    time in the step it ended in and the one before (the report counts all five minutes)."""
    with ledger([record("t", A, 10, 310)], [presence(A, 0, 900)]) as store:
        window = Window(store)
        window.refresh(T0 + 10 * REFRESH_S, POLICY, [])
        busy = window.totals()[0][("gpu", A)]
    assert busy == pytest.approx(310 - 4 * REFRESH_S)  # the step [240, 300) and its part of [300, 360)


class EarlyClock:
    """A wall clock whose sleeps end a millisecond early, as a loop's timer may against ``time.time``; the
    sixth sleep ends the task."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.wakes = 0

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.wakes += 1
        if self.wakes > 5:
            raise asyncio.CancelledError
        self.now += max(0.0, seconds) - 0.001


async def inline(fn: Any, *args: Any) -> Any:
    return fn(*args)


def test_the_gauges_task_gathers_a_step_each_minute_though_its_timer_fires_early() -> None:
    """Five wake-ups, each a millisecond before the minute: the newest step held is the one due at the last
    minute, as with a punctual timer. The control: the clock as it reads at that early wake-up (what the task
    once gathered by) is a step behind."""
    start = T0 + 20 * REFRESH_S + 5
    clock, held = EarlyClock(start), []
    real = gpu_costs.Window

    def kept(store: Any) -> Window:
        held.append(real(store))
        return held[0]

    with ledger([record("t", A, 0, 10)], [presence(A, 0, 900)]) as store, \
            mock.patch.object(gpu_costs.time, "time", clock.time), \
            mock.patch.object(gpu_costs.asyncio, "sleep", clock.sleep), \
            mock.patch.object(gpu_costs.asyncio, "to_thread", inline), \
            mock.patch.object(gpu_costs, "Window", kept), pytest.raises(asyncio.CancelledError):
        asyncio.run(gpu_costs.keep_gauges(GatewayMetrics(), store, lambda: POLICY, lambda now: []))
    assert held[0].steps[-1].end == T0 + 23 * REFRESH_S
    assert Window.newest(clock.now) * REFRESH_S == T0 + 22 * REFRESH_S, "the control: a step behind"
