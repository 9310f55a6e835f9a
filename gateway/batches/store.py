"""Durable state of the Batch API: files, batches and lines, in the data directory or in PostgreSQL.

Two stores share the SQL below: ``SqliteBatchStore`` (the embedded default: SQLite and files in the data
directory, for the gateway processes of one host) and ``PostgresBatchStore`` (``state.postgres_dsn``: tables
and file chunks in PostgreSQL, so every replica serves every batch and runs its lines).

Every method is blocking and runs on one thread of its own (``BatchStore.do``), so the event loop never
waits on disk and the connection is used from the thread that made it. SQLite runs in WAL mode with
synchronous=NORMAL: a commit survives the process being killed, not a power cut. A line's result is
committed the moment it finishes, so after a crash only the lines that were in flight run again and every
``custom_id`` ends in the output or error file exactly once.

A finished line keeps its tokens (``lines.Usage``), and a batch object's ``usage`` is their sum, as OpenAI's
batch object has it; a batch with a line finished before lines kept them shows none rather than a short sum.

Lines are claimed before they run (``claim``): a claim names its process and lasts ``lease_s``, renewed while
the process is alive, so two processes never run the same line at once; a killed process's claims lapse and
another process takes its lines.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
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

from gateway.batches.lines import Line, Usage, unanswered
from gateway.errors import Unavailable
from gateway.state.sqlite import connect

log = logging.getLogger("tollgate.batches")

T = TypeVar("T")

# Statuses, as the OpenAI batch object names them. ACTIVE ones are driven by the runner (and resumed after a
# restart); the rest are final.
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
STAMPS = {"in_progress": "in_progress_at", "finalizing": "finalizing_at", "completed": "completed_at",
          "failed": "failed_at", "expired": "expired_at", "cancelling": "cancelling_at",
          "cancelled": "cancelled_at"}
WINDOW_S = 24 * 3600

CHUNK = 1 << 20  # file contents are read (and, in PostgreSQL, stored) a mebibyte at a time

# {blob}: BLOB or BYTEA; {real}: a float column. The same tables in both stores.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS batch_files (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,
    bytes BIGINT NOT NULL, created_at BIGINT NOT NULL);
CREATE INDEX IF NOT EXISTS batch_files_by_tenant ON batch_files (tenant, created_at);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, endpoint TEXT NOT NULL, input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL, status TEXT NOT NULL, created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL, in_progress_at BIGINT, finalizing_at BIGINT, completed_at BIGINT,
    failed_at BIGINT, expired_at BIGINT, cancelling_at BIGINT, cancelled_at BIGINT,
    output_file_id TEXT, error_file_id TEXT, errors TEXT, metadata TEXT, total INTEGER NOT NULL DEFAULT 0,
    validation_tries INTEGER NOT NULL DEFAULT 0, validated_by TEXT, validated_until {real}, key_id TEXT);
CREATE INDEX IF NOT EXISTS batches_by_tenant ON batches (tenant, created_at);
CREATE TABLE IF NOT EXISTS batch_lines (
    batch_id TEXT NOT NULL, line_no INTEGER NOT NULL, custom_id TEXT NOT NULL, body {blob} NOT NULL,
    done INTEGER NOT NULL DEFAULT 0, ok INTEGER NOT NULL DEFAULT 0, result {blob},
    claimed_by TEXT, claimed_until {real}, {usage},
    PRIMARY KEY (batch_id, line_no));
"""
# a finished line's tokens (lines.Usage); NULL until it finishes, and in a line finished before they were kept
USAGE_COLUMNS = ("input_tokens", "cached_tokens", "output_tokens", "reasoning_tokens")
_USAGE = ", ".join(f"{column} BIGINT" for column in USAGE_COLUMNS)
NO_TOKENS = Usage()  # a line that never ran (the batch expired or was cancelled first)


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
    usage: Usage | None = None  # the finished lines' tokens summed; None if one of them has none kept

    @property
    def id(self) -> str:
        return str(self.row["id"])

    @property
    def status(self) -> str:
        return str(self.row["status"])

    @property
    def tenant(self) -> str:
        return str(self.row["tenant"])

    @property
    def key_id(self) -> str | None:
        """The short id of the key that created the batch (gateway.auth.identify): its lines are that key's
        requests in the ledger. None for a batch made before it was kept."""
        return self.row.get("key_id")

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
            "usage": _usage_object(self.usage),
        }


