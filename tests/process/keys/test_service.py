"""Runtime keys through the service (tests/inprocess/keys/test_service.py) on PostgreSQL, this machine's: a key
made by one process honoured by another, and a rotation, with the table the replicas share."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from gateway.keys.store import KeyStore, PostgresKeyStore
from tests.inprocess.keys.test_service import (
    test_a_key_made_in_one_process_works_in_another_once_it_polls_and_a_revocation_likewise,
    test_a_rotated_key_works_until_its_grace_ends_and_its_successor_keeps_its_limits,
)
from tests.process.keys.test_store import drop_tables

__all__ = [  # collected here, on the stores below
    "test_a_key_made_in_one_process_works_in_another_once_it_polls_and_a_revocation_likewise",
    "test_a_rotated_key_works_until_its_grace_ends_and_its_successor_keeps_its_limits",
]


@pytest.fixture(params=["postgres"])
def make_store(request: pytest.FixtureRequest, pg_dsn: str) -> Iterator[Callable[[], KeyStore]]:
    drop_tables(pg_dsn)
    yield lambda: PostgresKeyStore(pg_dsn)
