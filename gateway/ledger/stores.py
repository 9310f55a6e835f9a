"""The ledger's tables: SQLite in the data directory (the embedded default) or PostgreSQL (shared by replicas).

Both hold the same columns and answer the same queries (records in time order, sums grouped by
tenant/model/day/tier/key/tag, those sums read a chunk at a time from one cursor, and each tenant's largest cost
centres), written once in SQL both understand. Times are ISO 8601 UTC text
("2026-11-30T06:37:43.123456Z"), so they sort as text and a day is their first ten characters. Inserts are
idempotent on ``id`` (a replayed spool never doubles a record). Every method blocks: callers run them on a
thread (the ledger's writer, or ``asyncio.to_thread`` for reports).
"""

from __future__ import annotations

import abc
import functools
import itertools
import math
import operator
import sqlite3
import threading
from collections.abc import Generator, Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

from gateway.state.sqlite import connect

# column -> (SQLite type, PostgreSQL type)
COLUMNS: dict[str, tuple[str, str]] = {
    "id": ("TEXT PRIMARY KEY", "text PRIMARY KEY"),
    "request_id": ("TEXT NOT NULL", "text NOT NULL"),
    "time": ("TEXT NOT NULL", "text NOT NULL"),
    "tenant": ("TEXT NOT NULL", "text NOT NULL"),
    "key_id": ("TEXT", "text"),
    "tier": ("TEXT NOT NULL", "text NOT NULL"),
    "service_class": ("TEXT NOT NULL", "text NOT NULL"),
    "model": ("TEXT", "text"),
    "endpoint": ("TEXT NOT NULL", "text NOT NULL"),
    "stream": ("INTEGER NOT NULL", "boolean NOT NULL"),
    "status": ("INTEGER NOT NULL", "integer NOT NULL"),
    "error": ("TEXT", "text"),
    "prompt_tokens": ("INTEGER NOT NULL", "bigint NOT NULL"),
    "completion_tokens": ("INTEGER NOT NULL", "bigint NOT NULL"),
    "cached_tokens": ("INTEGER NOT NULL", "bigint NOT NULL"),
    "cache": ("TEXT", "text"),
    "estimated": ("INTEGER NOT NULL", "boolean NOT NULL"),
    "batch": ("TEXT", "text"),
    "cost_usd": ("REAL NOT NULL", "double precision NOT NULL"),
    "price_version": ("TEXT", "text"),
    "queue_wait_ms": ("REAL", "double precision"),
    "ttft_ms": ("REAL", "double precision"),
    "total_ms": ("REAL", "double precision"),
    "worker": ("TEXT", "text"),
    "worker_ms": ("REAL", "double precision"),  # dispatch to the last byte: the request's span on its worker
    "tags": ("TEXT", "text"),  # cost centres, "key=value" pairs sorted and joined by "," (gateway.tags)
}
ADDED = ("worker_ms", "tags")  # columns later than the first table: added to a ledger made before them
# What each gateway process saw of each worker, as spans of one state (gateway.ledger.presence): a GPU is paid
# for while it is configured, busy or not, and the ledger alone sees only the busy part.
PRESENCE = ("CREATE TABLE IF NOT EXISTS worker_presence (id TEXT PRIMARY KEY, replica TEXT NOT NULL, "
            "worker TEXT NOT NULL, pool TEXT NOT NULL, up INTEGER NOT NULL, since TEXT NOT NULL, "
            "until TEXT NOT NULL)")
PRESENCE_INDEX = "CREATE INDEX IF NOT EXISTS worker_presence_until ON worker_presence (until)"
# Closed months (gateway.ledger.closes): each names the close before it, once ('' for the first), so closes form
# one chain however many replicas close at once.
CLOSES = ("CREATE TABLE IF NOT EXISTS ledger_closes (month TEXT PRIMARY KEY, previous TEXT NOT NULL UNIQUE, "
          "closed_at TEXT NOT NULL, closed_by TEXT NOT NULL, snapshot TEXT NOT NULL)")
BOOLEAN = ("stream", "estimated")
OPEN_START, OPEN_END = "0000", "9999"  # bounds that sort before and after every stored time: an open range
GROUPS = {"tenant": "tenant", "model": "model", "tier": "tier", "class": "service_class", "key": "key_id",
          "day": "substr(time, 1, 10)", "tag": "tags", "worker": "worker"}
