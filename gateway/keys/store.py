"""Runtime keys and the admin audit log in the state store: ``<data_dir>/admin.sqlite3`` (the gateway processes
of one host share it; in memory without a data directory), or PostgreSQL with ``state.postgres_dsn`` (every
replica shares it).

Every change to a key takes the next number of one counter (``api_key_version``) inside the transaction that
makes it and stamps the row with it; a process asks for the rows stamped after the highest number it holds (one
indexed query per poll, none per request). Writers hold the counter's row from their first statement to their
commit, so numbers commit in order and a reader never sees a number before every smaller one. An admin action's
audit entry commits in the transaction of the change it records.

An audit entry's details are bounded in bytes (``bounded``: at most ``MAX_DETAILS_BYTES`` of JSON, lists cut
from their end and oversized members summarised, with a ``truncated`` marker saying what was left out), as
written and as read (an entry stored before the bound is shown bounded); the log reads in pages bounded in bytes
too (``audit_page``), sized in the database before any entry is fetched.

Every method blocks; ``do`` runs them on the store's one thread, on its one connection.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from gateway.errors import Conflict, Unavailable
from gateway.state.sqlite import connect

log = logging.getLogger("tollgate.keys")
T = TypeVar("T")
FILE = "admin.sqlite3"
KEY_COLUMNS = ("id", "digest", "tenant", "name", "created_at", "created_by", "expires_at", "revoked_at",
               "revoked_by", "rotated_from", "rotated_to", "limits", "version")
AUDIT_COLUMNS = ("id", "time", "actor", "client", "action", "target", "details")
MAX_DETAILS_BYTES = 16 * 1024  # of one audit entry's details, as JSON
ENTRY_OVERHEAD_BYTES = 512  # an entry's other fields as the log shows them (id, time, actor, client, peer, action)
TARGET = "COALESCE(target, '')"
_MARKER_BYTES = 512  # room kept for the truncated marker

# {real}: a float column. The same tables in both stores, made by the first connection that finds them missing
# (PostgreSQL's statements would otherwise take locks that wait on, and deadlock with, a writer holding the
# counter's row). Times of keys are Unix seconds (compared on every request); the audit's are the ledger's ISO
# text (gateway.ledger.times), compared as text in a range.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    id TEXT PRIMARY KEY, digest TEXT NOT NULL UNIQUE, tenant TEXT NOT NULL, name TEXT NOT NULL,
    created_at {real} NOT NULL, created_by TEXT NOT NULL, expires_at {real}, revoked_at {real}, revoked_by TEXT,
    rotated_from TEXT, rotated_to TEXT, limits TEXT NOT NULL, version BIGINT NOT NULL);
CREATE INDEX IF NOT EXISTS api_keys_by_version ON api_keys (version);
CREATE TABLE IF NOT EXISTS api_key_version (id INTEGER PRIMARY KEY, version BIGINT NOT NULL);
INSERT INTO api_key_version (id, version) SELECT 1, 0 WHERE NOT EXISTS (SELECT 1 FROM api_key_version);
CREATE TABLE IF NOT EXISTS admin_audit (
    id TEXT PRIMARY KEY, time TEXT NOT NULL, actor TEXT NOT NULL, client TEXT, action TEXT NOT NULL,
    target TEXT, details TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS admin_audit_by_time ON admin_audit (time, id)
"""


@dataclass
class Change:
    """What a ``change`` plan does to the key it read: columns to set on it, rows to add, the audit entry."""

    updates: dict[str, Any] = field(default_factory=dict)
    inserts: list[dict[str, Any]] = field(default_factory=list)
    audit: dict[str, Any] | None = None


