"""Keep-alive pools: one aiohttp session per pool, its workers, their scraper, and the in-flight lease.

In-flight is counted in exactly one place, ``Lease``: taken when a request is sent to a worker and given
back when its answer is finished, on every exit (success, error, cancellation by a client that left,
timeout). Routing reads the count, and a retired pool drains on it, so a leak would starve a healthy
worker; nothing else writes it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import TracebackType

import aiohttp

from gateway.fleet.observe import scrape, scrape_forever
from gateway.fleet.worker import Worker
from gateway.ops.metrics import GatewayMetrics
from gateway.policy.schema import Pool
from gateway.scheduling.queues import PoolState
from gateway.upstream.affinity import PrefixIndex


def session(spec: Pool, traces: list[aiohttp.TraceConfig] | None = None) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=spec.max_connections, keepalive_timeout=spec.keepalive_s,
                                     ttl_dns_cache=None)
    return aiohttp.ClientSession(connector=connector, trace_configs=traces or [], auto_decompress=False,
                                 skip_auto_headers=("User-Agent",))


class Lease:
    """``with pool.lease(worker):`` counts one request in flight on the worker for the block's lifetime."""

    __slots__ = ("worker",)

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def __enter__(self) -> Worker:
        self.worker.inflight += 1
        return self.worker

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.worker.inflight -= 1


class UpstreamPool:
    """One keep-alive session per pool, its workers, and their scraper."""

    def __init__(self, name: str, spec: Pool, metrics: GatewayMetrics,
                 traces: list[aiohttp.TraceConfig] | None = None,
                 on_metrics: Callable[[str], None] | None = None) -> None:
        self.name = name
        self.spec = spec
        self.metrics = metrics
        self.workers = [Worker(str(url).rstrip("/"), name) for url in spec.workers]
        self.admission = PoolState(name, self.workers, spec)  # its queues and counts (gateway.scheduling)
        self.prefixes = PrefixIndex()  # which worker recently got which prompt blocks (affinity)
        # connect: pool wait + TCP connect; sock_read: the longest silence between upstream bytes
        self.timeout = aiohttp.ClientTimeout(total=None, connect=spec.connect_timeout_s,
                                             sock_read=spec.read_timeout_s)
        self._traces = traces
        self._on_metrics = on_metrics
        self.session: aiohttp.ClientSession | None = None
        self._scrape_session: aiohttp.ClientSession | None = None
        self._scraper: asyncio.Task[None] | None = None

    def _connections_trace(self) -> aiohttp.TraceConfig:
        """Count the upstream connections opened: requests / connections is the keep-alive reuse."""
        opened = self.metrics.upstream_connections.labels(self.name)
        trace = aiohttp.TraceConfig()

        async def on_created(session: object, context: object, params: object) -> None:
            opened.inc()
        trace.on_connection_create_end.append(on_created)
        return trace

    async def start(self) -> None:
        """Open the sessions, scrape once before serving (so /readyz is right at once), then keep scraping."""
        self.session = session(self.spec, [*(self._traces or []), self._connections_trace()])
        self._scrape_session = session(self.spec)
        timeout = aiohttp.ClientTimeout(total=min(2.0, max(0.5, self.spec.scrape_interval_s * 2)))
        await asyncio.gather(*(scrape(w, self._scrape_session, timeout) for w in self.workers))
        self._after_scrape()
        self._scraper = asyncio.get_running_loop().create_task(
            scrape_forever(self.workers, self._scrape_session, timeout, self.spec.scrape_interval_s,
                           self.spec.unhealthy_after, self._after_scrape))

    def _after_scrape(self) -> None:
        self.publish()
        if self._on_metrics is not None:
            self._on_metrics(self.name)

    def lease(self, worker: Worker) -> Lease:
        return Lease(worker)

    def publish(self) -> None:
        now = time.monotonic()
        for w in self.workers:
            labels = (self.name, w.url)
            self.metrics.worker_up.labels(*labels).set(1 if w.available(now) else 0)
            self.metrics.worker_inflight.labels(*labels).set(w.inflight)
            self.metrics.worker_waiting.labels(*labels).set(w.observed.waiting)
            self.metrics.worker_kv.labels(*labels).set(w.observed.kv_usage)

    @property
    def inflight(self) -> int:
        return sum(w.inflight for w in self.workers)

    def ready(self) -> bool:
        now = time.monotonic()
        return any(w.available(now) for w in self.workers)

    async def close(self) -> None:
        if self._scraper:
            self._scraper.cancel()
        for s in (self.session, self._scrape_session):
            if s is not None:
                await s.close()


class Upstreams:
    """Pools by name, kept in step with the policy. A replaced pool drains before it closes."""

    def __init__(self, metrics: GatewayMetrics, traces: list[aiohttp.TraceConfig] | None = None,
                 on_metrics: Callable[[str], None] | None = None) -> None:
        self.metrics = metrics
        self.pools: dict[str, UpstreamPool] = {}
        self._traces = traces
        self._on_metrics = on_metrics
        self._retiring: set[asyncio.Task[None]] = set()

    async def reconcile(self, specs: dict[str, Pool]) -> None:
        started = []
        for name, spec in specs.items():
            current = self.pools.get(name)
            if current is not None and current.spec == spec:
                continue
            pool = UpstreamPool(name, spec, self.metrics, self._traces, self._on_metrics)
            if current is not None:  # queued and admitted requests stay counted, now against the new workers
                pool.admission = current.admission
                pool.admission.workers, pool.admission.spec = pool.workers, spec
                pool.prefixes = current.prefixes  # a worker kept keeps what it holds
                for gone in {w.url for w in current.workers} - {w.url for w in pool.workers}:
                    pool.prefixes.forget(gone)
            started.append(pool.start())
            self.pools[name] = pool
            if current is not None:
                self._retire(current)
        for name in set(self.pools) - set(specs):
            self._retire(self.pools.pop(name))
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
