"""The reports' store queries (tests/inprocess/http/test_reports.py) on the ledger replicas share: PostgreSQL, this
machine's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.ledger.stores import PostgresLedger
from tests.inprocess.http.test_reports import test_the_tag_filter_and_a_tenants_own_percentile_in_the_database

__all__ = ["test_the_tag_filter_and_a_tenants_own_percentile_in_the_database"]  # collected here, on the store below


@pytest.fixture(params=["postgres"])
def store(request: pytest.FixtureRequest, pg_dsn: str) -> Iterator[PostgresLedger]:
    made = PostgresLedger(pg_dsn)
    yield made
    made.close()
