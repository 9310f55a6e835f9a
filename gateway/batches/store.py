"""Durable state of the Batch API: files on disk, batch and line state in SQLite, in a data directory.

Every method is blocking and runs on one thread of its own (``BatchStore.do``), so the event loop never
waits on disk and the SQLite connection is used from the thread that made it. SQLite runs in WAL mode with
synchronous=NORMAL: a commit survives the process being killed (the crash the issue asks about), not a
power cut. A line's result is committed the moment it finishes, so after a restart only the lines that were
in flight run again and every ``custom_id`` ends in the output or error file exactly once.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson

from gateway.batches.lines import Line, unanswered

T = TypeVar("T")

# Statuses, as the OpenAI batch object names them. ACTIVE ones are driven by the runner (and resumed after a
# restart); the rest are final.
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
FINAL = ("failed", "completed", "expired", "cancelled")
STAMPS = {"in_progress": "in_progress_at", "finalizing": "finalizing_at", "completed": "completed_at",
          "failed": "failed_at", "expired": "expired_at", "cancelling": "cancelling_at",
          "cancelled": "cancelled_at"}
WINDOW_S = 24 * 3600

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,
    bytes INTEGER NOT NULL, created_at INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS files_by_tenant ON files (tenant, created_at);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, endpoint TEXT NOT NULL, input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL, status TEXT NOT NULL, created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL, in_progress_at INTEGER, finalizing_at INTEGER, completed_at INTEGER,
    failed_at INTEGER, expired_at INTEGER, cancelling_at INTEGER, cancelled_at INTEGER,
    output_file_id TEXT, error_file_id TEXT, errors TEXT, metadata TEXT, total INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS batches_by_tenant ON batches (tenant, created_at);
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL, line_no INTEGER NOT NULL, custom_id TEXT NOT NULL, body BLOB NOT NULL,
    done INTEGER NOT NULL DEFAULT 0, ok INTEGER NOT NULL DEFAULT 0, result BLOB,
    PRIMARY KEY (batch_id, line_no));
"""


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


@dataclass(frozen=True, slots=True)
class FileRecord:
    id: str
    tenant: str
    purpose: str
    filename: str
    bytes: int
    created_at: int

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed",
                "status_details": None, "expires_at": None}


@dataclass(frozen=True, slots=True)
class BatchRecord:
    row: dict[str, Any]  # the batches row
    completed: int  # lines answered 2xx
    failed: int  # lines finished otherwise

    @property
    def id(self) -> str:
        return str(self.row["id"])

    @property
    def status(self) -> str:
        return str(self.row["status"])

    @property
    def tenant(self) -> str:
        return str(self.row["tenant"])

    def to_openai(self) -> dict[str, Any]:
        r = self.row
        errors = orjson.loads(r["errors"]) if r["errors"] else None
        return {
            "id": r["id"], "object": "batch", "endpoint": r["endpoint"],
            "errors": {"object": "list", "data": errors} if errors else None,
            "input_file_id": r["input_file_id"], "completion_window": r["completion_window"],
            "status": r["status"], "output_file_id": r["output_file_id"], "error_file_id": r["error_file_id"],
            "created_at": r["created_at"], "expires_at": r["expires_at"],
            **{stamp: r[stamp] for stamp in STAMPS.values()},
            "request_counts": {"total": r["total"], "completed": self.completed, "failed": self.failed},
            "metadata": orjson.loads(r["metadata"]) if r["metadata"] else None,
        }


