"""The cost ledger: one record per request, priced, written off the event loop to SQLite or PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from gateway.ledger.stores import LedgerStore, PostgresLedger, SqliteLedger
from gateway.ledger.writer import LedgerWriter
from gateway.policy.schema import LedgerPolicy


def open_store(spec: LedgerPolicy, data_dir: Path) -> LedgerStore:
    if spec.store == "postgres":
        return PostgresLedger(spec.postgres_dsn)
    return SqliteLedger(data_dir / "ledger.sqlite3")


def open_ledger(spec: LedgerPolicy, data_dir: Path) -> LedgerWriter:
    return LedgerWriter(open_store(spec, data_dir), data_dir / "ledger-spool.jsonl", spec.flush_interval_ms / 1000)
