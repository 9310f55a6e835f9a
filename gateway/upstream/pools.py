"""Keep-alive pools: one client per pool (gateway.transport.http1), its workers, their scraper, and the in-flight
lease.

In-flight is counted in exactly one place, ``Lease``: taken when a request is sent to a worker and given
back when its answer is finished, on every exit (success, error, cancellation by a client that left,
timeout). Routing reads the count, and a retired pool drains on it, so a leak would starve a healthy
worker; nothing else writes it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from gateway.fleet.observe import MAX_METRICS_BYTES, scrape, scrape_forever
from gateway.fleet.worker import Worker
from gateway.ops.metrics import GatewayMetrics
from gateway.policy.schema import Pool
from gateway.routing.prefixes import PrefixIndex
from gateway.routing.profiles import router_for
from gateway.transport.http1 import Caps, Client


class Queues(Protocol):
    """A pool's queues as the scheduler shows them (gateway.scheduling.queues.QueueView): read, never written."""

    def depths(self) -> dict[str, int]: ...

    @property
    def queued(self) -> int: ...


class Scheduler(Protocol):
    """What the pools tell the scheduler (gateway.scheduling.controller.Controller), named here so that upstream
    need not import scheduling: where each pool's workers are, and when their metrics changed."""

    def track(self, pool: str, workers: list[Worker], spec: Pool) -> Queues: ...

    def untrack(self, pool: str) -> None: ...

    def metrics_changed(self, pool: str) -> None: ...


# The scrapes' answers: a head of a worker's size, a body the readers cap themselves (gateway.fleet.observe), and no
# deadline past the scrape's own timeout.
READ_CONNECTIONS = 4  # per worker, for stored responses read back; more wait, then 503 upstream_busy
SCRAPE_CAPS = Caps(head_bytes=16384, body_bytes=2 * MAX_METRICS_BYTES, deadline_s=60.0)


class UpstreamPool:
    """A pool's keep-alive client, its workers, and their scraper."""

    def __init__(self, name: str, spec: Pool, metrics: GatewayMetrics, scheduler: Scheduler,
                 index: PrefixIndex | None = None) -> None:
        """``index``: the prefix index of the pool this one replaces (what its kept workers still hold)."""
        self.name = name
        self.spec = spec
        self.metrics = metrics
        self.workers = [Worker(str(url).rstrip("/"), name) for url in spec.workers]
        # the scheduler counts against these workers from now on; a pool replacing one of the same name keeps the
        # queued and admitted requests it counted (the scheduler keeps them by name)
        self.queues = scheduler.track(name, self.workers, spec)
        self.router = router_for(spec.routing, self.workers, index)  # its profile, and the prefix index it keeps
        self._cache_epochs: dict[str, int] = {}  # worker URL -> its cache_epoch when the index last agreed
        self._scheduler = scheduler
        # connect: the wait for a free connection + TCP connect; read: the longest silence between upstream bytes.
        # The count of connections opened, against requests, is the keep-alive reuse.
        self.client = Client(spec.max_connections, spec.keepalive_s, spec.connect_timeout_s, spec.read_timeout_s,
                             metrics.upstream_connections.labels(name).inc,
                             Caps(spec.max_answer_head_bytes, spec.max_answer_bytes, spec.answer_deadline_s))
        # /health and /metrics, over connections of their own (a busy pool's limit never delays a health check),
        # with the requests' client: reading the workers is most of what an idle gateway does
        # (why: docs/decisions/001-workers-http-client.md).
        # Stored responses read back (GET /v1/responses/{id}) over a few connections of their own: reads hold no
        # scheduler slot, so on the requests' connections 40 slow ones took a 16-connection pool from everyone.
        self.reads = Client(READ_CONNECTIONS, spec.keepalive_s, spec.connect_timeout_s, spec.read_timeout_s,
                            caps=Caps(spec.max_answer_head_bytes, spec.max_answer_bytes, spec.answer_deadline_s))
        self._scrape_timeout = min(2.0, max(0.5, spec.scrape_interval_s * 2))
        self._scrape_client = Client(2, 60.0, self._scrape_timeout, self._scrape_timeout, caps=SCRAPE_CAPS)
        self._scraper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Scrape once before serving (so /readyz is right at once), then keep scraping."""
        await asyncio.gather(*(scrape(w, self._scrape_client, self._scrape_timeout) for w in self.workers))
        self._after_scrape()
        self._scraper = asyncio.get_running_loop().create_task(
            scrape_forever(self.workers, self._scrape_client, self._scrape_timeout, self.spec.scrape_interval_s,
                           self.spec.unhealthy_after, self._after_scrape))

    def _after_scrape(self) -> None:
        for worker in self.workers:  # an engine that restarted holds none of the prefixes sent to it before
            if worker.observed.cache_epoch != self._cache_epochs.get(worker.url, 0):
                self.router.index.forget(worker.url)
                self._cache_epochs[worker.url] = worker.observed.cache_epoch
        self.publish()
        self._scheduler.metrics_changed(self.name)

    def publish(self) -> None:
        """The pool's gauges, set when read (by /metrics and after each scrape), not on every request."""
        now = time.monotonic()
        for klass, depth in self.queues.depths().items():
            self.metrics.queue_depth.labels(self.name, klass).set(depth)
        for w in self.workers:
            labels = (self.name, w.url)
            self.metrics.worker_up.labels(*labels).set(1 if w.available(now) else 0)
            self.metrics.worker_inflight.labels(*labels).set(w.inflight)
            self.metrics.worker_waiting.labels(*labels).set(w.observed.waiting)
            self.metrics.worker_kv.labels(*labels).set(w.observed.kv_usage)

    @property
    def inflight(self) -> int:
        return sum(w.inflight for w in self.workers)

    def healthy_workers(self) -> int:
        """Workers admitted for routing now: healthy by the scraper and not cooling down."""
        now = time.monotonic()
        return sum(w.available(now) for w in self.workers)

    async def close(self) -> None:
        if self._scraper:
            self._scraper.cancel()
        self.client.close()
        self.reads.close()
        self._scrape_client.close()


class Upstreams:
    """Pools by name, kept in step with the policy. A replaced pool drains before it closes."""

    def __init__(self, metrics: GatewayMetrics, scheduler: Scheduler) -> None:
        self.metrics = metrics
        self.pools: dict[str, UpstreamPool] = {}
        self._scheduler = scheduler
        self._retiring: set[asyncio.Task[None]] = set()

    async def reconcile(self, specs: dict[str, Pool]) -> None:
        started = []
        for name, spec in specs.items():
            current = self.pools.get(name)
            if current is not None and current.spec == spec:
                continue
            pool = UpstreamPool(name, spec, self.metrics, self._scheduler,
                                None if current is None else current.router.index)  # a worker kept keeps it
            if current is not None:
                for gone in {w.url for w in current.workers} - {w.url for w in pool.workers}:
                    pool.router.index.forget(gone)
            started.append(pool.start())
            self.pools[name] = pool
            if current is not None:
                self._retire(current)
        for name in set(self.pools) - set(specs):
            self._retire(self.pools.pop(name))
            self._scheduler.untrack(name)
        await asyncio.gather(*started)

    def _retire(self, pool: UpstreamPool) -> None:
        async def drain() -> None:
            while pool.inflight:
                await asyncio.sleep(0.5)
            await pool.close()
        task = asyncio.get_running_loop().create_task(drain())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def close(self) -> None:
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*(p.close() for p in self.pools.values()), return_exceptions=True)