class BatchStore:
    """Files under ``<data_dir>/files``, state in ``<data_dir>/batches.sqlite3``."""

    def __init__(self, data_dir: Path) -> None:
        self.files_dir = data_dir / "files"
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self._path = data_dir / "batches.sqlite3"
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="tollgate-batches")
        self._db: sqlite3.Connection | None = None

    async def do(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking method of this store on its thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def close(self) -> None:
        def shut() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None
        self._executor.submit(shut).result()
        self._executor.shutdown()

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            db = sqlite3.connect(self._path, isolation_level=None)  # autocommit; transactions are explicit
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
            self._db = db
        return self._db

    # -- files ---------------------------------------------------------------------------------------------

    def file_path(self, file_id: str) -> Path:
        return self.files_dir / file_id

    def add_file(self, tenant: str, purpose: str, filename: str, source: Path | None = None,
                 lines: Iterable[bytes] = (), file_id: str | None = None) -> FileRecord:
        """Store a file (moved from ``source``, or written from ``lines``) and record it; fsync before the row."""
        file_id = file_id or new_id("file-")
        path = self.file_path(file_id)
        tmp = path.with_suffix(".part")
        if source is not None:
            os.replace(source, tmp)
        else:
            with tmp.open("wb") as out:
                for line in lines:
                    out.write(line)
                    out.write(b"\n")
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        record = FileRecord(file_id, tenant, purpose, filename, path.stat().st_size, int(time.time()))
        self.db.execute("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?)",
                        (record.id, record.tenant, record.purpose, record.filename, record.bytes,
                         record.created_at))
        return record

    def get_file(self, tenant: str, file_id: str) -> FileRecord | None:
        row = self.db.execute("SELECT * FROM files WHERE id = ? AND tenant = ?", (file_id, tenant)).fetchone()
        return FileRecord(**dict(row)) if row else None

    def list_files(self, tenant: str, purpose: str | None, limit: int, after: str | None,
                   newest_first: bool) -> list[FileRecord]:
        order = "DESC" if newest_first else "ASC"
        sql, args = "SELECT * FROM files WHERE tenant = ?", [tenant]
        if purpose:
            sql += " AND purpose = ?"
            args.append(purpose)
        if after and (anchor := self.get_file(tenant, after)) is not None:
            sql += f" AND (created_at, id) {'<' if newest_first else '>'} (?, ?)"
            args += [anchor.created_at, anchor.id]
        sql += f" ORDER BY created_at {order}, id {order} LIMIT ?"
        return [FileRecord(**dict(row)) for row in self.db.execute(sql, (*args, limit))]

    def delete_file(self, tenant: str, file_id: str) -> bool:
        if self.db.execute("DELETE FROM files WHERE id = ? AND tenant = ?", (file_id, tenant)).rowcount == 0:
            return False
        self.file_path(file_id).unlink(missing_ok=True)
        return True

    # -- batches -------------------------------------------------------------------------------------------

    def create_batch(self, tenant: str, endpoint: str, input_file_id: str, window: str,
                     metadata: dict[str, str] | None) -> BatchRecord:
        now = int(time.time())
        batch_id = new_id("batch_")
        self.db.execute(
            "INSERT INTO batches (id, tenant, endpoint, input_file_id, completion_window, status, created_at, "
            "expires_at, metadata) VALUES (?, ?, ?, ?, ?, 'validating', ?, ?, ?)",
            (batch_id, tenant, endpoint, input_file_id, window, now, now + WINDOW_S,
             orjson.dumps(metadata).decode() if metadata is not None else None))
        record = self.get_batch(batch_id)
        assert record is not None
        return record

    def get_batch(self, batch_id: str, tenant: str | None = None) -> BatchRecord | None:
        row = self.db.execute("SELECT * FROM batches WHERE id = ?", (batch_id,)).fetchone()
        if row is None or (tenant is not None and row["tenant"] != tenant):
            return None
        completed, failed = self.db.execute(
            "SELECT coalesce(sum(ok), 0), coalesce(sum(done) - sum(ok), 0) FROM lines WHERE batch_id = ?",
            (batch_id,)).fetchone()
        return BatchRecord(dict(row), completed, failed)

    def list_batches(self, tenant: str, limit: int, after: str | None) -> list[BatchRecord]:
        sql, args = "SELECT id FROM batches WHERE tenant = ?", [tenant]
        if after and (anchor := self.get_batch(after, tenant)) is not None:
            sql += " AND (created_at, id) < (?, ?)"
            args += [anchor.row["created_at"], anchor.id]
        sql += " ORDER BY created_at DESC, id DESC LIMIT ?"
        ids = [row[0] for row in self.db.execute(sql, (*args, limit))]
        return [b for i in ids if (b := self.get_batch(i)) is not None]

    def active_batches(self) -> list[str]:
        marks = ",".join("?" * len(ACTIVE))
        return [row[0] for row in self.db.execute(
            f"SELECT id FROM batches WHERE status IN ({marks}) ORDER BY created_at", ACTIVE)]

    def set_status(self, batch_id: str, status: str, only_from: tuple[str, ...] = ACTIVE, **fields: Any) -> bool:
        """Move a batch to ``status`` (stamping its time) if it is in one of ``only_from``; False if not."""
        values = {STAMPS[status]: int(time.time())} if status in STAMPS else {}
        values |= fields
        sets = ", ".join(["status = ?", *(f"{k} = ?" for k in values)])
        marks = ",".join("?" * len(only_from))
        cursor = self.db.execute(f"UPDATE batches SET {sets} WHERE id = ? AND status IN ({marks})",
                                 (status, *values.values(), batch_id, *only_from))
        return cursor.rowcount == 1

    def fail_validation(self, batch_id: str, errors: list[dict[str, Any]]) -> None:
        self.set_status(batch_id, "failed", ("validating",), errors=orjson.dumps(errors).decode())

    def start_lines(self, batch_id: str, lines: list[Line]) -> bool:
        """Record the validated lines and move to in_progress, in one transaction (a crash redoes both)."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("DELETE FROM lines WHERE batch_id = ?", (batch_id,))
            db.executemany("INSERT INTO lines (batch_id, line_no, custom_id, body) VALUES (?, ?, ?, ?)",
                           ((batch_id, line.line_no, line.custom_id, line.body) for line in lines))
            moved = self.set_status(batch_id, "in_progress", ("validating",), total=len(lines))
            db.execute("COMMIT" if moved else "ROLLBACK")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return moved

    def pending(self, batch_id: str) -> list[tuple[int, str]]:
        """(line number, custom_id) of each line not finished yet, in file order; bodies stay on disk."""
        return [(row[0], row[1]) for row in self.db.execute(
            "SELECT line_no, custom_id FROM lines WHERE batch_id = ? AND done = 0 ORDER BY line_no", (batch_id,))]

    def body(self, batch_id: str, line_no: int) -> bytes:
        row = self.db.execute("SELECT body FROM lines WHERE batch_id = ? AND line_no = ?",
                              (batch_id, line_no)).fetchone()
        return bytes(row[0])

    def finish_line(self, batch_id: str, line_no: int, ok: bool, result: bytes) -> None:
        """Checkpoint one line's output line; a line already finished keeps its first result."""
        self.db.execute("UPDATE lines SET done = 1, ok = ?, result = ? WHERE batch_id = ? AND line_no = ? "
                        "AND done = 0", (int(ok), result, batch_id, line_no))

    def close_pending(self, batch_id: str, code: str, message: str) -> None:
        """Finish every line that has not run with an error line (the batch expired or was cancelled)."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            for line_no, custom_id in self.pending(batch_id):
                self.finish_line(batch_id, line_no, False, unanswered(custom_id, code, message))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def results(self, batch_id: str, ok: bool) -> Iterator[bytes]:
        for (result,) in self.db.execute("SELECT result FROM lines WHERE batch_id = ? AND done = 1 AND ok = ? "
                                         "ORDER BY line_no", (batch_id, int(ok))):
            yield result

    def finalize(self, batch_id: str, final: str) -> None:
        """Write the output and error files from the checkpointed lines, then end the batch in ``final``.

        The file ids derive from the batch id, so a crash half-way through is redone over the same names."""
        record = self.get_batch(batch_id)
        assert record is not None
        ids: dict[str, str | None] = {"output_file_id": None, "error_file_id": None}
        suffix = batch_id.removeprefix("batch_")
        for field, ok, prefix, name in (("output_file_id", True, "file-out-", "output"),
                                        ("error_file_id", False, "file-err-", "errors")):
            if record.completed if ok else record.failed:
                ids[field] = self.add_file(record.tenant, "batch_output", f"{batch_id}_{name}.jsonl",
                                           lines=self.results(batch_id, ok), file_id=prefix + suffix).id
        self.set_status(batch_id, final, ACTIVE, **ids)
