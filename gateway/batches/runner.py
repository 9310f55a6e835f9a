"""Drives each active batch: validate its file, run its lines through the pipeline as class batch, finalize.

Lines go through ``pipeline.run`` exactly as live requests do (same auth view, policy, cache, scheduler and
accounting; in the ledger, as requests of the key that created the batch), in class ``batch``, so the
scheduler gives them only capacity no premium or standard request is waiting for. A line turned away for now
(``TryLater``: shed, rate limited, no healthy worker) waits its retry time and tries again without counting
as a failure; one that fails in a worker or the gateway is retried ``line_attempts`` times; any other outcome
(a bad line, a budget used up) is the line's answer. At most ``batches.max_inflight_lines`` lines are out at
once over all batches: enough to fill idle workers, few enough that they do not crowd the batch queue's bound.

Every finished line is checkpointed at once (BatchStore.finish_line), with its tokens as the ledger counts
them, which the batch object's ``usage`` sums. After a crash, ``start`` resumes every active batch and only
lines without a checkpoint run again.

Every gateway process runs lines: each claims a few at a time (as many as it has room for) with a lease
(``batches.claim_lease_s``) it renews every third of it, so processes sharing a store (the processes of one
host on SQLite, every replica on PostgreSQL) split a batch's lines and never run one line at the same time.
A process that dies leaves its claims to lapse after the lease (or to its successor: a process restarted on
the same host, data directory and process index has the same name and takes its claims back at start); one
that stops cleanly gives them back.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from gateway import pipeline
from gateway.batches import lines
from gateway.batches.store import ACTIVE, BatchRecord, BatchStore, new_id
from gateway.context import RequestContext
from gateway.endpoints import BY_PATH
from gateway.errors import GatewayError, KeyRevoked, TryLater, UpstreamFailed
from gateway.keys.model import key_id
from gateway.policy.loader import PolicySnapshot, TenantView
from gateway.runtime import Gateway
from gateway.sink import BufferSink

log = logging.getLogger("tollgate.batches")
MAX_RETRY_WAIT_S = 60.0
VALIDATION_TRIES = 2  # a file whose validation was cut short this often (a crash each time) fails
LINES_PER_INSERT = 2_000


class Gate:
    """At most ``limit`` lines out at once over all batches, shared between tenants: a free slot goes to the
    waiting tenant that holds the fewest, so a tenant with ten batches of 200 lines does not take ten times the
    share of one with a single batch (measured before: 4% of the lines, 3.5x slower). FIFO inside a tenant.
    The limit is read on each entry and release, so a policy reload applies."""

    def __init__(self) -> None:
        self.used = 0
        self.held: collections.Counter[str] = collections.Counter()
        self._waiting: dict[str, collections.deque[asyncio.Future[None]]] = {}

    @contextlib.asynccontextmanager
    async def slot(self, tenant: str, limit: int) -> AsyncIterator[None]:
        if self.used < limit and not self._waiting:
            self._take(tenant)
        else:
            turn = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(tenant, collections.deque()).append(turn)
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():  # granted as it was cancelled: pass the slot on
                    self._give(tenant, limit)
                else:
                    self._forget(tenant, turn)
                raise
        try:
            yield
        finally:
            self._give(tenant, limit)

    def _take(self, tenant: str) -> None:
        self.used += 1
        self.held[tenant] += 1

    def _give(self, tenant: str, limit: int) -> None:
        self.used -= 1
        self.held[tenant] -= 1
        if self.held[tenant] <= 0:
            del self.held[tenant]
        while self.used < limit and self._waiting:
            fewest = min(self._waiting, key=lambda t: self.held.get(t, 0))
            queue = self._waiting[fewest]
            turn = queue.popleft()
            if not queue:
                del self._waiting[fewest]
            if not turn.done():
                self._take(fewest)
                turn.set_result(None)

    def _forget(self, tenant: str, turn: asyncio.Future[None]) -> None:
        queue = self._waiting.get(tenant)
        if queue is not None and turn in queue:
            queue.remove(turn)
            if not queue:
                del self._waiting[tenant]


SWEEP_S = 3600.0  # how often files past batches.file_ttl_s are deleted
POLL_S = 2.0  # how often a process looks for batches created or cancelled by the others, and for lapsed claims


class BatchRunner:
    def __init__(self, gw: Gateway, store: BatchStore, owner: str) -> None:
        """``owner``: this process's name on its claims, the same after a restart in its place."""
        self.gw = gw
        self.store = store
        self.owner = owner
        self.gate = Gate()
        self._drivers: dict[str, asyncio.Task[None]] = {}
        self._stops: dict[str, asyncio.Event] = {}
        self._background: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Resume every batch a previous run left active, then keep looking for new ones (in the background:
        the gateway starts, and serves live traffic, while the batch store is unreachable)."""
        loop = asyncio.get_running_loop()
        self._background = [loop.create_task(self._poll()), loop.create_task(self._renew())]

    async def _poll(self) -> None:
        released, failing, swept_at = False, False, 0.0
        while True:
            try:
                if not released:
                    await self.store.do(self.store.release, self.owner)  # what it held before a crash
                    released = True
                if time.monotonic() - swept_at >= SWEEP_S:
                    ttl = self.gw.store.current.policy.batches.file_ttl_s
                    if gone := await self.store.do(self.store.expire_files, time.time() - ttl):
                        log.info("%d batch files expired", gone)
                    swept_at = time.monotonic()
                for batch_id in await self.store.do(self.store.active_batches):
                    if batch_id not in self._drivers:
                        self.drive(batch_id)
                    else:
                        record = await self.store.do(self.store.get_batch, batch_id)
                        if record is not None and record.status == "cancelling":
                            self.cancel(batch_id)
                failing = False
            except Exception as exc:
                if not failing:  # once per outage; the batches wait, nothing is lost
                    log.error("batch store unreachable (%s); batches wait until it is back", exc)
                    failing = True
            await asyncio.sleep(POLL_S)

    async def _renew(self) -> None:
        """Keep this process's claims alive; a failed renewal is retried next time (a lease outlasts two)."""
        while True:
            lease_s = self.lease_s
            await asyncio.sleep(lease_s / 3)
            try:
                await self.store.do(self.store.renew, self.owner, lease_s)
            except Exception:
                log.exception("renewing batch line claims failed")

    @property
    def lease_s(self) -> float:
        return self.gw.store.current.policy.batches.claim_lease_s

    async def close(self) -> None:
        for task in self._background:
            task.cancel()
        tasks = list(self._drivers.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, *self._background, return_exceptions=True)
        try:
            await self.store.do(self.store.release, self.owner)  # the others take these lines at once
        except Exception:
            log.exception("giving back batch line claims failed; they lapse in %.0f s", self.lease_s)

    def drive(self, batch_id: str) -> None:
        """Take a batch to a final status, in the background."""
        if batch_id in self._drivers:
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
        while (record := await store.do(store.get_batch, batch_id)) is not None and record.status in ACTIVE:
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
        """Check the input file on a thread of its own (not the store's: other callers go on meanwhile), then
        record its lines a few thousand at a time. A file whose validation was cut short (the process died)
        is tried again, at most VALIDATION_TRIES times."""
        store, row = self.store, record.row
        if await store.do(store.get_file, record.tenant, row["input_file_id"]) is None:
            await store.do(store.fail_validation, record.id, [{
                "code": "file_not_found", "message": f"The input file {row['input_file_id']} no longer exists.",
                "param": "input_file_id", "line": None}])
            return
        tries = await store.do(store.begin_validation, record.id, self.owner, self.lease_s)
        if tries is None:  # another process is validating it
            await asyncio.sleep(POLL_S)
            return
        if tries > VALIDATION_TRIES:
            await store.do(store.fail_validation, record.id, [{
                "code": "validation_failed", "param": "input_file_id", "line": None,
                "message": f"Validating this file was cut short {VALIDATION_TRIES} times; it is not tried again."}])
            return
        policy = self.gw.store.current.policy
        limits = (row["endpoint"], policy.batches.max_lines, policy.server.max_body_bytes)
        async with self._input(row["input_file_id"]) as path:
            total, errors = await asyncio.to_thread(lines.check, path, *limits)
            if errors:
                await store.do(store.fail_validation, record.id, errors)
                return
            found = lines.valid_lines(path, *limits)
            while chunk := await asyncio.to_thread(_take, found, LINES_PER_INSERT):
                await store.do(store.add_lines, record.id, self.owner, chunk)
        await store.do(store.start_lines, record.id, self.owner, total)

    @contextlib.asynccontextmanager
    async def _input(self, file_id: str) -> AsyncIterator[Path]:
        """The input file as a path on this host: where it lives, or a copy made chunk by chunk (each read is
        one store call, so a large file does not hold the store's thread)."""
        store = self.store
        local = await store.do(store.local_file, file_id)
        if local is not None:
            yield local
            return
        copy = store.files_dir / (new_id("input-") + ".part")
        try:
            with copy.open("wb") as out:
                index = 0
                while (chunk := await store.do(store.read_chunk, file_id, index)) is not None:
                    await asyncio.to_thread(out.write, chunk)
                    index += 1
            yield copy
        finally:
            copy.unlink(missing_ok=True)

    async def _run_lines(self, record: BatchRecord) -> str:
        """Claim and run unfinished lines until none is left; say why it stopped: completed, cancelled or
        expired. Lines other processes hold are waited for (their claims lapse if those processes died)."""
        store, stop = self.store, self._stops[record.id]
        running: set[asyncio.Task[None]] = set()
        stopped = asyncio.create_task(stop.wait())
        try:
            while not stop.is_set():
                left = record.row["expires_at"] - time.time()
                if left <= 0:
                    return "expired"
                room = self.gw.store.current.policy.batches.max_inflight_lines - len(running)
                if room > 0:
                    for line_no, custom_id in await store.do(store.claim, record.id, self.owner, room,
                                                             self.lease_s):
                        running.add(asyncio.create_task(self._line(record, line_no, custom_id)))
                if not running and await store.do(store.unfinished, record.id) == 0:
                    return "completed"
                done, _ = await asyncio.wait({*running, stopped}, timeout=min(POLL_S, left),
                                             return_when=asyncio.FIRST_COMPLETED)
                running -= done
                for task in done - {stopped}:
                    if not task.cancelled() and task.exception() is not None:
                        log.error("batch %s: a line failed: %r", record.id, task.exception())
            return "cancelled"
        finally:
            for task in (*running, stopped):
                task.cancel()
            await asyncio.gather(*running, stopped, return_exceptions=True)

    async def _line(self, record: BatchRecord, line_no: int, custom_id: str) -> None:
        """One claimed line to its checkpoint, waiting out sheds and retrying worker failures."""
        failures = 0
        while True:
            limit = self.gw.store.current.policy.batches.max_inflight_lines
            async with self.gate.slot(record.tenant, limit):
                retry_in, failed = await self._run_line(record, line_no, custom_id, failures)
            if retry_in is None:
                return
            failures += failed
            await asyncio.sleep(retry_in)

    async def _run_line(self, record: BatchRecord, line_no: int, custom_id: str,
                        failures: int) -> tuple[float | None, int]:
        """Run one line; checkpoint its answer, or say when to retry it (and whether this try failed)."""
        gw, store = self.gw, self.store
        snapshot = gw.store.current
        if snapshot.tenants.get(record.tenant) is None:
            await store.do(store.finish_line, record.id, line_no, False, lines.unanswered(
                custom_id, "tenant_removed", f"The tenant '{record.tenant}' is no longer in the policy."))
            return None, 0
        try:
            tenant = await self._submitter(snapshot, record)
        except KeyRevoked as exc:
            await store.do(store.finish_line, record.id, line_no, False,
                           lines.unanswered(custom_id, exc.code, exc.message))
            return None, 0
        except TryLater as exc:  # the key store is down: the line waits
            return min(max(exc.retry_after_s, 0.1), MAX_RETRY_WAIT_S), 0
        body = await store.do(store.body, record.id, line_no)
        ctx = RequestContext(f"{record.id}-{line_no}", snapshot, BY_PATH[record.row["endpoint"]])
        ctx.tenant, ctx.batch, ctx.key_id = tenant, record.id, record.key_id  # the key that created the batch
        sink = BufferSink()
        async with pipeline.Lifecycle(gw, ctx, sink):
            await pipeline.run(gw, ctx, body, sink, b"", "batch")
        error = sink.error
        if isinstance(error, TryLater):  # no room now (shed, rate limited, a store down): not the line's failure
            return min(max(error.retry_after_s, 0.1), MAX_RETRY_WAIT_S), 0
        failed = error is not None and type(error) in (GatewayError, UpstreamFailed)  # the gateway or a worker
        if failed and failures + 1 < snapshot.policy.batches.line_attempts:
            return min(2.0 ** failures, MAX_RETRY_WAIT_S), 1
        status = sink.status or 500
        answer = lines.parse_answer(sink.body)
        usage = lines.Usage.of(ctx.prompt_tokens, ctx.cached_tokens, ctx.completion_tokens, answer)
        await store.do(store.finish_line, record.id, line_no, 200 <= status < 300,
                       lines.answered(custom_id, status, ctx.request_id, answer), usage)
        return None, 0


    async def _submitter(self, snapshot: PolicySnapshot, record: BatchRecord) -> TenantView:
        """The tenant as the key that created the batch sees it now: a line is admitted as that key's request
        (its models, budget and rate limit beside the tenant's), and not at all once the key is revoked or
        expired (``KeyRevoked``). A rotated key's lines run under its live successor. A batch from before
        keys were recorded runs as its tenant."""
        tenant = snapshot.tenants[record.tenant]
        kid = record.key_id
        if kid is None:
            return tenant
        if any(key_id(k.removeprefix("sha256:")) == kid for k in snapshot.policy.tenants[record.tenant].keys):
            return tenant  # a key the policy lists: its tenant's view
        keys = self.gw.keys
        view = keys.holder(snapshot, kid, time.time())
        if view is None:  # made on another replica since this one's last poll, or gone from the policy
            await keys.refresh()
            view = keys.holder(snapshot, kid, time.time())
        if view is None:
            raise KeyRevoked(f"The API key {kid} that submitted this batch is no longer in the policy.")
        return view


def _take(lines_: Iterator[lines.Line], n: int) -> list[lines.Line]:
    return [line for _, line in zip(range(n), lines_, strict=False)]
