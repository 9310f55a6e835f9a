"""The Gateway: the long-lived parts every request shares, and keeping them in step with the policy."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

from gateway import accounting
from gateway.cache.service import SemanticCache
from gateway.cache.store import RedisStore
from gateway.endpoints.responses import ResponseHomes
from gateway.finance import gpu_costs
from gateway.keys.service import open_keys
from gateway.ledger.presence import Presence, Seen
from gateway.ledger.writer import LedgerWriter
from gateway.ops import tracing
from gateway.ops.metrics import GatewayMetrics
from gateway.ops.scaling import Autoscaler
from gateway.policy.loader import PolicyError, PolicySnapshot, PolicyStore
from gateway.policy.schema import CachePolicy
from gateway.ratelimit import RateLimiter
from gateway.scheduling.controller import Controller
from gateway.spend.alerts import Alerts
from gateway.spend.service import Spend
from gateway.state import SharedState
from gateway.state.replicas import ALONE, Replicas, Share
from gateway.state.secret import GATEWAY_SECRET
from gateway.upstream.pools import Upstreams

log = logging.getLogger("tollgate.state")


class Gateway:
    """The policy store, upstream pools, scheduler, cache and metrics; started and stopped by ``lifespan``."""

    def __init__(self, store: PolicyStore, ledger: LedgerWriter | None = None, data_dir: Path | None = None,
                 share: Share = ALONE) -> None:
        """``share``: this process's place among the gateway processes on this host (``--workers N``); with
        ``state.redis_url`` set it is replaced by its place among every live process of every replica."""
        self.store = store
        self.ledger = ledger  # None: no data directory (in-process tests); requests are not recorded
        self.presence = Presence(ledger.store) if ledger is not None else None  # the hours GPUs are paid for
        self.state = SharedState(store.current.policy.state)  # read once: a reload cannot move it
        GATEWAY_SECRET.load(data_dir)  # the tenants' prefix-cache salts come from it
        self.replicas = Replicas(self.state, share) if self.state.redis is not None else None
        self.metrics = GatewayMetrics()
        self.alerts = Alerts(self.metrics, data_dir / "alerts.jsonl" if data_dir is not None else None)
        self.spend = Spend(self.metrics, self.alerts, ledger.store if ledger is not None else None, self.state)
        self.autoscaler = Autoscaler(self.metrics)
        self.scheduler = Controller(self.metrics, share=share, scheduling=lambda: self.store.current.policy.scheduling)
        self.metrics.gateway_processes.set(share.of)
        self.ratelimit = RateLimiter(self.state, lambda: self.scheduler.share.of)
        self.upstreams = Upstreams(self.metrics, self.scheduler)  # each scrape tells the scheduler itself
        self.cache: SemanticCache | None = None
        self.tracer = tracing.from_config(store.current.policy.tracing)  # read once, at start
        # how every request closes (pipeline.Lifecycle): its observers, in accounting's order, built once
        self.finish = accounting.Finish(accounting.observers(self.metrics, ledger, self.spend, self.ratelimit,
                                                             self.tracer))
        self.responses = ResponseHomes()  # which worker made which Responses API answer
        self.keys = open_keys(store.current.policy.state, data_dir)  # runtime API keys and the admin audit log
        self.draining = False  # set on SIGTERM: /readyz turns 503 while answers in flight finish
        self._tasks: set[asyncio.Task[None]] = set()  # background work; each task leaves the set when done

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object = None) -> AsyncIterator[None]:
        await GATEWAY_SECRET.share(self.state)  # before the first request: its salt must be every replica's
        await self.upstreams.reconcile(self.store.current.policy.pools)
        await self._reconcile_cache(self.store.current.policy.cache)
        await self.keys.start(self.store)  # before the first request: a runtime key works from the start
        self._spawn(self.keys.watch())
        self.store.listeners.append(self._on_policy)
        self.store.rejection_listeners.append(self._on_policy_rejected)
        self._spawn(self.store.watch())
        self._spawn(self._watch_loop_lag())
        self._spawn(self.alerts.run())
        self._spawn(self._watch_scale())
        if self.replicas is not None:
            await self._beat()  # this process's place before the first request
            self._spawn(self._keep_beating())
        if self.ledger is not None:
            self.ledger.start()
        if self.presence is not None and self.ledger is not None:
            self._spawn(self.presence.run(self.seen))
            self._spawn(gpu_costs.keep_gauges(self.metrics, self.ledger.store, lambda: self.store.current.policy,
                                              self.presence.live))
        try:
            yield
        finally:
            for task in list(self._tasks):
                task.cancel()
            await self.spend.close()
            await self.ratelimit.close()
            if self.presence is not None:
                await self.presence.beat(self.seen())  # the spans end when this process stopped
            if self.ledger is not None:
                await asyncio.to_thread(self.ledger.stop)  # flushes what is pending
            if self.tracer is not None:
                await asyncio.to_thread(self.tracer.shutdown)  # exports what is queued
            if self.cache is not None:
                await self.cache.close()
            await self.upstreams.close()
            await self.keys.close()
            if self.replicas is not None:
                await self.replicas.leave()
            await self.state.close()

    def unready(self) -> str | None:
        """Why this replica should get no traffic now, or None when it is ready."""
        if self.draining:
            return "shutting down"
        if not self.scheduler.share.ready:
            return "joining: the other gateway processes have not yet made room for this one"
        policy = self.store.current.policy
        if not policy.models:
            return "no model is configured"
        # Any model, not every one: a replica is taken out of its Service as a whole, so waiting for every pool
        # would make one pool's outage every model's. A model whose pool is down gets its own 503.
        return None if any(self.servable().values()) else "no healthy worker for any model"

    def servable(self) -> dict[str, bool]:
        """Each model of the policy: whether its pool has a worker admitted for routing now."""
        pools = self.upstreams.pools
        return {name: (pool := pools.get(route.pool)) is not None and pool.healthy_workers() > 0
                for name, route in self.store.current.policy.models.items()}

    def seen(self) -> list[Seen]:
        """Every worker of the live pools, up when admitted for routing (gateway.ledger.presence)."""
        now = time.monotonic()
        return [Seen(w.url, name, w.available(now)) for name, pool in self.upstreams.pools.items()
                for w in pool.workers]

    def publish_health(self) -> None:
        """The pools' healthy workers and the models' readiness, set when /metrics is read; cleared first, so a
        pool or model that a reload removed leaves no series behind."""
        self.metrics.pool_healthy.clear()
        self.metrics.model_ready.clear()
        for name, pool in self.upstreams.pools.items():
            self.metrics.pool_healthy.labels(name).set(pool.healthy_workers())
        for model, ok in self.servable().items():
            self.metrics.model_ready.labels(model).set(ok)

    async def _watch_loop_lag(self, interval: float = 0.1) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await asyncio.sleep(interval)
            self.metrics.loop_lag.observe(max(0.0, loop.time() - started - interval))

    async def _watch_scale(self, interval: float = 5.0) -> None:
        """The scaling signal, every few seconds (cheap: a pass over the pools and the TTFT histogram)."""
        while True:
            await asyncio.sleep(interval)
            queued = {name: pool.queues.queued for name, pool in self.upstreams.pools.items()}
            self.autoscaler.step(time.monotonic(), self.store.current.policy, self.upstreams.pools, queued)

    async def _beat(self) -> None:
        assert self.replicas is not None
        pools = self.upstreams.pools.values()
        share = await self.replicas.beat({w.url: (w.learned.limit, w.inflight) for pool in pools
                                          for w in pool.workers}, self.scheduler.tenants())
        self.replicas.agree(w for pool in pools for w in pool.workers)
        self.scheduler.fleet_changed(self.replicas.elsewhere)
        if share != self.scheduler.share:
            self.scheduler.set_share(share)  # a larger part may have room for what waits
            self.metrics.gateway_processes.set(share.of)

    async def _keep_beating(self) -> None:
        """This process's heartbeat among the replicas, and its part of each worker's limit from it."""
        assert self.replicas is not None
        while True:
            await asyncio.sleep(self.replicas.beat_s)
            try:
                await self._beat()
            except Exception:  # whatever goes wrong in one beat, the next one still comes
                log.exception("replica heartbeat failed; keeping this process's part of each worker's limit")

    def _on_policy(self, snapshot: PolicySnapshot) -> None:
        self.metrics.policy_reloads.labels("ok").inc()
        self.metrics.policy_ok.set(1)
        self._spawn(self.upstreams.reconcile(snapshot.policy.pools))
        self._spawn(self._reconcile_cache(snapshot.policy.cache))

    def _on_policy_rejected(self, error: PolicyError) -> None:
        self.metrics.policy_reloads.labels("error").inc()
        self.metrics.policy_ok.set(0)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reconcile_cache(self, spec: CachePolicy) -> None:
        """Start, keep or replace the cache to match the policy (thresholds etc. are read per request)."""
        current = self.cache
        if not spec.enabled:
            self.cache = None
        elif current is None or not current.same_backend(spec):
            shared = RedisStore(self.state) if self.state.redis is not None else None
            cache = SemanticCache(spec, self.metrics, shared)
            await cache.start()
            self.cache = cache
        if current is not None and current is not self.cache:
            await current.close()
