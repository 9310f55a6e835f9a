"""The response cache: exact layer, then semantic layer; lookup, storing, replica sync, purge.

Failure rule: the cache may only ever make a request faster. A lookup that errors or runs past its
timeout is a bypass; a store that is down is skipped for a second at a time (so requests do not each
pay the timeout) and writes made meanwhile wait in a bounded buffer until it is back.

Memory rule: what this process holds for the cache is bounded in bytes, per tenant and in total
(``max_tenant_bytes``, ``max_bytes``): the in-process store's entries, or on Redis this replica's index
and its buffered writes. An answer over ``max_entry_bytes`` is served but never stored.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import re
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from gateway.cache import embedder as embedders
from gateway.cache.audit import Audits, Sample, Verdict
from gateway.cache.bounds import Footprint
from gateway.cache.embedder import Embedder
from gateway.cache.index import SEARCH_ON_LOOP, VectorIndex
from gateway.cache.keys import CacheKey
from gateway.cache.store import CacheStore, Entry, MemoryStore, RedisStore, StoreUnavailable
from gateway.cache.verifier import verify
from gateway.endpoints.base import Endpoint
from gateway.ops.metrics import GatewayMetrics
from gateway.policy.schema import CachePolicy

T = TypeVar("T")
_HANGUL = re.compile("[\uac00-\ud7a3]")
log = logging.getLogger("tollgate.cache")
_PENDING_MAX = 1000
_QUIET_S = 1.0  # stored answers are embedded only after lookups have paused this long
_PARSE_ON_LOOP_BYTES = 16_384
# The exact layer's store read is on every cacheable request's path: a slower one is a bypass. The bound
# on what the cache may add to TTFT (p99 15 ms) with room for the loop's own delays.
EXACT_BUDGET_S = 0.010
_AUDIT_CHARS = 400


@dataclass(slots=True)
class Lookup:
    """What a cache lookup found. ``result``: hit-exact | hit-semantic | miss | bypass | off, where ``off`` means
    the exact layer missed and the audit turned this scope's semantic layer off (``reason`` "audit")."""

    result: str
    entry: Entry | None = None
    similarity: float | None = None
    vector: np.ndarray | None = None
    reason: str | None = None

    @property
    def hit(self) -> bool:
        return self.entry is not None


