"""gateway.state.sqlite: a shared SQLite file opens in WAL mode however many connections open it at once, and a
lock held past the timeout is an error after the timeout, not before."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from gateway.state.sqlite import connect


def test_connections_opened_together_on_a_new_file_all_open_in_wal(tmp_path: Path) -> None:
    """Two connections switching a new file to WAL together: SQLite answers one "locked" without waiting (the
    racing key-store writers died of it); each of eight here opens, on each of 30 new files."""
    for round_ in range(30):
        modes, failures = _open_together(tmp_path / f"{round_}.sqlite3", 8)
        assert not failures and modes == ["wal"] * 8, (failures, modes)


def _open_together(path: Path, count: int) -> tuple[list[str], list[BaseException]]:
    """``count`` threads released at one moment, each opening ``path``: the modes they read, the errors raised."""
    start = threading.Barrier(count)
    modes: list[str] = []
    failures: list[BaseException] = []

    def open_one() -> None:
        start.wait()
        try:
            db = connect(path, timeout=5.0, check_same_thread=False)
            modes.append(db.execute("PRAGMA journal_mode").fetchone()[0])
            db.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
            db.close()
        except BaseException as e:  # reported by the caller
            failures.append(e)
    threads = [threading.Thread(target=open_one) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return modes, failures


def test_a_lock_held_past_the_timeout_is_an_error_after_the_timeout(tmp_path: Path) -> None:
    path = tmp_path / "held.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    started = time.monotonic()
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        connect(path, timeout=0.2)
    assert time.monotonic() - started >= 0.2, "gave up before its timeout"
    holder.execute("COMMIT")
    db = connect(path, timeout=0.2)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
    holder.close()