SUMS = ("count(*) AS requests, sum(prompt_tokens) AS prompt_tokens, sum(completion_tokens) AS completion_tokens, "
        "sum(cached_tokens) AS cached_tokens, sum(cost_usd) AS cost_usd, "
        "sum(CASE WHEN substr(cache, 1, 3) = 'hit' THEN 1 ELSE 0 END) AS cache_hits, "
        "sum(CASE WHEN substr(cache, 1, 3) = 'hit' THEN prompt_tokens + completion_tokens ELSE 0 END) "
        "AS cache_saved_tokens, "
        "sum(CASE WHEN status >= 400 THEN 1 ELSE 0 END) AS errors")


class LedgerStore(Protocol):
    def insert(self, records: Sequence[dict[str, Any]]) -> None: ...

    def records(self, start: str, end: str, tenant: str | None, after: tuple[str, str] | None,
                limit: int, tag: str | None = None, columns: Sequence[str] | None = None) -> list[dict[str, Any]]: ...

    def totals(self, start: str, end: str, group_by: Sequence[str], tenant: str | None,
               tag: str | None = None) -> list[dict[str, Any]]: ...

    def stream_totals(self, start: str, end: str, group_by: Sequence[str], tenant: str | None,
                      tag: str | None = None, chunk: int = 2000) -> Generator[list[dict[str, Any]], None, None]: ...

    def top_tags(self, start: str, end: str, top: int) -> list[dict[str, Any]]: ...

    def tokens_percentile(self, start: str, end: str, q: float, tenant: str | None = None) -> int | None: ...

    def extend_presence(self, spans: Sequence[dict[str, Any]]) -> None: ...

    def presence(self, start: str, end: str) -> list[dict[str, Any]]: ...

    def add_close(self, close: dict[str, str]) -> None: ...

    def closes(self) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