class BatchStore(abc.ABC):
    """The Batch API's state; subclasses say where the rows and the file contents live."""

    mark = "?"  # the driver's parameter mark
    # the driver's errors that mean "unreachable or busy now", not a bug: the API answers them with a 503
    unavailable: tuple[type[Exception], ...] = (sqlite3.OperationalError,)

    def __init__(self, data_dir: Path, clock: Callable[[], float] = time.time) -> None:
        """``clock``: the wall clock every stamp and lease is read from (the wall clock, not a monotonic one:
        leases are compared across processes and replicas); a test moves it by hand to lapse a lease."""
        self.clock = clock
        self.files_dir = data_dir / "files"  # uploads are staged here (and, in SQLite's store, kept)
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="tollgate-batches")
        self._db: Any = None  # the backend's connection, made on first use (on the store's thread)

    async def do(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking method of this store on its thread; a store that cannot be reached is ``Unavailable``
        (the API answers 503 with Retry-After, the runner waits), never a 500."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        except self.unavailable as exc:
            log.warning("batch store unavailable: %s", exc)
            raise Unavailable("The batch store is unreachable; retry shortly.", "batch_store_unavailable",
                              retry_after_s=5) from None

    def close(self) -> None:
        self._executor.submit(self._disconnect).result()
        self._executor.shutdown()

    # -- what a backend provides --------------------------------------------------------------------------

    def _disconnect(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    @abc.abstractmethod
    def _run(self, sql: str, args: Iterable[Any] = ()) -> Any:
        """Execute one statement (``?`` marks) and return the cursor."""

    @abc.abstractmethod
    def _transaction(self) -> contextlib.AbstractContextManager[None]:
        """A transaction around the block: committed when it ends, rolled back if it raises."""

    @abc.abstractmethod
    def _run_many(self, sql: str, rows: Iterable[tuple[Any, ...]]) -> None:
        """Execute one statement for each of many rows, in as few round trips as the driver allows."""

    def _claimable(self) -> str:
        """The clause that locks the lines a claim selects (PostgreSQL skips those another claim holds)."""
        return ""

    @abc.abstractmethod
    def _put_content(self, file_id: str, chunks: Iterable[bytes]) -> int:
        """Store a file's content (replacing any under that id); return its size."""

    def _adopt(self, file_id: str, source: Path) -> int:
        """Store a staged file's content under ``file_id`` and remove the staged copy; its size."""
        size = self._put_content(file_id, _chunks_of(source))
        source.unlink(missing_ok=True)
        return size

    @abc.abstractmethod
    def read_chunk(self, file_id: str, index: int) -> bytes | None:
        """The ``index``-th CHUNK of a file's content; None past its end."""

    @abc.abstractmethod
    def _drop_content(self, file_id: str) -> None:
        """Delete a file's content (its row is already gone)."""

    # -- files ---------------------------------------------------------------------------------------------

    def add_file(self, tenant: str, purpose: str, filename: str, source: Path | None = None,
                 lines: Iterable[bytes] = (), file_id: str | None = None) -> FileRecord:
        """Store a file (taken from ``source``, or written from ``lines``) and record it; content first."""
        file_id = file_id or new_id("file-")
        if source is not None:
            size = self._adopt(file_id, source)
        else:
            size = self._put_content(file_id, (line + b"\n" for line in lines))
        record = FileRecord(file_id, tenant, purpose, filename, size, int(self.clock()))
        self._run("INSERT INTO batch_files VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                  "bytes = excluded.bytes", (record.id, record.tenant, record.purpose, record.filename,
                                             record.bytes, record.created_at))
        return record

    def get_file(self, tenant: str, file_id: str) -> FileRecord | None:
        row = self._run("SELECT * FROM batch_files WHERE id = ? AND tenant = ?", (file_id, tenant)).fetchone()
        return FileRecord(**_dict(row)) if row else None

    def list_files(self, tenant: str, purpose: str | None, limit: int, after: str | None,
                   newest_first: bool) -> list[FileRecord]:
        order = "DESC" if newest_first else "ASC"
        sql = "SELECT * FROM batch_files WHERE tenant = ?"
        args: list[Any] = [tenant]
        if purpose:
            sql += " AND purpose = ?"
            args.append(purpose)
        if after and (anchor := self.get_file(tenant, after)) is not None:
            sql += f" AND (created_at, id) {'<' if newest_first else '>'} (?, ?)"
            args += [anchor.created_at, anchor.id]
        sql += f" ORDER BY created_at {order}, id {order} LIMIT ?"
        return [FileRecord(**_dict(row)) for row in self._run(sql, (*args, limit)).fetchall()]

    def tenant_usage(self, tenant: str) -> tuple[int, int]:
        """(files, bytes) the tenant keeps."""
        row = self._run("SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM batch_files WHERE tenant = ?",
                        (tenant,)).fetchone()
        return int(row[0]), int(row[1])

    def expire_files(self, before: float) -> int:
        """Delete files made before ``before`` that no active batch reads; how many went."""
        marks = ",".join("?" * len(ACTIVE))
        rows = self._run(f"SELECT id, tenant FROM batch_files WHERE created_at < ? AND id NOT IN "
                         f"(SELECT input_file_id FROM batches WHERE status IN ({marks}))",
                         (int(before), *ACTIVE)).fetchall()
        return sum(self.delete_file(row[1], row[0]) for row in rows)

    def delete_file(self, tenant: str, file_id: str) -> bool:
        if self._run("DELETE FROM batch_files WHERE id = ? AND tenant = ?", (file_id, tenant)).rowcount == 0:
            return False
        self._drop_content(file_id)
        return True

    # -- batches -------------------------------------------------------------------------------------------

    def create_batch(self, tenant: str, endpoint: str, input_file_id: str, window: str,
                     metadata: dict[str, str] | None, key_id: str | None = None) -> BatchRecord:
        """A new batch, validating; ``key_id``: the key that created it, whose requests its lines are."""
        now = int(self.clock())
        batch_id = new_id("batch_")
        self._run(
            "INSERT INTO batches (id, tenant, endpoint, input_file_id, completion_window, status, created_at, "
            "expires_at, metadata, key_id) VALUES (?, ?, ?, ?, ?, 'validating', ?, ?, ?, ?)",
            (batch_id, tenant, endpoint, input_file_id, window, now, now + WINDOW_S,
             orjson.dumps(metadata).decode() if metadata is not None else None, key_id))
        record = self.get_batch(batch_id)
        assert record is not None
        return record

    def get_batch(self, batch_id: str, tenant: str | None = None) -> BatchRecord | None:
        row = self._run("SELECT * FROM batches WHERE id = ?", (batch_id,)).fetchone()
        if row is None:
            return None
        batch = _dict(row)
        if tenant is not None and batch["tenant"] != tenant:
            return None
        # every column named: PostgreSQL's rows are named tuples, which refuse two columns called "coalesce"
        sums = ", ".join(f"coalesce(sum({column}), 0) AS {column}" for column in USAGE_COLUMNS)
        completed, failed, unkept, *tokens = self._run(
            "SELECT coalesce(sum(ok), 0) AS completed, coalesce(sum(done) - sum(ok), 0) AS failed, "
            f"coalesce(sum(done), 0) - count(input_tokens) AS unkept, {sums} FROM batch_lines WHERE batch_id = ?",
            (batch_id,)).fetchone()
        usage = Usage(*(int(n) for n in tokens)) if int(unkept) == 0 else None
        return BatchRecord(batch, int(completed), int(failed), usage)

    def list_batches(self, tenant: str, limit: int, after: str | None) -> list[BatchRecord]:
        sql, args = "SELECT id FROM batches WHERE tenant = ?", [tenant]
        if after and (anchor := self.get_batch(after, tenant)) is not None:
            sql += " AND (created_at, id) < (?, ?)"
            args += [anchor.row["created_at"], anchor.id]
        sql += " ORDER BY created_at DESC, id DESC LIMIT ?"
        ids = [row[0] for row in self._run(sql, (*args, limit)).fetchall()]
        return [b for i in ids if (b := self.get_batch(i)) is not None]

    def active_batches(self) -> list[str]:
        marks = ",".join("?" * len(ACTIVE))
        return [row[0] for row in self._run(
            f"SELECT id FROM batches WHERE status IN ({marks}) ORDER BY created_at", ACTIVE).fetchall()]

    def set_status(self, batch_id: str, status: str, only_from: tuple[str, ...] = ACTIVE, **fields: Any) -> bool:
        """Move a batch to ``status`` (stamping its time) if it is in one of ``only_from``; False if not."""
        values = {STAMPS[status]: int(self.clock())} if status in STAMPS else {}
        values |= fields
        sets = ", ".join(["status = ?", *(f"{k} = ?" for k in values)])
        marks = ",".join("?" * len(only_from))
        cursor = self._run(f"UPDATE batches SET {sets} WHERE id = ? AND status IN ({marks})",
                           (status, *values.values(), batch_id, *only_from))
        return int(cursor.rowcount) == 1

    def fail_validation(self, batch_id: str, errors: list[dict[str, Any]]) -> None:
        self.set_status(batch_id, "failed", ("validating",), errors=orjson.dumps(errors).decode())

    def begin_validation(self, batch_id: str, owner: str, lease_s: float) -> int | None:
        """Take the batch's validation for ``owner`` (None while another process's lease on it is live), count
        one more try, and clear the lines an interrupted try left. Returns the tries so far: a file that
        crashed the process while it was validated is not tried forever."""
        now = self.clock()
        with self._transaction():
            row = self._run("SELECT validated_by, validated_until, validation_tries FROM batches WHERE id = ?",
                            (batch_id,)).fetchone()
            if row is None:
                return None
            holder, until, tries = row[0], row[1], row[2]
            if holder not in (None, owner) and until is not None and until > now:
                return None
            self._run("UPDATE batches SET validation_tries = ?, validated_by = ?, validated_until = ? WHERE id = ?",
                      (tries + 1, owner, now + lease_s, batch_id))
            self._run("DELETE FROM batch_lines WHERE batch_id = ?", (batch_id,))
            return int(tries + 1)

    def add_lines(self, batch_id: str, owner: str, lines: list[Line]) -> None:
        """Record some of a validated file's lines (a few thousand at a time, between other callers)."""
        with self._transaction():
            if not self._holds_validation(batch_id, owner):
                return
            self._run_many("INSERT INTO batch_lines (batch_id, line_no, custom_id, body) VALUES (?, ?, ?, ?) "
                           "ON CONFLICT (batch_id, line_no) DO NOTHING",
                           ((batch_id, line.line_no, line.custom_id, line.body) for line in lines))

    def start_lines(self, batch_id: str, owner: str, total: int) -> bool:
        """Move to in_progress once all ``total`` lines are recorded (by add_lines)."""
        with self._transaction():
            if not self._holds_validation(batch_id, owner):
                return False
            recorded = self._run("SELECT COUNT(*) FROM batch_lines WHERE batch_id = ?", (batch_id,)).fetchone()[0]
            if recorded != total:
                return False
            return self.set_status(batch_id, "in_progress", ("validating",), total=total)

    def _holds_validation(self, batch_id: str, owner: str) -> bool:
        """True while ``owner`` validates the batch; False once it is past validating (nothing left to do);
        LookupError when another process took the validation over (this one's lease lapsed)."""
        row = self._run("SELECT validated_by, status FROM batches WHERE id = ?", (batch_id,)).fetchone()
        if row is not None and row[1] != "validating":
            return False
        if row is None or row[0] != owner:
            raise LookupError(f"batch {batch_id}: this process no longer holds its validation")
        return True

    def local_file(self, file_id: str) -> Path | None:
        """The file's content as a path on this host, if it lives on this host (else read it by chunks)."""
        return None

    def claim(self, batch_id: str, owner: str, most: int, lease_s: float) -> list[tuple[int, str]]:
        """Claim up to ``most`` unfinished lines no live claim holds, for ``owner``, in file order."""
        now = self.clock()
        with self._transaction():
            rows = self._run(
                "SELECT line_no, custom_id FROM batch_lines WHERE batch_id = ? AND done = 0 AND "
                f"(claimed_until IS NULL OR claimed_until < ?) ORDER BY line_no LIMIT ?{self._claimable()}",
                (batch_id, now, most)).fetchall()
            if rows:
                self._run("UPDATE batch_lines SET claimed_by = ?, claimed_until = ? WHERE batch_id = ? AND "
                          f"line_no IN ({','.join('?' * len(rows))})",
                          (owner, now + lease_s, batch_id, *(row[0] for row in rows)))
        return [(int(row[0]), str(row[1])) for row in rows]

    def renew(self, owner: str, lease_s: float) -> int:
        """Extend every unfinished line ``owner`` holds; return how many."""
        return int(self._run("UPDATE batch_lines SET claimed_until = ? WHERE claimed_by = ? AND done = 0",
                             (self.clock() + lease_s, owner)).rowcount)

    def release(self, owner: str) -> None:
        """Give back every unfinished line ``owner`` holds (a clean stop: others take them at once)."""
        self._run("UPDATE batch_lines SET claimed_by = NULL, claimed_until = NULL WHERE claimed_by = ? AND "
                  "done = 0", (owner,))

    def unfinished(self, batch_id: str) -> int:
        return int(self._run("SELECT count(*) FROM batch_lines WHERE batch_id = ? AND done = 0",
                             (batch_id,)).fetchone()[0])

    def body(self, batch_id: str, line_no: int) -> bytes:
        row = self._run("SELECT body FROM batch_lines WHERE batch_id = ? AND line_no = ?",
                        (batch_id, line_no)).fetchone()
        return bytes(row[0])

    def finish_line(self, batch_id: str, line_no: int, ok: bool, result: bytes, usage: Usage = NO_TOKENS) -> None:
        """Checkpoint one line's output line and tokens; a line already finished keeps its first result."""
        self._run("UPDATE batch_lines SET done = 1, ok = ?, result = ?, claimed_by = NULL, input_tokens = ?, "
                  "cached_tokens = ?, output_tokens = ?, reasoning_tokens = ? WHERE batch_id = ? AND line_no = ? "
                  "AND done = 0", (int(ok), result, usage.input_tokens, usage.cached_tokens, usage.output_tokens,
                                   usage.reasoning_tokens, batch_id, line_no))

    def close_pending(self, batch_id: str, code: str, message: str) -> None:
        """Finish every line that has not run with an error line (the batch expired or was cancelled)."""
        with self._transaction():
            for line_no, custom_id in self._run(
                    "SELECT line_no, custom_id FROM batch_lines WHERE batch_id = ? AND done = 0 ORDER BY line_no",
                    (batch_id,)).fetchall():
                self.finish_line(batch_id, int(line_no), False, unanswered(str(custom_id), code, message))

    def results(self, batch_id: str, ok: bool, page: int = 1000) -> Iterator[bytes]:
        """The finished lines' output lines in file order, a page at a time (memory stays bounded)."""
        after = -1
        while rows := self._run("SELECT line_no, result FROM batch_lines WHERE batch_id = ? AND done = 1 AND "
                                "ok = ? AND line_no > ? ORDER BY line_no LIMIT ?",
                                (batch_id, int(ok), after, page)).fetchall():
            for _, result in rows:
                yield bytes(result)
            after = int(rows[-1][0])

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


class SqliteBatchStore(BatchStore):
    """Rows in ``<data_dir>/batches.sqlite3``, file contents under ``<data_dir>/files``."""

    def __init__(self, data_dir: Path, clock: Callable[[], float] = time.time) -> None:
        super().__init__(data_dir, clock)
        self._path = data_dir / "batches.sqlite3"

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            # autocommit (transactions are explicit); used from the store's one thread, closed from wherever close() is
            # the other processes of this host write too
            db = connect(self._path, timeout=5.0, autocommit=True, check_same_thread=False)
            db.row_factory = sqlite3.Row
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "lines" in tables and "batch_lines" not in tables:  # a data directory from before claims
                db.executescript("ALTER TABLE files RENAME TO batch_files; ALTER TABLE lines RENAME TO batch_lines; "
                                 "ALTER TABLE batch_lines ADD COLUMN claimed_by TEXT; "
                                 "ALTER TABLE batch_lines ADD COLUMN claimed_until REAL;")
            db.executescript(_SCHEMA.format(blob="BLOB", real="REAL", usage=_USAGE))
            columns = {row[1] for row in db.execute("PRAGMA table_info(batches)")}
            for column, kind in (("validation_tries", "INTEGER NOT NULL DEFAULT 0"), ("validated_by", "TEXT"),
                                 ("validated_until", "REAL"), ("key_id", "TEXT")):
                if column not in columns:  # a data directory from before validation's lease or the batch's key
                    db.execute(f"ALTER TABLE batches ADD COLUMN {column} {kind}")
            columns = {row[1] for row in db.execute("PRAGMA table_info(batch_lines)")}
            for column in USAGE_COLUMNS:
                if column not in columns:  # a data directory from before lines kept their tokens
                    db.execute(f"ALTER TABLE batch_lines ADD COLUMN {column} BIGINT")
            self._db = db
        connection: sqlite3.Connection = self._db  # the backend's connection is held untyped (Any)
        return connection

    def _run(self, sql: str, args: Iterable[Any] = ()) -> Any:
        return self.db.execute(sql, tuple(args))

    def _run_many(self, sql: str, rows: Iterable[tuple[Any, ...]]) -> None:
        self.db.executemany(sql, rows)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        db = self.db
        if db.in_transaction:
            yield
            return
        db.execute("BEGIN IMMEDIATE")  # the write lock now: a claim's select and update see one state
        try:
            yield
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def file_path(self, file_id: str) -> Path:
        return self.files_dir / file_id

    def _put_content(self, file_id: str, chunks: Iterable[bytes]) -> int:
        path = self.file_path(file_id)
        tmp = path.with_suffix(".part")
        with tmp.open("wb") as out:
            for chunk in chunks:
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        return path.stat().st_size

    def _adopt(self, file_id: str, source: Path) -> int:
        """The staged upload is already on this disk: a rename, not a second copy on the store's thread."""
        path = self.file_path(file_id)
        with source.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(source, path)
        return path.stat().st_size

    def read_chunk(self, file_id: str, index: int) -> bytes | None:
        with self.file_path(file_id).open("rb") as f:
            f.seek(index * CHUNK)
            return f.read(CHUNK) or None

    def _drop_content(self, file_id: str) -> None:
        self.file_path(file_id).unlink(missing_ok=True)

    def local_file(self, file_id: str) -> Path | None:
        return self.file_path(file_id)


class PostgresBatchStore(BatchStore):
    """Rows and file contents (in CHUNK-sized rows) in PostgreSQL, shared by every replica; the data
    directory only stages uploads."""

    mark = "%s"

    def __init__(self, data_dir: Path, dsn: str, clock: Callable[[], float] = time.time) -> None:
        import psycopg

        super().__init__(data_dir, clock)
        self.dsn = dsn
        self.unavailable = (psycopg.OperationalError,)

    @property
    def db(self) -> Any:
        if self._db is None or self._db.closed:
            import psycopg
            from psycopg.rows import namedtuple_row

            db = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5, row_factory=namedtuple_row)
            with db.transaction():
                db.execute("SELECT pg_advisory_xact_lock(7454)")  # replicas starting together
                for statement in _SCHEMA.format(blob="BYTEA", real="DOUBLE PRECISION", usage=_USAGE).split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute("CREATE TABLE IF NOT EXISTS batch_file_chunks (file_id TEXT NOT NULL, seq INTEGER "
                           "NOT NULL, data BYTEA NOT NULL, PRIMARY KEY (file_id, seq))")
                for column in ("validation_tries INTEGER NOT NULL DEFAULT 0", "validated_by TEXT",
                               "validated_until DOUBLE PRECISION", "key_id TEXT"):
                    db.execute(f"ALTER TABLE batches ADD COLUMN IF NOT EXISTS {column}")
                for column in USAGE_COLUMNS:
                    db.execute(f"ALTER TABLE batch_lines ADD COLUMN IF NOT EXISTS {column} BIGINT")
            self._db = db
        return self._db

    def _run(self, sql: str, args: Iterable[Any] = ()) -> Any:
        return self.db.execute(sql.replace("?", "%s"), tuple(args))

    def _run_many(self, sql: str, rows: Iterable[tuple[Any, ...]]) -> None:
        with self.db.cursor() as cursor:
            cursor.executemany(sql.replace("?", "%s"), rows)  # pipelined: one round trip per batch of rows

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        with self.db.transaction():
            yield

    def _claimable(self) -> str:
        return " FOR UPDATE SKIP LOCKED"

    def _put_content(self, file_id: str, chunks: Iterable[bytes]) -> int:
        size = 0
        with self._transaction():
            self._run("DELETE FROM batch_file_chunks WHERE file_id = ?", (file_id,))
            for seq, chunk in enumerate(_rechunk(chunks)):
                self._run("INSERT INTO batch_file_chunks VALUES (?, ?, ?)", (file_id, seq, chunk))
                size += len(chunk)
        return size

    def read_chunk(self, file_id: str, index: int) -> bytes | None:
        row = self._run("SELECT data FROM batch_file_chunks WHERE file_id = ? AND seq = ?",
                        (file_id, index)).fetchone()
        return bytes(row[0]) if row else None

    def _drop_content(self, file_id: str) -> None:
        self._run("DELETE FROM batch_file_chunks WHERE file_id = ?", (file_id,))



