"""Closed months over a real ledger (SQLite in tmp_path, and PostgreSQL): a closed statement never changes, a
record that reaches a closed month late is carried once as an adjustment by the first open month after the latest
close, months close in order and once, and two closes racing leave one chain; the first close names a month the
ledger holds, the latest close reopens (none before it), and a close racing a reopen leaves no gap."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.errors import Conflict
from gateway.finance.gpu_costs import gather
from gateway.ledger import closes
from gateway.ledger.stores import COLUMNS, LedgerStore, SqliteLedger
from gateway.ledger.times import at
from gateway.policy.schema import Policy

WORKER = "http://gpu-a:8000"
RATE = 3.6  # USD per worker-hour: a thousandth of a dollar a second
NOW = datetime(2027, 2, 10, tzinfo=UTC).timestamp()  # every month below has ended
TENANTS = ("demo", "prem", "bulk")
POLICY = Policy.model_validate({"allow_empty": True,
                                "pools": {"main": {"workers": [WORKER], "gpu_usd_per_hour": RATE}}})
_ids = iter(range(1, 10**6))


def moment(month: str, day: int, second: float = 0.0) -> float:
    return datetime(int(month[:4]), int(month[5:]), day, 10, tzinfo=UTC).timestamp() + second


def record(tenant: str, when: float, model: str | None = "m-small", cost: float = 0.001, tags: str | None = None,
           ran_s: float = 2.0, prompt: int = 10, completion: int = 20) -> dict[str, Any]:
    """A ledger record as the writer stores it: it ended at ``when`` after ``ran_s`` on the worker."""
    n = next(_ids)
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    return row | {"id": f"rec-{n:06d}", "request_id": f"req-{n}", "time": at(when), "tenant": tenant,
                  "tier": "standard", "service_class": "standard", "model": model, "endpoint": "chat",
                  "stream": False, "status": 200, "prompt_tokens": prompt, "completion_tokens": completion,
                  "cached_tokens": 4, "estimated": False, "cost_usd": cost, "worker": WORKER,
                  "worker_ms": ran_s * 1000, "total_ms": ran_s * 1000, "tags": tags}


def span(month: str, hours: float = 1.0) -> dict[str, Any]:
    since = moment(month, 3) - 60
    return {"id": f"r1:{WORKER}:{month}", "replica": "r1", "worker": WORKER, "pool": "main", "up": True,
            "since": at(since), "until": at(since + hours * 3600)}


def gpu(store: LedgerStore) -> closes.GpuReport:
    return lambda start, end, group_by: gather(store, POLICY, start, end, group_by, [])


def read(store: LedgerStore, month: str) -> dict[str, Any]:
    return closes.statement(store, month, TENANTS, gpu(store), NOW, closes.chain(store))


def close(store: LedgerStore, month: str) -> closes.Close:
    chain = closes.chain(store)
    closes.check(chain, month)
    stored = closes.close(store, month, "admin", NOW, read(store, month), chain)
    assert stored is not None
    return stored


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LedgerStore]:
    made = SqliteLedger(tmp_path / "ledger.sqlite3")
    yield made
    made.close()


@pytest.fixture(params=["sqlite"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LedgerStore]:
    """Each store the ledger runs on in this process (the PostgreSQL one that replicas share:
    tests/process/ledger/test_closes.py runs the same tests on it)."""
    made = SqliteLedger(tmp_path / "ledger.sqlite3")
    yield made
    made.close()


def october(store: LedgerStore) -> None:
    store.insert([record("demo", moment("2026-10", 3, 10), tags="project=search"),
                  record("demo", moment("2026-10", 3, 11), model="m-large", cost=0.004, tags="project=search"),
                  record("demo", moment("2026-10", 4), tags=None),
                  record("prem", moment("2026-10", 3, 12), cost=0.002, tags="project=ads,user=u1"),
                  record("gone", moment("2026-10", 5), cost=0.5)])  # a tenant that has left the policy
    store.extend_presence([span("2026-10")])


def test_a_statement_lists_every_tenant_with_lines_by_model_and_cost_centre(store: LedgerStore) -> None:
    october(store)
    out = read(store, "2026-10")
    assert out["closed"] is False and out["closed_at"] is None
    assert [r["tenant"] for r in out["tenants"]] == ["bulk", "demo", "gone", "prem"], \
        "the policy's tenants (bulk at zero) and the one that left it"
    bulk = next(r for r in out["tenants"] if r["tenant"] == "bulk")
    assert bulk == {"tenant": "bulk", "requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0,
                    "cost_usd": 0.0, "gpu_cost_usd": 0.0, "adjustments_usd": 0.0, "billable_usd": 0.0}
    demo_models = [(r["model"], r["requests"], r["cost_usd"]) for r in out["by_model"] if r["tenant"] == "demo"]
    assert demo_models == [("m-large", 1, 0.004), ("m-small", 2, 0.002)]
    demo_tags = [(r["tag"], r["requests"]) for r in out["by_cost_centre"] if r["tenant"] == "demo"]
    assert demo_tags == [(None, 1), ("project=search", 2)], "untagged is its own line"
    assert out["total"]["requests"] == 5 and out["total"]["cost_usd"] == pytest.approx(0.508)
    assert out["total"]["cached_tokens"] == 20
    # the GPU: an hour present at $3.60/h, and the 2 s of each of the two requests run outside it (a worker that
    # answered was there)
    rec = out["reconciliation"]
    assert rec["workers_cost_usd"] == pytest.approx(3.604, abs=1e-6)
    assert rec["attributed_usd"] + rec["idle_usd"] == pytest.approx(rec["workers_cost_usd"], abs=1e-9)
    assert out["total"]["gpu_cost_usd"] == pytest.approx(rec["attributed_usd"], abs=1e-6)
    (idle,) = out["idle"]
    assert idle["worker"] == WORKER and idle["idle_cost_usd"] == pytest.approx(rec["idle_usd"], abs=1e-6)
    assert sum(r["gpu_cost_usd"] for r in out["by_cost_centre"]) == pytest.approx(out["total"]["gpu_cost_usd"],
                                                                                  abs=1e-6)
    assert out["adjustments"] == [], "nothing is closed: nothing to adjust"
    demo = closes.for_tenant(out, "demo")
    assert [r["tenant"] for r in demo["tenants"]] == ["demo"] and demo["total"]["requests"] == 3
    assert {r["tenant"] for r in demo["by_model"] + demo["by_cost_centre"]} == {"demo"}
    assert demo["idle"] == out["idle"], "the workers' idle hours are everyone's"


def test_a_closed_month_never_changes_and_late_records_are_carried_once(ledger: LedgerStore) -> None:
    october(ledger)
    closed = close(ledger, "2026-10")
    assert closed.previous == "" and closed.closed_by == "admin"
    before = read(ledger, "2026-10")
    assert before["closed"] is True and before["closed_at"] == at(NOW)

    # a spooled record replayed after the close, and November's own traffic
    ledger.insert([record("demo", moment("2026-10", 20), cost=0.25, prompt=100, completion=7),
                  record("prem", moment("2026-11", 2), cost=0.01)])
    assert read(ledger, "2026-10") == before, "the closed statement is its snapshot"
    live = closes.live(ledger, "2026-10", TENANTS, gpu(ledger), NOW, [])
    assert live["total"]["requests"] == 6, "the ledger itself does hold the late record"

    november = read(ledger, "2026-11")
    assert november["adjustments"] == [{"for_month": "2026-10", "label": "adjustment for 2026-10", "tenant": "demo",
                                        "model": "m-small", "requests": 1, "prompt_tokens": 100,
                                        "completion_tokens": 7, "cached_tokens": 4, "cost_usd": 0.25}]
    demo = next(r for r in november["tenants"] if r["tenant"] == "demo")
    assert (demo["requests"], demo["cost_usd"], demo["adjustments_usd"], demo["billable_usd"]) == (0, 0.0, 0.25, 0.25)
    assert november["total"]["billable_usd"] == pytest.approx(0.26)
    assert read(ledger, "2026-12")["adjustments"] == [], "only the first open month after the close carries them"

    close(ledger, "2026-11")
    ledger.insert([record("demo", moment("2026-10", 21), cost=0.125),  # later still, for October again
                  record("prem", moment("2026-11", 29), model="m-large", cost=0.03)])  # and for November
    assert read(ledger, "2026-11")["adjustments"] == november["adjustments"], "November keeps what it carried"
    december = read(ledger, "2026-12")
    assert [(a["label"], a["tenant"], a["model"], a["requests"], a["cost_usd"]) for a in december["adjustments"]] == [
        ("adjustment for 2026-10", "demo", "m-small", 1, 0.125),
        ("adjustment for 2026-11", "prem", "m-large", 1, 0.03)], "less what November's snapshot took"

    # every record counted once: its month as closed, what November carried, what December carries now
    carried = [*read(ledger, "2026-11")["adjustments"], *december["adjustments"]]
    for month in ("2026-10", "2026-11"):
        held = closes.live(ledger, month, TENANTS, gpu(ledger), NOW, [])["total"]
        counted = [read(ledger, month)["total"], *(a for a in carried if a["for_month"] == month)]
        assert sum(c["requests"] for c in counted) == held["requests"]
        assert sum(c["cost_usd"] for c in counted) == pytest.approx(held["cost_usd"], abs=1e-9)


def test_a_record_committed_while_a_close_runs_is_carried_by_the_next_month(store: LedgerStore) -> None:
    october(store)
    chain = closes.chain(store)
    figures = read(store, "2026-10")  # the close has read the ledger...
    store.insert([record("prem", moment("2026-10", 31, 3600 * 13), cost=0.07)])  # ...a record commits...
    assert closes.close(store, "2026-10", "admin", NOW, figures, chain) is not None  # ...and the close is stored
    assert read(store, "2026-10")["total"]["requests"] == 5, "the snapshot is what the close read"
    (carried,) = read(store, "2026-11")["adjustments"]
    assert (carried["tenant"], carried["requests"], carried["cost_usd"]) == ("prem", 1, 0.07)


def test_months_close_in_order_and_once(store: LedgerStore) -> None:
    october(store)
    close(store, "2026-10")
    with pytest.raises(Conflict) as twice:
        closes.check(closes.chain(store), "2026-10")
    assert twice.value.code == "month_closed"
    with pytest.raises(Conflict) as skipped:
        closes.check(closes.chain(store), "2026-12")
    assert skipped.value.code == "close_out_of_order" and "close 2026-11 before 2026-12" in skipped.value.message
    with pytest.raises(Conflict) as earlier:
        closes.check(closes.chain(store), "2026-09")
    assert earlier.value.code == "close_out_of_order" and "stays open" in earlier.value.message
    assert [c.public() for c in closes.chain(store)] == [
        {"month": "2026-10", "previous": None, "closed_at": at(NOW), "closed_by": "admin"}]


def test_two_closes_racing_leave_one_chain(ledger: LedgerStore) -> None:
    october(ledger)
    empty: list[closes.Close] = []
    # two replicas both see nothing closed: one first close stands, whichever month the other asked for
    first = closes.close(ledger, "2026-10", "admin", NOW, read(ledger, "2026-10"), empty)
    assert first is not None
    assert closes.close(ledger, "2026-11", "admin", NOW + 1, read(ledger, "2026-11"), empty) is None
    assert closes.close(ledger, "2026-10", "admin", NOW + 2, read(ledger, "2026-10"), empty) is None
    chain = closes.chain(ledger)
    assert [c.month for c in chain] == ["2026-10"] and chain[0].closed_at == at(NOW)
    # two closes of November, read against the same chain: one stands
    figures = read(ledger, "2026-11")
    assert closes.close(ledger, "2026-11", "admin", NOW + 3, figures, chain) is not None
    assert closes.close(ledger, "2026-11", "admin", NOW + 4, figures, chain) is None
    assert [(c.month, c.previous) for c in closes.chain(ledger)] == [("2026-10", ""), ("2026-11", "2026-10")]


def test_a_first_close_names_a_month_the_ledger_holds(ledger: LedgerStore) -> None:
    """1970-01 on a ledger that starts in 2026-10 would close, and leave every real month out of order for good:
    the first close is refused before the ledger's first month, which it names; a worker's span counts as the
    ledger holding that month (its idle GPUs are billed)."""
    assert closes.first_month(ledger) is None and not closes.holds(ledger, "2026-10")
    with pytest.raises(Conflict) as empty:
        closes.check_first([], "2026-10", closes.holds(ledger, "2026-10"), closes.first_month(ledger))
    assert empty.value.code == "month_before_ledger" and "holds no record yet" in empty.value.message
    october(ledger)
    assert closes.first_month(ledger) == "2026-10"
    for month in ("1970-01", "2026-08"):
        with pytest.raises(Conflict) as early:
            closes.check_first([], month, closes.holds(ledger, month), closes.first_month(ledger))
        assert (early.value.code, early.value.param) == ("month_before_ledger", "month")
        assert f"{month} is before the ledger began (its first record is in 2026-10)" in early.value.message
    for month in ("2026-10", "2026-11", "2027-01"):
        assert closes.holds(ledger, month)
        closes.check_first([], month, True, "2026-10")
    ledger.extend_presence([span("2026-09")])  # the GPUs were up a month before the first request
    assert closes.holds(ledger, "2026-09") and not closes.holds(ledger, "2026-08")
    stood = close(ledger, "2026-10")
    closes.check_first([stood], "1970-01", False, "2026-10")  # past the first close, check orders months


def test_the_latest_close_reopens_and_the_month_closes_again(ledger: LedgerStore) -> None:
    october(ledger)
    close(ledger, "2026-10")
    november = close(ledger, "2026-11")
    with pytest.raises(Conflict) as earlier:
        closes.check_reopen(closes.chain(ledger), "2026-10")
    assert earlier.value.code == "reopen_out_of_order" and "reopen 2026-11 first" in earlier.value.message
    with pytest.raises(Conflict) as open_month:
        closes.check_reopen(closes.chain(ledger), "2026-12")
    assert open_month.value.code == "month_not_closed"
    assert closes.reopen(ledger, "2026-10") is None, "the store refuses it too: November names October"
    assert [c.month for c in closes.chain(ledger)] == ["2026-10", "2026-11"]

    assert closes.reopen(ledger, "2026-11") == november
    assert [c.month for c in closes.chain(ledger)] == ["2026-10"]
    assert closes.reopen(ledger, "2026-11") is None, "reopened once"
    ledger.insert([record("prem", moment("2026-11", 7), cost=0.2)])
    live = read(ledger, "2026-11")
    assert live["closed"] is False and live["total"]["requests"] == november.snapshot["total"]["requests"] + 1
    again = close(ledger, "2026-11")
    assert again.previous == "2026-10" and again.snapshot["total"] == live["total"]
    assert closes.reopen(ledger, "2026-11") is not None and closes.reopen(ledger, "2026-10") is not None
    assert closes.chain(ledger) == [] and read(ledger, "2026-10")["closed"] is False
    assert close(ledger, "2026-10").previous == "", "a first close again"


def test_a_close_racing_a_reopen_of_the_month_before_is_withdrawn(ledger: LedgerStore) -> None:
    october(ledger)
    close(ledger, "2026-10")
    chain = closes.chain(ledger)
    figures = read(ledger, "2026-11")  # November's close has read the chain with October closed ...
    assert closes.reopen(ledger, "2026-10") is not None  # ... October is reopened meanwhile ...
    assert closes.close(ledger, "2026-11", "admin", NOW, figures, chain) is None  # ... and November withdrawn
    assert closes.chain(ledger) == [], "no close names a previous month that is open"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.sampled_from(["close", "reopen"]), st.integers(-2, 4)), max_size=14))
def test_any_run_of_closes_and_reopens_leaves_one_chain_in_order(tmp_path: Path,
                                                                   steps: list[tuple[str, int]]) -> None:
    """Against a model (the closed months, in order), each close or reopen stands exactly when the rules allow it
    (the first on or after the ledger's first month, then the next month; a reopen of the latest alone), and the
    stored chain is always the model: each close names the one before it."""
    months = ["2026-08", "2026-09", "2026-10", "2026-11", "2026-12", "2027-01", "2027-02"]  # October is first
    store = SqliteLedger(tmp_path / f"ledger-{next(_ids)}.sqlite3")
    try:
        october(store)
        model: list[str] = []
        for action, offset in steps:
            month = months[offset + 2]
            chain = closes.chain(store)
            try:
                if action == "close":
                    closes.check(chain, month)
                    closes.check_first(chain, month, closes.holds(store, month), closes.first_month(store))
                    allowed = closes.close(store, month, "admin", NOW, read(store, month), chain) is not None
                else:
                    closes.check_reopen(chain, month)
                    allowed = closes.reopen(store, month) is not None
            except Conflict:
                allowed = False
            if action == "close":
                expected = month not in model and (month == next_of(model[-1]) if model else month >= "2026-10")
                model += [month] if expected else []
            else:
                expected = bool(model) and model[-1] == month
                model = model[:-1] if expected else model
            assert allowed == expected, (action, month, model)
            stored = closes.chain(store)
            assert [c.month for c in stored] == model
            assert [c.previous for c in stored] == ["", *model][:len(model)]
    finally:
        store.close()


def next_of(month: str) -> str:
    return closes.next_month(month)