class _Sql(abc.ABC):
    """The SQL both stores share; ``mark`` is the driver's placeholder, ``_run`` its query call."""

    mark = "?"

    @abc.abstractmethod
    def _run(self, sql: str, args: Sequence[Any]) -> list[dict[str, Any]]: ...

    def _where(self, start: str, end: str, tenant: str | None, tag: str | None = None) -> tuple[str, list[Any]]:
        """``tag`` is one "key=value" pair, matched whole and case-sensitively within the comma-joined tags
        (replace() is binary in both databases; SQLite's LIKE ignores case)."""
        m = self.mark
        sql, args = f"time >= {m} AND time < {m}", [start, end]
        if tenant is not None:
            sql += f" AND tenant = {m}"
            args.append(tenant)
        if tag is not None:
            sql += f" AND replace(',' || tags || ',', {m}, '') <> ',' || tags || ','"
            args.append(f",{tag},")
        return sql, args

    def records(self, start: str, end: str, tenant: str | None, after: tuple[str, str] | None,
                limit: int, tag: str | None = None, columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Up to ``limit`` records after ``after`` (time, id) in time order; ``columns`` (of COLUMNS; time and id
        always come) reads only those, for a reader that needs a few of a month's records' 26. A page's work is
        its own rows' (plus those sharing the cursor's time), however deep the cursor."""
        names = list(COLUMNS) if columns is None else list(dict.fromkeys(["time", "id", *columns]))
        unknown = set(names) - set(COLUMNS)
        if unknown:
            raise ValueError(f"no ledger columns {sorted(unknown)}")
        if after is not None:  # the index range starts at the cursor: each page reads its own rows, not every
            start = max(start, after[0])  # row from ``start`` to the cursor again (a month's pages, quadratic)
        where, args = self._where(start, end, tenant, tag)
        if after is not None:
            where += f" AND (time > {self.mark} OR (time = {self.mark} AND id > {self.mark}))"
            args += [after[0], after[0], after[1]]
        rows = self._run(f"SELECT {', '.join(names)} FROM ledger WHERE {where} ORDER BY time, id "
                         f"LIMIT {int(limit)}", args)
        flags = [name for name in BOOLEAN if name in names]
        for row in rows:
            for name in flags:
                row[name] = bool(row[name])
        return rows

    def _totals_sql(self, start: str, end: str, group_by: Sequence[str], tenant: str | None,
                    tag: str | None) -> tuple[str, list[Any]]:
        where, args = self._where(start, end, tenant, tag)
        keys = [f"{GROUPS[g]} AS {'key_id' if g == 'key' else g}" for g in group_by]
        order = ", ".join(str(i + 1) for i in range(len(group_by)))
        sql = f"SELECT {', '.join([*keys, SUMS])} FROM ledger WHERE {where}"
        if group_by:
            sql += f" GROUP BY {order} ORDER BY {order}"
        return sql, args

    def totals(self, start: str, end: str, group_by: Sequence[str], tenant: str | None,
               tag: str | None = None) -> list[dict[str, Any]]:
        return _plain(self._run(*self._totals_sql(start, end, group_by, tenant, tag)))

    def stream_totals(self, start: str, end: str, group_by: Sequence[str], tenant: str | None,
                      tag: str | None = None, chunk: int = 2000) -> Generator[list[dict[str, Any]], None, None]:
        """``totals``, the same rows in the same order, ``chunk`` at a time from one cursor (one statement: one
        view of the ledger), so a grouping with a row per end user is never held whole. The cursor lives in the
        calling thread: consume the iterator there, to its end or closed."""
        sql, args = self._totals_sql(start, end, group_by, tenant, tag)
        for rows in self._stream(sql, args, chunk):
            yield _plain(rows)

    def top_tags(self, start: str, end: str, top: int) -> list[dict[str, Any]]:
        """Each tenant's ``top`` tag sets (cost centres) of [start, end) by list-price spend, then requests,
        then the tags as text (rows of tenant and tags): one ranking, counted in the database. Untagged records
        are no cost centre here."""
        where, args = self._where(start, end, None)
        return self._run(
            "SELECT tenant, tags FROM (SELECT tenant, tags, row_number() OVER (PARTITION BY tenant ORDER BY "
            "sum(cost_usd) DESC, count(*) DESC, tags) AS place FROM ledger WHERE "
            f"{where} AND tags IS NOT NULL GROUP BY tenant, tags) AS ranked WHERE place <= {int(top)} "
            "ORDER BY tenant, place", args)

    @abc.abstractmethod
    def _stream(self, sql: str, args: Sequence[Any], chunk: int) -> Generator[list[dict[str, Any]], None, None]: ...


    def tokens_percentile(self, start: str, end: str, q: float, tenant: str | None = None) -> int | None:
        """The q-th percentile (0-100) of prompt + completion tokens per request (one tenant's, or every
        tenant's), sorted in the database."""
        where, args = self._where(start, end, tenant)
        count = self._run(f"SELECT count(*) AS n FROM ledger WHERE {where}", args)[0]["n"]
        if not count:
            return None
        rank = min(int(count) - 1, max(0, math.ceil(q / 100 * int(count)) - 1))
        rows = self._run(f"SELECT prompt_tokens + completion_tokens AS t FROM ledger WHERE {where} "
                         f"ORDER BY t LIMIT 1 OFFSET {rank}", args)
        return int(rows[0]["t"])


    @abc.abstractmethod
    def _write(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...

    def extend_presence(self, spans: Sequence[dict[str, Any]]) -> None:
        """Insert spans, or move a known span's end (each process rewrites its own open spans every beat)."""
        m = self.mark
        self._write(f"INSERT INTO worker_presence (id, replica, worker, pool, up, since, until) VALUES "
                    f"({m}, {m}, {m}, {m}, {m}, {m}, {m}) ON CONFLICT (id) DO UPDATE SET until = excluded.until",
                    [(s["id"], s["replica"], s["worker"], s["pool"], int(s["up"]), s["since"], s["until"])
                     for s in spans])

    def presence(self, start: str, end: str) -> list[dict[str, Any]]:
        """The spans that overlap [start, end), in time order."""
        m = self.mark
        return self._run(f"SELECT id, replica, worker, pool, up, since, until FROM worker_presence "
                         f"WHERE until > {m} AND since < {m} ORDER BY since, id", [start, end])

    def add_close(self, close: dict[str, str]) -> None:
        """Store a closed month, unless that month, or another close after the same previous one, is already
        stored: the caller reads back which close stands."""
        m = self.mark
        self._write(f"INSERT INTO ledger_closes (month, previous, closed_at, closed_by, snapshot) VALUES "
                    f"({m}, {m}, {m}, {m}, {m}) ON CONFLICT DO NOTHING",
                    [tuple(close[k] for k in ("month", "previous", "closed_at", "closed_by", "snapshot"))])

    def closes(self) -> list[dict[str, Any]]:
        """Every closed month, snapshot included, in month order."""
        return self._run("SELECT month, previous, closed_at, closed_by, snapshot FROM ledger_closes ORDER BY month",
                         [])


POSTGRES_PARAMETERS = 65_535  # the most a statement binds: the wire protocol counts them in 16 bits


def rows_per_insert(parameters: int) -> int:
    """The most ledger rows one statement can bind within ``parameters`` values, as a power of two (the largest
    of ``_chunks``' sizes): 1,024 for SQLite's 32,766 (3.32 and later), 32 for its older 999, 2,048 for
    PostgreSQL."""
    return 1 << ((parameters // len(COLUMNS)).bit_length() - 1)


@functools.cache
def _insert_rows(count: int, mark: str, verb: str, tail: str) -> str:
    """An insert of ``count`` ledger rows in one statement."""
    row = "(" + ", ".join([mark] * len(COLUMNS)) + ")"
    return f"{verb} INTO ledger ({', '.join(COLUMNS)}) VALUES {', '.join([row] * count)}{tail}"


def _chunks(n: int, most: int) -> Iterator[int]:
    """``n`` as a sum of powers of two no larger than ``most`` (itself one), largest first: at most
    log2(most) + 1 statement texts ever, each prepared once and kept in sqlite3's cache."""
    while n >= most:
        yield most
        n -= most
    size = most
    while n:
        size //= 2
        if n & size:
            yield size
            n -= size


class SqliteLedger(_Sql):
    """``<data_dir>/ledger.sqlite3`` in WAL mode: the writer commits, report readers run beside it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()
        columns = ", ".join(f"{name} {types[0]}" for name, types in COLUMNS.items())
        with self._db() as db:
            db.execute(f"CREATE TABLE IF NOT EXISTS ledger ({columns})")
            db.execute("CREATE INDEX IF NOT EXISTS ledger_time ON ledger (time, id)")
            db.execute("CREATE INDEX IF NOT EXISTS ledger_tenant_time ON ledger (tenant, time)")
            have = {row["name"] for row in db.execute("PRAGMA table_info(ledger)")}
            for name in ADDED:
                if name not in have:
                    db.execute(f"ALTER TABLE ledger ADD COLUMN {name} {COLUMNS[name][0]}")
            db.execute(PRESENCE)
            db.execute(PRESENCE_INDEX)
            db.execute(CLOSES)
            self._rows_per_insert = rows_per_insert(db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER))

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = connect(self.path, timeout=30)
            db.row_factory = sqlite3.Row
            self._local.db = db
        return db

    def insert(self, records: Sequence[dict[str, Any]]) -> None:
        """One transaction, in as few statements as ``_chunks`` allows. The sqlite3 module lets go of the
        interpreter lock for each statement's step and must wait to take it back from the event loop's thread,
        which it then forces to yield: with ``executemany``'s step a row, those hand-overs cost the gateway more
        CPU than the inserts themselves."""
        values = row_values(records)
        width, start = len(COLUMNS), 0
        with self._db() as db:  # one transaction
            for count in _chunks(len(records), self._rows_per_insert):
                db.execute(_insert_rows(count, "?", "INSERT OR IGNORE", ""),
                           values[start * width:(start + count) * width])
                start += count

    def _run(self, sql: str, args: Sequence[Any]) -> list[dict[str, Any]]:
        cursor = self._tuples(sql, args)
        try:
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        finally:
            cursor.close()

    def _stream(self, sql: str, args: Sequence[Any], chunk: int) -> Generator[list[dict[str, Any]], None, None]:
        cursor = self._tuples(sql, args)
        try:
            names = [d[0] for d in cursor.description]
            while rows := cursor.fetchmany(chunk):
                yield [dict(zip(names, row, strict=True)) for row in rows]
        finally:
            cursor.close()

    def _tuples(self, sql: str, args: Sequence[Any]) -> sqlite3.Cursor:
        """A cursor whose rows are plain tuples: a report reads hundreds of thousands, and a sqlite3.Row is an
        object the interpreter's collector tracks (a tuple of plain values it stops tracking at its first pass),
        so rows in hand at each collection were kept for full ones, each walking the whole heap."""
        cursor = self._db().cursor()
        cursor.row_factory = None
        return cursor.execute(sql, args)

    def _write(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self._db() as db:
            db.executemany(sql, rows)

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None


class PostgresLedger(_Sql):
    """A ``ledger`` table in PostgreSQL, one connection per thread (psycopg 3, autocommit off per batch)."""

    mark = "%s"

    def __init__(self, dsn: str) -> None:
        import psycopg

        self._psycopg = psycopg
        self.dsn = dsn
        self._local = threading.local()

    def _db(self) -> Any:
        """This thread's connection; the first one made creates the table (so a gateway starts while the
        database is down, and spools until it is back)."""
        db = getattr(self._local, "db", None)
        if db is None or db.closed:
            from psycopg.rows import dict_row

            db = self._psycopg.connect(self.dsn, autocommit=True, row_factory=dict_row, connect_timeout=5)
            columns = ", ".join(f"{name} {types[1]}" for name, types in COLUMNS.items())
            with db.transaction():
                db.execute("SELECT pg_advisory_xact_lock(7453)")  # replicas starting together
                db.execute(f"CREATE TABLE IF NOT EXISTS ledger ({columns})")
                db.execute("CREATE INDEX IF NOT EXISTS ledger_time ON ledger (time, id)")
                db.execute("CREATE INDEX IF NOT EXISTS ledger_tenant_time ON ledger (tenant, time)")
                for name in ADDED:
                    db.execute(f"ALTER TABLE ledger ADD COLUMN IF NOT EXISTS {name} {COLUMNS[name][1]}")
                db.execute(PRESENCE)
                db.execute(PRESENCE_INDEX)
                db.execute(CLOSES)
            self._local.db = db
        return db

    def insert(self, records: Sequence[dict[str, Any]]) -> None:
        """One transaction in as few statements as ``_chunks`` allows (psycopg, too, lets go of the interpreter
        lock for each statement it sends: ``SqliteLedger.insert``)."""
        values = row_values(records)
        width, start = len(COLUMNS), 0
        for column in BOOLEAN:  # PostgreSQL's boolean columns take no integers (a record read back from SQLite)
            at = list(COLUMNS).index(column)
            values[at::width] = [bool(value) for value in values[at::width]]
        db = self._db()
        try:
            with db.transaction(), db.cursor() as cursor:
                for count in _chunks(len(records), rows_per_insert(POSTGRES_PARAMETERS)):
                    cursor.execute(_insert_rows(count, "%s", "INSERT", " ON CONFLICT (id) DO NOTHING"),
                                   values[start * width:(start + count) * width])
                    start += count
        except self._psycopg.OperationalError:
            db.close()  # reconnect on the next call
            raise

    def _run(self, sql: str, args: Sequence[Any]) -> list[dict[str, Any]]:
        db = self._db()
        try:
            return list(db.execute(sql, args).fetchall())
        except self._psycopg.OperationalError:
            db.close()
            raise

    def _stream(self, sql: str, args: Sequence[Any], chunk: int) -> Generator[list[dict[str, Any]], None, None]:
        """A server-side cursor in a transaction of its own: PostgreSQL sends ``chunk`` rows per fetch (a
        client-side cursor would bring every row over before the first)."""
        db = self._db()
        try:
            with db.transaction(), db.cursor(name="tollgate_stream") as cursor:
                cursor.execute(sql, args)
                while rows := cursor.fetchmany(chunk):
                    yield list(rows)
        except self._psycopg.OperationalError:
            db.close()
            raise

    def _write(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        db = self._db()
        try:
            with db.transaction(), db.cursor() as cursor:
                cursor.executemany(sql, rows)
        except self._psycopg.OperationalError:
            db.close()
            raise

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()


def _plain(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Groups with requests, their sums as plain numbers (PostgreSQL sums integers as numeric: Decimal)."""
    return [{k: int(v) if isinstance(v, Decimal) else v for k, v in row.items()} for row in rows if row["requests"]]


_COLUMN_VALUES = operator.itemgetter(*COLUMNS)


def row_values(records: Sequence[dict[str, Any]]) -> list[Any]:
    """The records' values, one row after another in ``COLUMNS`` order: a column a record lacks is NULL (a record
    spooled before the column was added). A record is read by one C call when it holds every column, as the
    writer's records do: the writer's thread reads some 26 values a record, for every request."""
    try:
        return list(itertools.chain.from_iterable(map(_COLUMN_VALUES, records)))
    except KeyError:
        return [r.get(c) for r in records for c in COLUMNS]


def iter_all(store: LedgerStore, start: str, end: str, tenant: str | None, page: int = 2000,
             columns: Sequence[str] | None = None) -> Iterator[list[dict[str, Any]]]:
    """Every record in the range, page by page (keyset on time and id: nothing skipped, nothing twice);
    ``columns``: only those (with time and id)."""
    after: tuple[str, str] | None = None
    while True:
        rows = store.records(start, end, tenant, after, page, columns=columns)
        if not rows:
            return
        yield rows
        after = (rows[-1]["time"], rows[-1]["id"])
