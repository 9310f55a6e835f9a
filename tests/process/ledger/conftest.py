"""The ledger replicas share, for the in-process ledger tests collected again in this folder: PostgreSQL, this
machine's, fresh from pg_dsn (the in-process files give the same tests a SQLite ledger)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.ledger.stores import LedgerStore, PostgresLedger


@pytest.fixture(params=["postgres"])
def ledger(request: pytest.FixtureRequest, pg_dsn: str) -> Iterator[LedgerStore]:
    made = PostgresLedger(pg_dsn)
    yield made
    made.close()
