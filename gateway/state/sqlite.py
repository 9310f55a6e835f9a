"""Opening a SQLite file that several processes of one host (and several threads of one) share.

``connect`` guarantees a connection in WAL mode, or an ``sqlite3.OperationalError`` after ``timeout`` seconds,
never sooner: SQLite answers "database is locked" at once, without its busy handler, when two connections switch a
new file to WAL together, so the switch is retried here until the deadline. Imports only the standard library.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

_RETRY_S = 0.01  # between tries of the switch to WAL (a lock held for a schema's creation: milliseconds)


def connect(path: Path | str, *, timeout: float = 5.0, autocommit: bool = False,
            check_same_thread: bool = True) -> sqlite3.Connection:
    """A connection to ``path`` in WAL mode, synchronous=NORMAL, waiting up to ``timeout`` s for another's lock.
    ``autocommit``: no implicit transactions (the caller's BEGIN and COMMIT are the only ones)."""
    db = sqlite3.connect(path, timeout=timeout, check_same_thread=check_same_thread,
                         isolation_level=None if autocommit else "DEFERRED")  # sqlite3's default
    deadline = time.monotonic() + timeout
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() >= deadline:
                db.close()
                raise
            time.sleep(_RETRY_S)
    db.execute("PRAGMA synchronous=NORMAL")
    return db
