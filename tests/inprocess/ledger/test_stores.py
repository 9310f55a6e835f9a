"""Writing the ledger (SQLite in tmp_path here; PostgreSQL in tests/process/ledger/test_stores.py): a batch of any
size is stored whole, once per record id, every value as it was given; and a batch costs the writer a handful of
statements, not one a record (each statement hands the interpreter lock back and forth with the event loop)."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.ledger import stores
from gateway.ledger.stores import COLUMNS, OPEN_END, OPEN_START, LedgerStore, SqliteLedger, iter_all


@pytest.fixture(params=["sqlite"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LedgerStore]:
    made = SqliteLedger(tmp_path / "ledger.sqlite3")
    yield made
    made.close()


def record(rng: random.Random, ident: int) -> dict[str, Any]:
    """A record with every column set to a value drawn from ``rng`` (floats with all their bits)."""
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    return row | {"id": f"rec-{ident:x}", "request_id": f"req-{rng.getrandbits(32):x}",
                  "time": f"2026-12-07T{rng.randrange(24):02d}:{rng.randrange(60):02d}:00.{ident:06d}Z",
                  "tenant": rng.choice(["demo", "prem", "bulk"]), "key_id": rng.choice([None, "k1"]),
                  "tier": "standard", "service_class": "standard", "model": "m", "endpoint": "chat",
                  "stream": rng.random() < 0.5, "status": rng.choice([200, 429, 502]), "error": None,
                  "prompt_tokens": rng.randrange(10**6), "completion_tokens": rng.randrange(10**6),
                  "cached_tokens": rng.randrange(100), "cache": rng.choice([None, "miss", "hit-exact"]),
                  "estimated": rng.random() < 0.1, "cost_usd": rng.random() / 7, "price_version": "v1",
                  "queue_wait_ms": rng.random() * 100, "ttft_ms": rng.random(), "total_ms": rng.random() * 1e4,
                  "worker": "http://w:8000", "worker_ms": rng.random() * 1e4, "tags": rng.choice([None, "a=b"])}


def stored(ledger: LedgerStore) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for page in iter_all(ledger, OPEN_START, OPEN_END, None) for r in page}


def comparable(row: dict[str, Any]) -> dict[str, Any]:
    return {c: (int(row[c]) if c in stores.BOOLEAN else row[c]) for c in COLUMNS}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 2_600), min_size=1, max_size=3), seed=st.integers(0, 2**32),
       repeats=st.integers(1, 40))
def test_every_batch_is_stored_once_per_id_with_every_value_as_given(ledger: LedgerStore, sizes: list[int],
                                                                      seed: int, repeats: int) -> None:
    """Batches of any size, an id repeated within a batch and across batches (a replayed spool): each id is stored
    once, as its first record, every column exactly as given."""
    rng = random.Random(seed)
    before = stored(ledger)
    first: dict[str, dict[str, Any]] = {}
    for size in sizes:
        batch = [record(rng, rng.randrange(size // repeats + 1) + seed) for _ in range(size)]
        ledger.insert(batch)
        for r in batch:
            if r["id"] not in before:
                first.setdefault(r["id"], r)
    after = stored(ledger)
    assert set(after) == set(before) | set(first)
    assert all(comparable(after[i]) == comparable(r) for i, r in first.items())


@given(seed=st.integers(0, 2**32), lacking=st.lists(st.sets(st.sampled_from(list(COLUMNS))), max_size=6))
def test_a_record_lacking_columns_gives_nulls_in_their_places(seed: int, lacking: list[set[str]]) -> None:
    """``row_values``: each record's values in column order, a column it lacks as None (a record spooled before
    the column was added), whichever records of a batch lack which columns."""
    rng = random.Random(seed)
    batch = [record(rng, i) for i in range(3)] + \
        [{c: v for c, v in record(rng, 9 + i).items() if c not in gone} for i, gone in enumerate(lacking)]
    assert stores.row_values(batch) == [r.get(c) for r in batch for c in COLUMNS]


def test_a_record_spooled_before_the_added_columns_is_stored_with_nulls(ledger: LedgerStore) -> None:
    old = {c: v for c, v in record(random.Random(7), 1).items() if c not in stores.ADDED}
    ledger.insert([record(random.Random(8), 2), old])
    row = stored(ledger)[old["id"]]
    assert [row[c] for c in stores.ADDED] == [None] * len(stores.ADDED)
    assert comparable(row) == comparable(dict.fromkeys(stores.ADDED) | old)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 20_000), most=st.sampled_from([1, 2, 32, 1024]))
def test_a_batch_is_split_into_few_statements_of_few_shapes(n: int, most: int) -> None:
    """``_chunks``: sizes that add up to the batch, each a power of two no larger than ``most``, largest first, so
    a store prepares at most log2(most) + 1 statement texts and a batch takes at most that many statements beyond
    its whole ``most``-row ones."""
    sizes = list(stores._chunks(n, most))
    assert sum(sizes) == n
    assert all(size <= most and size & (size - 1) == 0 for size in sizes)
    assert sizes == sorted(sizes, reverse=True)
    assert len(sizes) <= n // most + most.bit_length()


def test_a_statement_binds_as_many_rows_as_the_database_allows() -> None:
    """``rows_per_insert``: the largest power of two whose rows' values fit the database's limit."""
    for parameters in (999, 32_766, stores.POSTGRES_PARAMETERS, len(COLUMNS), 2 * len(COLUMNS) - 1):
        rows = stores.rows_per_insert(parameters)
        assert rows * len(COLUMNS) <= parameters < 2 * rows * len(COLUMNS)


def test_a_batch_of_hundreds_is_a_few_statements_on_sqlite(tmp_path: Path) -> None:
    """What the writer's thread hands over: a 300-record batch is at most 4 insert statements (300 = 256 + 32 +
    8 + 4), where ``executemany`` would run 300 (the positive control, on the same connection)."""
    ledger = SqliteLedger(tmp_path / "ledger.sqlite3")
    rng = random.Random(7)
    statements: list[str] = []
    db = ledger._db()
    db.set_trace_callback(statements.append)
    ledger.insert([record(rng, i) for i in range(300)])
    assert sum(s.startswith("INSERT") for s in statements) == 4
    statements.clear()
    marks = ", ".join("?" * len(COLUMNS))
    with db:
        db.executemany(f"INSERT OR IGNORE INTO ledger ({', '.join(COLUMNS)}) VALUES ({marks})",
                       [tuple(r[c] for c in COLUMNS) for r in (record(rng, 1000 + i) for i in range(300))])
    assert sum(s.startswith("INSERT") for s in statements) == 300, "the control: one statement a record"
    ledger.close()


def test_a_sqlite_that_allows_fewer_variables_gets_smaller_statements(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A SQLite built with the old limit of 999 variables a statement: batches still go in whole, in statements
    that fit it."""
    real_connect = stores.connect

    def limited(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        db = real_connect(*args, **kwargs)
        db.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
        return db

    monkeypatch.setattr(stores, "connect", limited)
    ledger = SqliteLedger(tmp_path / "ledger.sqlite3")
    rng = random.Random(11)
    ledger.insert([record(rng, i) for i in range(1_500)])
    assert len(stored(ledger)) == 1_500
    ledger.close()


def test_a_page_costs_its_own_rows_however_deep_the_cursor(tmp_path: Path) -> None:
    """Reading a month page by page is linear: SQLite's work for the last of 80 pages (counted in its virtual
    machine's steps, not timed) is about the first's. The control is the predicate the pages once had, whose
    index range began at the period's start for every page: its last page steps through every row before it."""
    ledger = SqliteLedger(tmp_path / "ledger.sqlite3")
    rng = random.Random(5)
    ledger.insert([record(rng, i) | {"time": f"2026-12-07T10:{i // 800:02d}:00.{i:06d}Z"} for i in range(40_000)])
    db = ledger._db()
    steps = [0]

    def tick() -> int:
        steps[0] += 1
        return 0

    db.set_progress_handler(tick, 100)
    work = []
    pages = iter_all(ledger, OPEN_START, OPEN_END, None, page=500)
    while True:
        steps[0] = 0
        if next(pages, None) is None:
            break
        work.append(steps[0])
    assert len(work) == 80 and max(work) <= 2 * work[0], work
    last = ("2026-12-07T10:49:00.039499Z", f"rec-{39_499:x}")
    old = (f"SELECT {', '.join(COLUMNS)} FROM ledger WHERE time >= ? AND time < ? "
           "AND (time > ? OR (time = ? AND id > ?)) ORDER BY time, id LIMIT 500")
    steps[0] = 0
    assert len(db.execute(old, [OPEN_START, OPEN_END, last[0], last[0], last[1]]).fetchall()) == 500
    assert steps[0] > 10 * work[0], f"the control ({steps[0]} against {work[0]}) steps through every earlier row"
    ledger.close()