class SemanticCache:
    def __init__(self, spec: CachePolicy, metrics: GatewayMetrics, store: CacheStore | None = None,
                 embedder: Embedder | None = None) -> None:
        """``store``: shared by replicas (RedisStore on the process's one client) or this process's own."""
        self.spec = spec
        self.metrics = metrics
        self.store: CacheStore = store if store is not None else MemoryStore()
        self.embedder = embedder
        self.index: VectorIndex | None = None
        self._down_until = 0.0
        self._last_warning = 0.0
        # Writes made while the store is down, one per exact request (the latest), replayed when it is back.
        self._pending: collections.OrderedDict[str, Entry] = collections.OrderedDict()
        self._pending_held = Footprint()
        self._tasks: set[asyncio.Task[None]] = set()
        self._sync: asyncio.Task[None] | None = None
        # ids of stored answers waiting to be embedded for the semantic layer (exact hits work meanwhile)
        self._unindexed: collections.deque[str] = collections.deque(maxlen=10_000)
        self._quiet_indexer_wakeup = asyncio.Event()
        self._last_semantic_lookup = 0.0
        self._indexer: asyncio.Task[None] | None = None
        self.audits = Audits()
        self.audit_wakeup = asyncio.Event()

    def same_backend(self, spec: CachePolicy) -> bool:
        return (spec.batch_max, spec.batch_wait_ms, spec.embedder) == (self.spec.batch_max, self.spec.batch_wait_ms,
                                                                        self.spec.embedder)

    async def start(self) -> None:
        if self.embedder is None:
            self.embedder = await asyncio.to_thread(embedders.build, self.spec.embedder, self.spec.batch_max,
                                                    self.spec.batch_wait_ms / 1000)
        self.index = VectorIndex(self.embedder.dim, self.spec.hnsw_above)
        self._count_held()
        self._indexer = asyncio.get_running_loop().create_task(self._index_when_quiet())
        if self.store.shared:
            self._sync = asyncio.get_running_loop().create_task(self._follow())
        else:
            self.metrics.cache_store_up.set(1)

    async def close(self) -> None:
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        for task in (self._sync, self._indexer):
            if task is not None:
                task.cancel()
        await self.store.close()
        if self.embedder is not None:
            self.embedder.close()

    # -- the store, guarded -----------------------------------------------------------------------------

    async def _guarded(self, call: Coroutine[Any, Any, T]) -> T:
        if time.monotonic() < self._down_until:
            call.close()
            raise StoreUnavailable("recently unreachable")
        try:
            result = await call
        except StoreUnavailable as exc:
            self._mark_down(str(exc))
            raise
        self.metrics.cache_store_up.set(1)
        return result

    def _mark_down(self, why: str) -> None:
        self._down_until = time.monotonic() + 1.0
        self.metrics.cache_store_up.set(0)
        if time.monotonic() - self._last_warning > 10:
            self._last_warning = time.monotonic()
            log.warning("cache store unreachable, bypassing the cache: %s", why)

    # -- lookup -----------------------------------------------------------------------------------------

    async def lookup(self, key: CacheKey, spec: CachePolicy) -> Lookup:
        """Both layers, one after the other: for callers that nobody waits on (the pipeline races the semantic
        layer against the answer instead)."""
        found = await self.lookup_exact(key)
        if found.hit or found.result == "bypass" or not key.semantic:
            return found
        return await self.lookup_semantic(key, spec)

    async def lookup_exact(self, key: CacheKey) -> Lookup:
        """The exact layer: one store read, on the request's path, bounded by ``EXACT_BUDGET_S``."""
        try:
            async with asyncio.timeout(EXACT_BUDGET_S):
                entry = await self._guarded(self.store.get_exact(key.exact))
        except StoreUnavailable:
            return Lookup("bypass", reason="store_down")
        except TimeoutError:
            return Lookup("bypass", reason="timeout")
        except Exception:  # the cache may only make a request faster, never fail it
            log.exception("cache lookup failed; bypassing")
            return Lookup("bypass", reason="error")
        if entry is not None and self._fits(entry, key):
            self._touch(entry)
            return Lookup("hit-exact", entry, 1.0)
        if not key.semantic:
            return Lookup("miss", reason=f"language:{key.language}")
        if self.audits.off(key.scope):
            return Lookup("off", reason="audit")
        return Lookup("miss")

    async def lookup_semantic(self, key: CacheKey, spec: CachePolicy) -> Lookup:
        """The semantic layer, which races the request's dispatch (the pipeline serves its hit only if it comes
        before the worker's answer does): never raises, gives up after ``lookup_timeout_ms``. A miss carries the
        question's vector, for storing the answer without embedding it again."""
        try:
            async with asyncio.timeout(spec.lookup_timeout_ms / 1000):
                return await self._semantic(key, spec)
        except StoreUnavailable:
            return Lookup("bypass", reason="store_down")
        except TimeoutError:
            return Lookup("bypass", reason="timeout")
        except Exception:
            log.exception("semantic cache lookup failed; bypassing")
            return Lookup("bypass", reason="error")

    def _fits(self, entry: Entry, key: CacheKey) -> bool:
        """An answer fits if it is no longer than asked, and one cut at max_tokens was cut at the same one."""
        return entry.scope == key.scope and entry.completion_tokens <= key.max_tokens and (
            entry.finish_reason != "length" or entry.max_tokens == key.max_tokens)

    def expected_semantic_s(self, key: CacheKey, spec: CachePolicy) -> float | None:
        """How long a semantic lookup started now should take, or None if it cannot hit (its scope holds no
        vector, or the audit turned its semantic layer off): then nothing is worth waiting for."""
        if self.index is None or self.embedder is None or not self.index.size(key.scope) or \
                self.threshold(key, spec) is None:
            return None
        return self.embedder.expected_wait_s()

    def threshold(self, key: CacheKey, spec: CachePolicy) -> float | None:
        """The cosine a semantic hit needs in this key's scope (raised by the audit), or None: its semantic layer
        is off."""
        return self.audits.threshold(key.scope, spec.threshold)

    async def _semantic(self, key: CacheKey, spec: CachePolicy) -> Lookup:
        assert self.index is not None and self.embedder is not None
        threshold = self.threshold(key, spec)
        if threshold is None:
            return Lookup("off", reason="audit")
        self._last_semantic_lookup = time.monotonic()
        if self.embedder.expected_wait_s() > spec.lookup_timeout_ms / 1000 * 0.8:
            # Shed the cache's own work first: under a burst the vector would come after the answer anyway;
            # the answer is embedded for storing once things are quiet.
            return Lookup("bypass", reason="embedder_busy")
        vector = await self.embedder.embed(key.text)
        index = self.index
        if index.size(key.scope) > SEARCH_ON_LOOP:
            candidates = await asyncio.to_thread(index.search, key.scope, vector)
        else:
            candidates = index.search(key.scope, vector)
        now = time.time()
        for entry_id, score in candidates:
            if score < threshold:
                break
            if index.expires.get(entry_id, 0) <= now:
                index.remove(entry_id)
                continue
            entry = await self._guarded(self.store.get(entry_id))
            if entry is None:
                index.remove(entry_id)  # expired or evicted elsewhere
                continue
            if spec.verifier:  # a Korean question is read by morphology (gateway.cache.roles): off the loop
                korean = _HANGUL.search(key.text) or _HANGUL.search(entry.question)
                reason = await asyncio.to_thread(verify, key.text, entry.question) if korean else \
                    verify(key.text, entry.question)
                if reason is not None:
                    self.metrics.cache_rejections.labels(reason).inc()
                    continue
            if not self._fits(entry, key):
                continue
            return Lookup("hit-semantic", entry, score, vector)
        return Lookup("miss", vector=vector)

    def served(self, key: CacheKey, found: Lookup, body: dict[str, Any], spec: CachePolicy) -> None:
        """A semantic hit was served: it is used (kept longer under the byte bounds), and may be audited."""
        if found.entry is None or found.result != "hit-semantic":
            return
        self._touch(found.entry)
        if self.audits.consider(key, found.entry, found.similarity or 0.0, body, spec.audit):
            self.audit_wakeup.set()

    # -- audit ------------------------------------------------------------------------------------------

    async def next_sample(self) -> Sample:
        """The next served hit to audit (``gateway.batches.audit`` asks it again)."""
        while not self.audits.pending:
            self.audit_wakeup.clear()
            await self.audit_wakeup.wait()
        return self.audits.pending.popleft()

    async def agreement(self, served: str, fresh: str) -> float:
        """Cosine between two answers' embeddings (their openings: what an answer is about shows there, and a
        whole answer costs the embedder ~2 ms a token), as work that waits for lookups."""
        if served.strip() == fresh.strip():
            return 1.0
        assert self.embedder is not None
        a = await self.embedder.embed(served[:_AUDIT_CHARS], embedders.BACKGROUND)
        b = await self.embedder.embed(fresh[:_AUDIT_CHARS], embedders.BACKGROUND)
        return float(np.dot(a, b))

    async def audited(self, sample: Sample, agreed: bool, stale: bool, spec: CachePolicy,
                      inconclusive: bool = False) -> Verdict:
        """Count one audit; a wrong or stale entry is purged (an inconclusive audit keeps it)."""
        verdict = self.audits.judge(sample, agreed, spec.threshold, spec.audit, stale, inconclusive)
        state = self.audits.scopes[sample.scope]
        labels = (sample.tenant, sample.model, sample.scope[:16])
        self.metrics.child(self.metrics.cache_audits, sample.tenant, sample.model, verdict.value).inc()
        self.metrics.child(self.metrics.cache_audit_upper, *labels).set(state.upper_bound(spec.audit.confidence))
        self.metrics.child(self.metrics.cache_audit_threshold, *labels).set(
            self.audits.threshold(sample.scope, spec.threshold) or 1.0)
        if not agreed and not inconclusive:
            try:
                await self.purge(entry_id=sample.entry_id)
            except StoreUnavailable:
                log.warning("cache audit: could not purge a wrong entry (store down); it stays until its TTL")
        return verdict

    def _touch(self, entry: Entry) -> None:
        assert self.index is not None
        self.index.touch(entry.id)
        self._background(self._guarded(self.store.touch(entry)))

    # -- storing ----------------------------------------------------------------------------------------

    def remember(self, key: CacheKey, endpoint: Endpoint, payload: bytes, streamed: bool,
                 semantic: asyncio.Future[Lookup] | None, spec: CachePolicy) -> None:
        """Store a complete answer in the background (the client already has it), with the question's vector
        from its semantic lookup (``semantic``, which may still be running) when that had one."""
        self._background(self._remember(key, endpoint, payload, streamed, semantic, spec))

    async def _remember(self, key: CacheKey, endpoint: Endpoint, payload: bytes, streamed: bool,
                        semantic: asyncio.Future[Lookup] | None, spec: CachePolicy) -> None:
        vector = None
        if semantic is not None:
            await asyncio.wait({semantic})  # bounded by the lookup's own timeout; it never raises
            vector = None if semantic.cancelled() else semantic.result().vector
        if not streamed and len(payload) > spec.max_entry_bytes:  # the answer is most of it: not worth parsing
            self.metrics.cache_not_stored.labels("too_large").inc()
            return
        parse = endpoint.answer_from_sse if streamed else endpoint.answer_from_json
        try:
            # a thread hop costs more than parsing a short answer (tens of microseconds) on the loop
            parsed = parse(payload) if len(payload) <= _PARSE_ON_LOOP_BYTES else await asyncio.to_thread(
                parse, payload)
        except ValueError:
            return
        if parsed is None:
            return
        text, finish, usage = parsed
        if finish not in ("stop", "length"):
            return
        entry = Entry(tenant=key.tenant, model=key.model, endpoint=endpoint.name, scope=key.scope, exact=key.exact,
                      question=key.text, answer=text, finish_reason=finish,
                      prompt_tokens=int(usage.get("prompt_tokens") or 0),
                      completion_tokens=int(usage.get("completion_tokens") or 0), max_tokens=key.max_tokens,
                      expires=time.time() + spec.ttl_s, vector=vector)
        if await self._put(entry, spec) and vector is None and key.semantic:
            # no lookup embedded it (bypassed): index it once things are quiet
            self._unindexed.append(entry.id)
            self._quiet_indexer_wakeup.set()

    async def _index_when_quiet(self) -> None:
        """Embed stored answers that no lookup embedded, one at a time, only after lookups have paused for
        _QUIET_S: embedding to store is optional work, and during a burst the model's time (and on a small
        machine, the CPU) belongs to lookups and requests. Measured: embedding every stored answer during a
        2,000-request burst cost the gateway ~25% of its throughput."""
        assert self.embedder is not None
        while True:
            await self._quiet_indexer_wakeup.wait()
            while self._unindexed:
                quiet_for = time.monotonic() - self._last_semantic_lookup
                if quiet_for < _QUIET_S or self.embedder.expected_wait_s() > 0.01:
                    await asyncio.sleep(max(0.05, _QUIET_S - quiet_for))
                    continue
                entry_id = self._unindexed.popleft()
                try:
                    entry = await self._guarded(self.store.get(entry_id))
                    if entry is not None:  # evicted or expired meanwhile, it is not stored again
                        vector = await self.embedder.embed(entry.question, embedders.BACKGROUND)
                        await self._put(dataclasses.replace(entry, vector=vector), self.spec)
                except StoreUnavailable:
                    continue
                except Exception:  # the cache may only make things faster; try the next one
                    log.exception("indexing a stored answer failed")
            self._quiet_indexer_wakeup.clear()

    async def _put(self, entry: Entry, spec: CachePolicy) -> bool:
        """Store an entry (or buffer it while the store is down); False if it is too large to keep."""
        assert self.index is not None
        if entry.held_bytes() > spec.max_entry_bytes:
            self.metrics.cache_not_stored.labels("too_large").inc()
            return False
        try:
            evicted = await self._guarded(self.store.put(entry, spec))
        except StoreUnavailable:
            self._buffer(entry, spec)
            self.metrics.cache_store_errors.inc()
            return True
        for entry_id in evicted:
            self.index.remove(entry_id)
        if entry.vector is not None:
            self.index.add(entry.id, entry.scope, entry.vector, entry.expires, entry.tenant, spec.max_tenant_bytes,
                           spec.max_bytes)
        self.metrics.cache_entries.set(len(self.index))
        self._count_held()
        return True

    def _buffer(self, entry: Entry, spec: CachePolicy) -> None:
        """Keep a write for when the store is back, within what the index leaves of the byte bounds."""
        assert self.index is not None
        self._pending_held.remove(entry.exact)
        self._pending.pop(entry.exact, None)
        self._pending[entry.exact] = entry
        room_tenant = spec.max_tenant_bytes - self.index.held.tenant_bytes(entry.tenant)
        room = spec.max_bytes - self.index.held.total
        for exact in self._pending_held.add(entry.exact, entry.tenant, entry.held_bytes(), room_tenant, room):
            self._pending.pop(exact, None)
        if len(self._pending) > _PENDING_MAX:
            self._pending_held.remove(self._pending.popitem(last=False)[0])
        self._count_held()

    def _count_held(self) -> None:
        """Bytes this process holds for the cache: the in-process store's entries count their index share,
        a shared store's live in Redis and this replica holds their vectors."""
        assert self.index is not None
        index = self.index.held.total if self.store.shared else 0
        self.metrics.cache_bytes.set(self.store.held + index + self._pending_held.total)

    async def flush_pending(self) -> None:
        while self._pending:
            exact, entry = self._pending.popitem(last=False)
            self._pending_held.remove(exact)
            if entry.alive():
                await self._put(entry, self.spec)
                if time.monotonic() < self._down_until:
                    return
        self._count_held()

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(_forget(self._tasks))

    # -- admin ------------------------------------------------------------------------------------------

    async def purge(self, tenant: str | None = None, model: str | None = None, entry_id: str | None = None) -> int:
        assert self.index is not None
        ids = [entry_id] if entry_id else await self._guarded(self.store.select(tenant, model))
        removed = await self._guarded(self.store.delete(ids))
        for i in ids:
            self.index.remove(i)
        self.metrics.cache_entries.set(len(self.index))
        self._count_held()
        return removed

    # -- replicas ---------------------------------------------------------------------------------------

    async def _follow(self) -> None:
        """Rebuild this replica's index from the shared store, then follow its stream of inserts/deletes."""
        assert isinstance(self.store, RedisStore) and self.embedder is not None
        while True:
            try:
                cursor = await self.store.last_event_id()
                fresh = VectorIndex(self.embedder.dim, self.spec.hnsw_above)
                async for entry in self.store.scan():
                    if entry.vector is not None:
                        fresh.add(entry.id, entry.scope, entry.vector, entry.expires, entry.tenant,
                                  self.spec.max_tenant_bytes, self.spec.max_bytes)
                self.index = fresh
                self.metrics.cache_entries.set(len(fresh))
                self._count_held()
                self._down_until = 0.0
                self.metrics.cache_store_up.set(1)
                log.info("cache index rebuilt from the shared store: %d entries", len(fresh))
                await self.flush_pending()
                while True:
                    events, cursor = await self.store.events(cursor, block_ms=1000)
                    for op, entry_id in events:
                        if op == "del":
                            self.index.remove(entry_id)
                        elif entry_id not in self.index:
                            added = await self.store.get(entry_id)
                            if added is not None and added.vector is not None:
                                self.index.add(added.id, added.scope, added.vector, added.expires, added.tenant,
                                               self.spec.max_tenant_bytes, self.spec.max_bytes)
                    if events:
                        self.metrics.cache_entries.set(len(self.index))
                        self._count_held()
                    if self._pending:
                        await self.flush_pending()
            except StoreUnavailable as exc:
                self._mark_down(str(exc))
                await asyncio.sleep(1.0)


def _forget(tasks: set[asyncio.Task[None]]) -> Callable[[asyncio.Task[None]], None]:
    def done(task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and not isinstance(task.exception(),
                                                                                     StoreUnavailable):
            log.error("cache background task failed", exc_info=task.exception())
    return done
