"""Worker presence: spans per state, moved on every beat, written to the ledger's store, kept when it fails."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.ledger.presence import Presence, Seen
from gateway.ledger.stores import PostgresLedger, SqliteLedger
from gateway.ledger.times import at

A, B = "http://a:8000", "http://b:8000"


def test_a_span_grows_until_its_worker_changes_state_or_leaves() -> None:
    p = Presence(SqliteLedger.__new__(SqliteLedger))  # observe() touches no store
    first = p.observe(100.0, [Seen(A, "gpu", True), Seen(B, "gpu", True)])
    assert [(s["worker"], s["since"], s["until"]) for s in first] == [(A, at(100), at(100)), (B, at(100), at(100))]
    grown = p.observe(110.0, [Seen(A, "gpu", True), Seen(B, "gpu", False)])
    spans = {(s["worker"], s["up"]): s for s in grown}
    assert spans[(A, True)]["id"] == first[0]["id"] and spans[(A, True)]["until"] == at(110)
    assert spans[(B, True)]["until"] == at(110)  # ended here
    assert spans[(B, False)]["since"] == at(110)
    left = p.observe(120.0, [Seen(A, "gpu", True)])
    assert {(s["worker"], s["up"], s["until"]) for s in left} >= {(B, False, at(110)), (A, True, at(120))}


def test_beats_reach_the_store_and_spans_wait_out_a_store_that_is_down(tmp_path: Path) -> None:
    store = SqliteLedger(tmp_path / "ledger.sqlite3")
    p = Presence(store)
    asyncio.run(p.beat([Seen(A, "gpu", True)]))
    asyncio.run(p.beat([Seen(A, "gpu", False)]))
    rows = store.presence("0000", "9999")
    assert [(r["worker"], bool(r["up"])) for r in rows] == [(A, True), (A, False)]

    down = Presence(PostgresLedger("postgresql://nobody@127.0.0.1:1/none"))
    asyncio.run(down.beat([Seen(A, "gpu", True)]))
    asyncio.run(down.beat([Seen(A, "gpu", False)]))  # the up span ended while the store was down: still held
    pending = down.observe(130.0, [Seen(A, "gpu", False)])
    assert sorted(s["up"] for s in pending) == [False, True]