def open_batch_store(data_dir: Path, postgres_dsn: str | None, clock: Callable[[], float] = time.time) -> BatchStore:
    """PostgreSQL when replicas share state (``state.postgres_dsn``), else the data directory."""
    return PostgresBatchStore(data_dir, postgres_dsn, clock) if postgres_dsn else SqliteBatchStore(data_dir, clock)


def _usage_object(usage: Usage | None) -> dict[str, Any] | None:
    """A batch's usage in the shape of OpenAI's batch object."""
    if usage is None:
        return None
    return {"input_tokens": usage.input_tokens, "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens": usage.output_tokens, "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
            "total_tokens": usage.input_tokens + usage.output_tokens}


def _dict(row: Any) -> dict[str, Any]:
    return dict(row) if isinstance(row, sqlite3.Row) else row._asdict() if hasattr(row, "_asdict") else dict(row)


def _chunks_of(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


def _rechunk(pieces: Iterable[bytes]) -> Iterator[bytes]:
    """Pieces of any size (lines) as CHUNK-sized blocks, the last one shorter."""
    buffer = bytearray()
    for piece in pieces:
        buffer += piece
        while len(buffer) >= CHUNK:
            yield bytes(buffer[:CHUNK])
            del buffer[:CHUNK]
    if buffer:
        yield bytes(buffer)
