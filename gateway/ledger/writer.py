"""The ledger writer: the request path only appends a record to a deque; one thread writes them in batches.

Every ``flush_interval`` the thread moves what has accumulated into the store in one transaction, so a record
is durable within about 100 ms of its request finishing. When the store fails (PostgreSQL down, disk full),
the batch is appended to a local spool file (fsync'd) instead, and the spool is replayed into the store as
soon as it answers again, before anything newer; inserts are idempotent on the record id, so a replay that
is cut short and redone never doubles a record. On stop, what is pending is flushed.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from gateway.ledger.records import Draft, complete
from gateway.ledger.stores import LedgerStore

log = logging.getLogger("tollgate.ledger")
RETRY_STORE_S = 2.0
IDLE_WAIT_S = 1.0  # the longest a record can wait when its wake-up was missed (appended as a flush ended)


class LedgerWriter:
    def __init__(self, store: LedgerStore, spool: Path, flush_interval_s: float = 0.1) -> None:
        self.store = store
        self.spool = spool
        self.flush_interval_s = flush_interval_s
        self.store_ok = True
        self._pending: collections.deque[Draft] = collections.deque()
        self._stop = threading.Event()
        self._wake = threading.Event()  # the first record after a flush sets it; idle, the thread sleeps
        self._thread: threading.Thread | None = None
        self._retry_at = 0.0

    def append(self, draft: Draft) -> None:
        """From the event loop: no I/O, no lock (deque appends are atomic). The record comes priced (by
        accounting.Finish, on the loop); only its time is formatted on the writer's thread. Only the first record
        after a flush wakes the thread, so an idle gateway's writer sleeps.
        Why: docs/decisions/006-ledger-writer-and-spool.md."""
        if not self._pending:
            self._wake.set()
        self._pending.append(draft)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tollgate-ledger", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(30)
        self.store.close()

    def flush(self) -> None:
        """Write what is pending now (the thread's step; also callable from a thread in tests)."""
        if self.spool.exists() and time.monotonic() >= self._retry_at:
            self._replay()
        batch = []
        while self._pending:
            batch.append(complete(self._pending.popleft()))
        if not batch:
            return
        if self.store_ok or (time.monotonic() >= self._retry_at and not self.spool.exists()):
            try:
                self.store.insert(batch)
                self.store_ok = True
                return
            except Exception as exc:
                log.error("ledger store failed (%s); spooling %d records to %s", exc, len(batch), self.spool)
                self.store_ok = False
                self._retry_at = time.monotonic() + RETRY_STORE_S
        self._to_spool(batch)

    def _run(self) -> None:
        while not self._stop.is_set():
            # a spooled batch is retried every RETRY_STORE_S even with nothing new; idle otherwise
            self._wake.wait(RETRY_STORE_S if self.spool.exists() else IDLE_WAIT_S)
            if self._stop.wait(self.flush_interval_s):  # let a batch gather
                break
            self._wake.clear()  # before the flush: a record that comes during it wakes the next round
            self._step()
        self._step()

    def _step(self) -> None:
        try:
            self.flush()
        except Exception:  # never let the thread die: the next step retries
            log.exception("ledger writer step failed")

    def _to_spool(self, batch: list[dict[str, Any]]) -> None:
        with self.spool.open("ab") as f:
            f.write(b"".join(orjson.dumps(record) + b"\n" for record in batch))
            f.flush()
            os.fsync(f.fileno())

    def _replay(self) -> None:
        records = []
        for line in self.spool.read_bytes().splitlines():
            try:
                records.append(orjson.loads(line))
            except orjson.JSONDecodeError:  # a line cut by a crash while it was written: it was never acknowledged
                log.warning("ledger spool: skipping a partial line")
        try:
            for i in range(0, len(records), 1000):
                self.store.insert(records[i:i + 1000])
        except Exception as exc:
            self.store_ok = False
            self._retry_at = time.monotonic() + RETRY_STORE_S
            log.warning("ledger store still failing (%s); %d records stay spooled", exc, len(records))
            return
        self.spool.unlink()
        self.store_ok = True
        log.info("ledger: replayed %d spooled records", len(records))
