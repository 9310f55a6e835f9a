"""The batch store (SQLite) keeps the key that created a batch, also in a data directory made before it did."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gateway.batches.store import SqliteBatchStore

# the batches table as a data directory made before batches kept their key holds it
_BEFORE_KEYS = """
CREATE TABLE batches (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, endpoint TEXT NOT NULL, input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL, status TEXT NOT NULL, created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL, in_progress_at BIGINT, finalizing_at BIGINT, completed_at BIGINT,
    failed_at BIGINT, expired_at BIGINT, cancelling_at BIGINT, cancelled_at BIGINT,
    output_file_id TEXT, error_file_id TEXT, errors TEXT, metadata TEXT, total INTEGER NOT NULL DEFAULT 0,
    validation_tries INTEGER NOT NULL DEFAULT 0, validated_by TEXT, validated_until REAL);
INSERT INTO batches (id, tenant, endpoint, input_file_id, completion_window, status, created_at, expires_at)
    VALUES ('batch_old', 'demo', '/v1/chat/completions', 'file-x', '24h', 'completed', 1, 2);
"""


def key_of(store: SqliteBatchStore, batch_id: str) -> str | None:
    record = store.get_batch(batch_id)
    assert record is not None
    return record.key_id


def test_a_batch_keeps_the_key_that_created_it(tmp_path: Path) -> None:
    store = SqliteBatchStore(tmp_path)
    try:
        made = store.create_batch("demo", "/v1/chat/completions", "file-x", "24h", {"job": "j"}, "key-0123456789ab")
        assert made.key_id == "key-0123456789ab"
        again = store.get_batch(made.id, "demo")
        assert again is not None and again.key_id == "key-0123456789ab"
        assert "key-0123456789ab" not in str(again.to_openai()), "the batch object shows no key"
        assert store.create_batch("demo", "/v1/chat/completions", "file-x", "24h", None).key_id is None
    finally:
        store.close()


def test_a_table_made_before_keys_were_kept_gets_the_column_at_open(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "batches.sqlite3") as db:
        db.executescript(_BEFORE_KEYS)
    store = SqliteBatchStore(tmp_path)
    try:
        old = store.get_batch("batch_old")
        assert old is not None and old.key_id is None and old.status == "completed", "the old row reads on"
        made = store.create_batch("demo", "/v1/chat/completions", "file-x", "24h", None, "key-new")
        assert key_of(store, made.id) == "key-new"
    finally:
        store.close()
    reopened = SqliteBatchStore(tmp_path)  # a second open finds the column there and adds nothing
    try:
        assert key_of(reopened, made.id) == "key-new" and key_of(reopened, "batch_old") is None
    finally:
        reopened.close()
