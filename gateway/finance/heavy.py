"""Finance builds (statements, cost and GPU reports, the finance page): off the event loop, one at a time, their
bodies spooled.

A month's statement or report reads and sums up to hundreds of thousands of ledger records. ``build`` runs such
a build on the report thread (one thread, ``tollgate-report``), never on the event loop, so /healthz and the
requests' path keep answering while it runs. One build runs at a time in a process: a second one asked for while
one runs is refused at once, a 503 ``reports_busy`` with ``Retry-After: RETRY_AFTER_S``, rather than queued (each
waiting build would hold its caller's connection now and a build's worth of memory later). The gate is taken on
the event loop before the build is handed to the thread and given back by the thread when the build ends,
whatever became of the request meanwhile: a client that leaves frees the gate when the build it started ends,
not before, and never holds it after.

A thread shares the interpreter's lock (the GIL) with the event loop, so a build must not hold it long: while a
build runs the interpreter hands the lock over every SWITCH_S instead of every 5 ms, and the builds keep no
object per ledger record (gateway.finance.gpu holds a month's requests in arrays; the stores read rows as plain
tuples), so the interpreter's collector never walks hundreds of thousands of them with the lock held.

A build writes its body into a ``Spool`` (memory up to SPOOL_MEMORY bytes, then an unlinked temporary file), so
a large CSV or workbook is never held in memory whole; the edge's answer (gateway.http.responses.spooled) streams
the spool, read on a thread, after the gate is given back (a slow client holds no build). A store that fails
during a build is the ledger's 503 (``ledger_unavailable``, as gateway.http.reports.query answers), an outcome
the build raises passes as it is,
and anything else is the gateway's fault (a 500). Each build logs one line: what, how long, on which thread,
the bytes written and the process's RSS before and after. Why: docs/decisions/009-finance-reads-off-the-loop.md.
"""

from __future__ import annotations

import asyncio
import csv
import io
import logging
import os
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import orjson
import psycopg

from gateway.errors import GatewayError, InvalidRequest, Unavailable

log = logging.getLogger("tollgate.reports")
T = TypeVar("T")
RETRY_AFTER_S = 5
SPOOL_MEMORY = 1 << 20  # a body up to this many bytes stays in memory and is answered whole
# The most a build may write: a report past it (a year grouped by a tag per end user, say) is refused with a 400
# naming what to narrow, and its spool is dropped, so no build fills the disk. A month's statement over 200,000
# records and 20,000 users is under 10 MiB.
MAX_BODY_BYTES = 256 << 20
STORE_ERRORS: tuple[type[BaseException], ...] = (sqlite3.Error, psycopg.Error)
THREAD = "tollgate-report"
# The interpreter's switch interval while a build runs (5 ms otherwise): the event loop, woken by a socket while the
# build holds the GIL, waits at most this long for it, at each of the several times a request hands it over.
# Why, measured over 200,000 records: docs/decisions/009-finance-reads-off-the-loop.md.
SWITCH_S = 0.0005
_gate = threading.Lock()
_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD)


def busy() -> bool:
    """Whether a build runs now (in this process)."""
    return _gate.locked()


async def build(what: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on the report thread, alone: Unavailable (``reports_busy``, 503 with Retry-After) at once
    when another build runs. ``what`` names it in the log line."""
    if not _gate.acquire(blocking=False):
        raise Unavailable("Another statement or report is being built in this gateway process; retry in a few "
                          "seconds.", "reports_busy", retry_after_s=RETRY_AFTER_S)
    try:
        future = asyncio.get_running_loop().run_in_executor(_executor, _run, what, fn, args)
    except BaseException:
        _gate.release()
        raise
    return await future


def _run(what: str, fn: Callable[..., T], args: Sequence[Any]) -> T:
    """On the report thread: the build, with the GIL handed over every SWITCH_S, then the gate given back (it
    was taken for this build)."""
    began, rss = time.monotonic(), _rss_mib()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_S)
    try:
        out = fn(*args)
    except GatewayError:
        raise
    except STORE_ERRORS as exc:
        log.warning("ledger query failed: %s", exc)
        raise Unavailable("The ledger store is unreachable; retry shortly.", "ledger_unavailable") from None
    finally:
        sys.setswitchinterval(interval)
        _gate.release()
    size = out.size if isinstance(out, Spool) else None
    log.info("report built: %s in %.3f s on %s, %s bytes, rss %.0f -> %.0f MiB", what, time.monotonic() - began,
             threading.current_thread().name, "-" if size is None else size, rss, _rss_mib())
    return out


def _rss_mib() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return 0.0


class Spool:
    """A body as a build writes it: in memory up to SPOOL_MEMORY bytes, then in a temporary file (unlinked: it
    goes when closed, or with the process)."""

    def __init__(self) -> None:
        self.file = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY, mode="w+b")  # noqa: SIM115
        self.size = 0

    def write(self, data: bytes | str) -> None:
        """Append ``data``; raises ``InvalidRequest`` (``report_too_large``) past MAX_BODY_BYTES, the spool closed."""
        raw = data.encode() if isinstance(data, str) else data
        if self.size + len(raw) > MAX_BODY_BYTES:
            raise self._too_large()
        self.file.write(raw)
        self.size += len(raw)

    def writer(self) -> BoundedWriter:
        """The spool as a binary file for a library that writes a body itself (openpyxl's zip writer seeks back
        over what it wrote), held to the same bound."""
        return BoundedWriter(self)

    def _too_large(self) -> InvalidRequest:
        self.file.close()
        return InvalidRequest(f"This report would be over {MAX_BODY_BYTES >> 20} MiB: narrow its period, its "
                              "tenant or its grouping, or read the ledger's pages (GET /admin/ledger).",
                              "report_too_large")

    def csv(self, columns: Sequence[str], rows: Iterable[dict[str, Any]], batch: int = 2000) -> None:
        """A header and ``rows`` (cells as they are: format them first), ``batch`` rows per write."""
        text = io.StringIO()
        writer = csv.DictWriter(text, columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for n, row in enumerate(rows, start=1):
            writer.writerow(row)
            if n % batch == 0:
                self.write(text.getvalue())
                text.seek(0)
                text.truncate()
        self.write(text.getvalue())

    def json_list(self, rows: Iterable[Any], batch: int = 2000) -> None:
        """``rows`` as the items of a JSON array, brackets included, ``batch`` items per write."""
        self.write(b"[")
        parts: list[bytes] = []
        first = True
        for row in rows:
            parts.append(orjson.dumps(row))
            if len(parts) == batch:
                self.write((b"" if first else b",") + b",".join(parts))
                parts, first = [], False
        if parts:
            self.write((b"" if first else b",") + b",".join(parts))
        self.write(b"]")


class BoundedWriter(io.RawIOBase):
    """A write-only, seekable view of a ``Spool``'s file: a write that would end past MAX_BODY_BYTES raises as
    ``Spool.write`` does; ``Spool.size`` follows the furthest byte written."""

    def __init__(self, spool: Spool) -> None:
        self.spool = spool

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)
        end = self.spool.file.tell() + view.nbytes
        if end > MAX_BODY_BYTES:
            raise self.spool._too_large()
        self.spool.file.write(view)
        self.spool.size = max(self.spool.size, end)
        return view.nbytes

    def tell(self) -> int:
        return self.spool.file.tell()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.spool.file.seek(offset, whence)

    def flush(self) -> None:
        self.spool.file.flush()
