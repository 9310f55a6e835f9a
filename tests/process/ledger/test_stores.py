"""Writing the ledger replicas share (tests/inprocess/ledger/test_stores.py's test of each store): PostgreSQL, this
machine's, fresh from pg_dsn."""

from __future__ import annotations

from tests.inprocess.ledger.test_stores import test_every_batch_is_stored_once_per_id_with_every_value_as_given

__all__ = ["test_every_batch_is_stored_once_per_id_with_every_value_as_given"]  # on this folder's ledger