def bounded(details: str, limit: int = MAX_DETAILS_BYTES) -> str:
    """An audit entry's details (JSON text) within ``limit`` bytes: as given when they fit; else the object with
    its list members cut from their end, and any other member too large for what is left replaced by
    ``{"omitted": "<n> bytes of JSON"}``, plus ``truncated``: ``{"bytes": the whole's size, "bytes_left_out": n,
    "left_out": {member: items left out of it}}`` (a policy change's ``changes`` are its paths). Members keep
    their order; small members are kept before lists take what is left. Never longer than ``limit``."""
    size = len(details.encode())
    if size <= limit:
        return details
    try:
        data = orjson.loads(details)
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        return orjson.dumps({"truncated": {"bytes": size, "bytes_left_out": size, "left_out": {}}}).decode()
    room = limit - _MARKER_BYTES
    kept: dict[str, Any] = {}
    used = 2  # {}
    lists = []
    for name, value in data.items():
        if isinstance(value, list):
            kept[name] = []
            lists.append(name)
            used += len(orjson.dumps(name)) + 4  # "name":[],
            continue
        whole = len(orjson.dumps({name: value})) - 1  # "name":value,
        if used + whole > room:
            value = {"omitted": f"{whole} bytes of JSON"}
            whole = len(orjson.dumps({name: value})) - 1
        kept[name] = value
        used += whole
    left_out: dict[str, int] = {}
    for name in lists:
        items = data[name]
        for item in items:
            cost = len(orjson.dumps(item)) + 1
            if used + cost > room:
                break
            kept[name].append(item)
            used += cost
        if len(kept[name]) < len(items):
            left_out[name] = len(items) - len(kept[name])
    shown = orjson.dumps(kept)
    marker = {"bytes": size, "bytes_left_out": max(0, size - len(shown)), "left_out": left_out}
    out = orjson.dumps({**kept, "truncated": marker})
    if len(out) > limit:  # members beyond counting (thousands of small ones): the marker alone
        marker = {"bytes": size, "bytes_left_out": size, "left_out": {}, "members_left_out": len(data)}
        out = orjson.dumps({"truncated": marker})
    return out.decode()


