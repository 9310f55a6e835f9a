"""The audit log bounded in bytes (tests/inprocess/keys/test_audit_bounds.py) on PostgreSQL, this machine's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.keys.store import KeyStore, PostgresKeyStore
from tests.inprocess.keys.test_audit_bounds import (
    test_every_write_is_bounded_a_keys_too_and_an_old_entry_reads_bounded,
    test_pages_on_each_store,
)
from tests.process.keys.test_store import drop_tables

__all__ = [  # collected here, on the store below
    "test_every_write_is_bounded_a_keys_too_and_an_old_entry_reads_bounded",
    "test_pages_on_each_store",
]


@pytest.fixture(params=["postgres"])
def store(request: pytest.FixtureRequest, pg_dsn: str) -> Iterator[KeyStore]:
    drop_tables(pg_dsn)
    made = PostgresKeyStore(pg_dsn)
    yield made
    made._disconnect()
