"""Drives each active batch: validate its file, run its lines through the pipeline as class batch, finalize.

Lines go through ``pipeline.run`` exactly as live requests do (same auth view, policy, cache, scheduler and
accounting), in class ``batch``, so the scheduler gives them only capacity no premium or standard request
is waiting for. A line the scheduler sheds (429/503) waits its Retry-After and tries again without counting
as a failure; one that fails in a worker (5xx) is retried ``line_attempts`` times. At most
``batches.max_inflight_lines`` lines are out at once over all batches: enough to fill idle workers, few
enough that they do not crowd the batch queue's bound.

Every finished line is checkpointed at once (BatchStore.finish_line). After a crash, ``start`` resumes
every active batch and only lines without a checkpoint run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from gateway import accounting, pipeline
from gateway.batches import lines
from gateway.batches.store import BatchRecord, BatchStore
from gateway.context import RequestContext
from gateway.runtime import Gateway
from gateway.sink import BufferSink

log = logging.getLogger("tollgate.batches")
ENDPOINT_NAMES = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
SHED = (429, 503)  # the gateway had no room: wait and retry, not a failure of the line
MAX_RETRY_WAIT_S = 60.0


class Gate:
    """At most ``limit()`` holders at once; the limit is read on each entry, so a policy reload applies."""

    def __init__(self) -> None:
        self.used = 0
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def slot(self, limit: int) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: self.used < limit)
            self.used += 1
        try:
            yield
        finally:
            self.used -= 1
            async with self._changed:
                self._changed.notify()


POLL_S = 2.0  # how often the line-running process looks for batches created or cancelled by the others


class BatchRunner:
    """``runs_lines``: this process runs batch lines (one process per data directory does: process 0 under
    `tollgate serve --workers N`); the others only serve the API, and the runner picks up what they create or
    cancel from the store."""

    def __init__(self, gw: Gateway, store: BatchStore, runs_lines: bool = True) -> None:
        self.gw = gw
        self.store = store
        self.runs_lines = runs_lines
        self.gate = Gate()
        self._drivers: dict[str, asyncio.Task[None]] = {}
        self._stops: dict[str, asyncio.Event] = {}
        self._poller: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Resume every batch a previous run left active, then keep looking for new ones."""
        if not self.runs_lines:
            return
        for batch_id in await self.store.do(self.store.active_batches):
            self.drive(batch_id)
        self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            try:
                for batch_id in await self.store.do(self.store.active_batches):
                    if batch_id not in self._drivers:
                        self.drive(batch_id)
                    else:
                        record = await self.store.do(self.store.get_batch, batch_id)
                        if record is not None and record.status == "cancelling":
                            self.cancel(batch_id)
            except Exception:
                log.exception("batch poll failed")

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        tasks = list(self._drivers.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def drive(self, batch_id: str) -> None:
        """Take a batch to a final status, in the background (in the process that runs lines)."""
        if batch_id in self._drivers or not self.runs_lines:
            return
        self._stops[batch_id] = asyncio.Event()
        task = asyncio.get_running_loop().create_task(self._drive(batch_id), name=f"batch {batch_id}")
        self._drivers[batch_id] = task

        def forget(_: asyncio.Task[None]) -> None:
            self._drivers.pop(batch_id, None)
            self._stops.pop(batch_id, None)
        task.add_done_callback(forget)

    def cancel(self, batch_id: str) -> None:
        """The batch was marked cancelling: stop its lines now (those in flight are abandoned, not recorded)."""
        if (stop := self._stops.get(batch_id)) is not None:
            stop.set()

    async def _drive(self, batch_id: str) -> None:
        while True:
            try:
                await self._advance(batch_id)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("batch %s: step failed; retrying in 5 s", batch_id)
                await asyncio.sleep(5)

    async def _advance(self, batch_id: str) -> None:
        store = self.store
        while (record := await store.do(store.get_batch, batch_id)) is not None and record.status in (
                "validating", "in_progress", "finalizing", "cancelling"):
            if record.status == "validating":
                await self._validate(record)
            elif record.status == "in_progress":
                ending = await self._run_lines(record)
                if ending == "completed":
                    await store.do(store.set_status, batch_id, "finalizing", ("in_progress",))
                elif ending == "expired":
                    await store.do(store.close_pending, batch_id, "batch_expired",
                                   "This request could not be executed before the completion window expired.")
                    await store.do(store.finalize, batch_id, "expired")
            elif record.status == "finalizing":
                await store.do(store.finalize, batch_id, "completed")
            else:  # cancelling
                await store.do(store.close_pending, batch_id, "batch_cancelled",
                               "The batch was cancelled before this request ran.")
                await store.do(store.finalize, batch_id, "cancelled")
        log.info("batch %s: %s", batch_id, record.status if record else "gone")

    async def _validate(self, record: BatchRecord) -> None:
        store, row = self.store, record.row
        if await store.do(store.get_file, record.tenant, row["input_file_id"]) is None:
            await store.do(store.fail_validation, record.id, [{
                "code": "file_not_found", "message": f"The input file {row['input_file_id']} no longer exists.",
                "param": "input_file_id", "line": None}])
            return
        max_lines = self.gw.store.current.policy.batches.max_lines
        found, errors = await asyncio.to_thread(lines.validate, store.file_path(row["input_file_id"]),
                                                row["endpoint"], max_lines)
        if errors:
            await store.do(store.fail_validation, record.id, errors)
        else:
            await store.do(store.start_lines, record.id, found)

    async def _run_lines(self, record: BatchRecord) -> str:
        """Run the unfinished lines; say why it stopped: completed, cancelled or expired."""
        work: asyncio.Queue[tuple[int, str, int]] = asyncio.Queue()
        for line_no, custom_id in await self.store.do(self.store.pending, record.id):
            work.put_nowait((line_no, custom_id, 0))
        stop = self._stops[record.id]
        workers = [asyncio.create_task(self._work(record, work))
                   for _ in range(min(work.qsize(), self.gw.store.current.policy.batches.max_inflight_lines))]
        joined, stopped = asyncio.create_task(work.join()), asyncio.create_task(stop.wait())
        try:
            await asyncio.wait((joined, stopped), timeout=max(0.0, record.row["expires_at"] - time.time()),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (*workers, joined, stopped):
                task.cancel()
            await asyncio.gather(*workers, joined, stopped, return_exceptions=True)
        if stop.is_set():
            return "cancelled"
        return "completed" if work.empty() and joined.done() and not joined.cancelled() else "expired"

    async def _work(self, record: BatchRecord, work: asyncio.Queue[tuple[int, str, int]]) -> None:
        while True:
            line_no, custom_id, failures = await work.get()
            try:
                async with self.gate.slot(self.gw.store.current.policy.batches.max_inflight_lines):
                    retry_in, failed = await self._run_line(record, line_no, custom_id, failures)
                if retry_in is not None:
                    await asyncio.sleep(retry_in)
                    work.put_nowait((line_no, custom_id, failures + failed))
            finally:
                work.task_done()

    async def _run_line(self, record: BatchRecord, line_no: int, custom_id: str,
                        failures: int) -> tuple[float | None, int]:
        """Run one line; checkpoint its answer, or say when to retry it (and whether this try failed)."""
        gw, store = self.gw, self.store
        snapshot = gw.store.current
        tenant = snapshot.tenants.get(record.tenant)
        if tenant is None:
            await store.do(store.finish_line, record.id, line_no, False, lines.unanswered(
                custom_id, "tenant_removed", f"The tenant '{record.tenant}' is no longer in the policy."))
            return None, 0
        body = await store.do(store.body, record.id, line_no)
        ctx = RequestContext(f"{record.id}-{line_no}", snapshot, ENDPOINT_NAMES[record.row["endpoint"]])
        ctx.tenant, ctx.batch = tenant, record.id
        sink = BufferSink()
        try:
            await pipeline.run(gw, ctx, body, sink, b"", "batch")
        finally:
            ctx.status = sink.status or 499
            accounting.finish(ctx, gw.metrics, gw.ledger, gw.spend)
        status = sink.status or 500
        if status in SHED:
            return _retry_after(sink), 0
        if status >= 500 and failures + 1 < snapshot.policy.batches.line_attempts:
            return min(2.0 ** failures, MAX_RETRY_WAIT_S), 1
        await store.do(store.finish_line, record.id, line_no, 200 <= status < 300,
                       lines.answered(custom_id, status, ctx.request_id, sink.body))
        return None, 0


def _retry_after(sink: BufferSink) -> float:
    value = sink.header(b"retry-after")
    try:
        return min(max(float(value or b"1"), 0.1), MAX_RETRY_WAIT_S)
    except ValueError:
        return 1.0