class KeyStore(abc.ABC):
    mark = "?"
    unavailable: tuple[type[Exception], ...] = (sqlite3.OperationalError,)
    duplicate: tuple[type[Exception], ...] = (sqlite3.IntegrityError,)  # a unique column's value taken

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None  # made on first use, again after a close
        self._db: Any = None

    async def do(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking method on the store's thread; an unreachable store is ``Unavailable`` (503)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="tollgate-keys")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        except self.unavailable as exc:
            log.warning("key store unavailable: %s", exc)
            raise Unavailable("The key and audit store is unreachable; retry shortly.", "key_store_unavailable",
                              retry_after_s=2) from None

    def close(self) -> None:
        if self._executor is not None:
            self._executor.submit(self._disconnect).result()
            self._executor.shutdown()
            self._executor = None

    def _disconnect(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    @abc.abstractmethod
    def _run(self, sql: str, args: Iterable[Any] = ()) -> Any:
        """Execute one statement (``?`` marks); the cursor."""

    @abc.abstractmethod
    def _transaction(self) -> contextlib.AbstractContextManager[None]: ...

    def _rows(self, sql: str, args: Iterable[Any] = ()) -> list[dict[str, Any]]:
        cursor = self._run(sql, args)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def _bump(self) -> int:
        """The next change number (first in a transaction: the counter's row is held until the commit)."""
        return int(self._run("UPDATE api_key_version SET version = version + 1 WHERE id = 1 RETURNING version")
                   .fetchone()[0])

    def _insert(self, table: str, columns: tuple[str, ...], row: dict[str, Any]) -> None:
        if table == "admin_audit":  # every audit entry, whichever change it commits with, is bounded here
            row = {**row, "details": bounded(row["details"])}
        self._run(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                  [row.get(c) for c in columns])

    def add(self, row: dict[str, Any], audit: dict[str, Any], cap: tuple[int, float] | None = None) -> None:
        """A new key and the audit entry that says who made it. ``cap``: (most live keys, now): refused with
        ``Conflict`` when the tenant holds that many keys neither revoked nor expired (counted inside the
        transaction, after the counter's row is held: two admins cannot both take the last place)."""
        with self._transaction():
            version = self._bump()
            if cap is not None:
                most, now = cap
                live = self._run("SELECT COUNT(*) FROM api_keys WHERE tenant = ? AND revoked_at IS NULL AND "
                                 "(expires_at IS NULL OR expires_at > ?)", (row["tenant"], now)).fetchone()[0]
                if live >= most:
                    raise Conflict(f"Tenant '{row['tenant']}' holds {live} live keys, the most keys.max_per_tenant "
                                   "allows: revoke or expire one first.", "too_many_keys")
            self._insert("api_keys", KEY_COLUMNS, {**row, "version": version})
            self._insert("admin_audit", AUDIT_COLUMNS, audit)

    def change(self, key: str, plan: Callable[[dict[str, Any] | None], Change]) -> None:
        """Read a key's row as it is now (None: no such key), let ``plan`` decide (or raise), and write what it
        decided in one transaction."""
        with self._transaction():
            version = self._bump()
            found = self._rows(f"SELECT {', '.join(KEY_COLUMNS)} FROM api_keys WHERE id = ?", (key,))
            decided = plan(found[0] if found else None)
            if decided.updates:
                sets = {**decided.updates, "version": version}
                self._run(f"UPDATE api_keys SET {', '.join(f'{c} = ?' for c in sets)} WHERE id = ?",
                          [*sets.values(), key])
            for row in decided.inserts:
                self._insert("api_keys", KEY_COLUMNS, {**row, "version": version})
            if decided.audit is not None:
                self._insert("admin_audit", AUDIT_COLUMNS, decided.audit)

    def changed_since(self, version: int) -> list[dict[str, Any]]:
        """Every key stamped after ``version``, in stamp order."""
        return self._rows(f"SELECT {', '.join(KEY_COLUMNS)} FROM api_keys WHERE version > ? ORDER BY version",
                          (version,))

    def add_audit(self, entry: dict[str, Any]) -> None:
        with self._transaction():
            self._insert("admin_audit", AUDIT_COLUMNS, entry)

    def audit(self, start: str, end: str, limit: int) -> list[dict[str, Any]]:
        """Entries in [start, end), newest first (details bounded)."""
        return self.audit_page(start, end, limit, None, None)[0]

    # the byte length of a text column, in this database's SQL
    _octets = "length(CAST({} AS BLOB))"

    def audit_entry(self, entry_id: str) -> dict[str, Any] | None:
        """One entry by its id (details bounded), or None."""
        rows = self._rows(f"SELECT {', '.join(AUDIT_COLUMNS)} FROM admin_audit WHERE id = ?", (entry_id,))
        if not rows:
            return None
        rows[0]["details"] = bounded(rows[0]["details"])
        return rows[0]

    def audit_page(self, start: str, end: str, limit: int, after: tuple[str, str] | None,
                   budget: int | None, action: str | None = None) -> tuple[list[dict[str, Any]], bool]:
        """A page of the entries in [start, end), newest first, after the entry ``after`` (its (time, id): the last
        of the page before): at most ``limit`` entries whose details and ``ENTRY_OVERHEAD_BYTES`` each come to at
        most ``budget`` bytes (None: no bound), and always one. (the entries, details bounded; whether more
        follow). ``action``: only entries of that action or under it (``policy``: policy.apply, policy.reject ...).
        The sizes are read first, in the database; an entry stored before the bound is fetched alone and
        bounded before the next one is read."""
        where, args = "time >= ? AND time < ?", [start, end]
        if after is not None and after[0] < end:  # the index range ends at the cursor: a page reads its own
            where, args = "time >= ? AND time <= ?", [start, after[0]]  # rows, not every newer one again
        if action is not None:
            where += " AND (action = ? OR action LIKE ? ESCAPE '!')"
            args += [action, action.replace("!", "!!").replace("_", "!_").replace("%", "!%") + ".%"]
        if after is not None:
            where += " AND (time < ? OR (time = ? AND id < ?))"
            args += [after[0], after[0], after[1]]
        order = f"ORDER BY time DESC, id DESC LIMIT {int(limit) + 1}"
        sizes = self._rows(f"SELECT id, {self._octets.format('details')} AS size, "
                           f"{self._octets.format(TARGET)} AS target_size "
                           f"FROM admin_audit WHERE {where} {order}", args)
        taken: list[str] = []
        used = 0
        for row in sizes[:limit]:
            cost = min(int(row["size"]), MAX_DETAILS_BYTES) + int(row["target_size"]) + ENTRY_OVERHEAD_BYTES
            if taken and budget is not None and used + cost > budget:
                break
            taken.append(row["id"])
            used += cost
        more = len(taken) < len(sizes)
        if not taken:
            return [], more
        chosen = set(taken)
        small = [r["id"] for r in sizes if r["id"] in chosen and int(r["size"]) <= MAX_DETAILS_BYTES]
        columns = ", ".join(AUDIT_COLUMNS)
        found = {r["id"]: r for r in self._rows(
            f"SELECT {columns} FROM admin_audit WHERE id IN ({', '.join('?' * len(small))})", small)} if small else {}
        out = []
        for kid in taken:
            entry = found.get(kid)
            if entry is None:  # larger than the bound (written before it): alone, and bounded at once
                entry = self._rows(f"SELECT {columns} FROM admin_audit WHERE id = ?", (kid,))[0]
                entry["details"] = bounded(entry["details"])
            out.append(entry)
        return out, more


class SqliteKeyStore(KeyStore):
    """``path`` (or ":memory:": this process only, gone at exit)."""

    def __init__(self, path: Path | str) -> None:
        super().__init__()
        self.path = path

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            # the other processes of this host write too
            db = connect(self.path, timeout=5.0, autocommit=True, check_same_thread=False)
            db.execute("BEGIN IMMEDIATE")
            try:
                for statement in _SCHEMA.format(real="REAL").split(";"):
                    db.execute(statement)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            self._db = db
        connection: sqlite3.Connection = self._db  # the backend's connection is held untyped (Any)
        return connection

    def _run(self, sql: str, args: Iterable[Any] = ()) -> Any:
        return self.db.execute(sql, tuple(args))

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")


class PostgresKeyStore(KeyStore):
    mark = "%s"
    _octets = "octet_length({})"

    def __init__(self, dsn: str) -> None:
        import psycopg

        super().__init__()
        self.dsn = dsn
        self.unavailable = (psycopg.OperationalError,)
        self.duplicate = (psycopg.errors.UniqueViolation,)

    @property
    def db(self) -> Any:
        """The connection, made on first use; the first one made creates the tables (so a gateway starts while
        the database is down, and picks the keys up when it is back)."""
        if self._db is None or self._db.closed:
            import psycopg

            db = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)
            if not self._made(db):
                with db.transaction():
                    db.execute("SELECT pg_advisory_xact_lock(7455)")  # replicas starting together
                    if not self._made(db):
                        for statement in _SCHEMA.format(real="DOUBLE PRECISION").split(";"):
                            db.execute(statement)
            self._db = db
        return self._db

    @staticmethod
    def _made(db: Any) -> bool:
        found = db.execute("SELECT to_regclass('api_keys') IS NOT NULL AND to_regclass('api_key_version') IS NOT NULL "
                           "AND to_regclass('admin_audit') IS NOT NULL").fetchone()
        return bool(found[0])

    def _run(self, sql: str, args: Iterable[Any] = ()) -> Any:
        try:
            return self.db.execute(sql.replace("?", "%s"), tuple(args))
        except self.unavailable:
            self._disconnect()  # a new connection on the next call
            raise

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        with self.db.transaction():
            yield


def open_key_store(data_dir: Path | None, postgres_dsn: str | None) -> KeyStore:
    """PostgreSQL when replicas share state, else the data directory's SQLite (memory without one)."""
    if postgres_dsn:
        return PostgresKeyStore(postgres_dsn)
    return SqliteKeyStore(data_dir / FILE if data_dir is not None else ":memory:")
