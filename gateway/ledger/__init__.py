"""The cost ledger: one record per request, priced, written off the event loop to SQLite or PostgreSQL; the
workers' presence spans, the closed months' table and the statement's arithmetic over it (closes, centres). What
finance reads built from it (reports, statements, the GPU cost and sizing) is gateway.finance, which imports the
ledger; the ledger imports nothing of it.

Why: docs/decisions/006-ledger-writer-and-spool.md (the writer, stores, spool and closes),
005-gpu-cost-attribution.md (the GPU report), 009-finance-reads-off-the-loop.md (statements and reports)."""

from __future__ import annotations

from pathlib import Path

from gateway.ledger.stores import LedgerStore, PostgresLedger, SqliteLedger
from gateway.ledger.writer import LedgerWriter
from gateway.policy.schema import LedgerPolicy, StatePolicy


def open_store(state: StatePolicy, data_dir: Path) -> LedgerStore:
    """PostgreSQL when replicas share the ledger (``state.postgres_dsn``), else the data directory's SQLite."""
    if state.postgres_dsn:
        return PostgresLedger(state.postgres_dsn)
    return SqliteLedger(data_dir / "ledger.sqlite3")


def open_ledger(spec: LedgerPolicy, state: StatePolicy, data_dir: Path) -> LedgerWriter:
    return LedgerWriter(open_store(state, data_dir), data_dir / "ledger-spool.jsonl", spec.flush_interval_ms / 1000)
