"""The key and audit tables' tests (tests/inprocess/keys/test_store.py) on PostgreSQL, this machine's: the
in-process layer runs them on SQLite."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest

from gateway.keys.store import KeyStore, PostgresKeyStore
from tests.inprocess.keys.test_store import (
    test_a_key_id_or_hash_given_twice_is_refused,
    test_a_reader_takes_only_what_changed_after_the_last_change_it_holds,
    test_a_refused_change_writes_nothing_not_even_its_number,
    test_racing_writers_never_hide_a_row_from_a_poller,
    test_the_audit_log_reads_newest_first_within_its_range,
)

__all__ = [  # collected here, on the stores below
    "test_a_key_id_or_hash_given_twice_is_refused",
    "test_a_reader_takes_only_what_changed_after_the_last_change_it_holds",
    "test_a_refused_change_writes_nothing_not_even_its_number",
    "test_racing_writers_never_hide_a_row_from_a_poller",
    "test_the_audit_log_reads_newest_first_within_its_range",
]
TABLES = ("api_keys", "api_key_version", "admin_audit")


def drop_tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as db:
        for table in TABLES:
            db.execute(f"DROP TABLE IF EXISTS {table}")


@pytest.fixture(params=["postgres"])
def make_store(request: pytest.FixtureRequest, pg_dsn: str) -> Iterator[Callable[[], KeyStore]]:
    """A factory of stores on one database (each a process's own connection)."""
    made: list[KeyStore] = []
    drop_tables(pg_dsn)

    def make() -> KeyStore:
        made.append(PostgresKeyStore(pg_dsn))
        return made[-1]
    yield make
    for store in made:
        store._disconnect()
