"""The cache service's failure rules in-process: it sheds its own work under load, and an outage of its store
loses nothing and duplicates nothing."""

from __future__ import annotations

import asyncio

import numpy as np
from aiohttp import web

from gateway.cache.keys import CacheKey, cache_key
from gateway.cache.service import SemanticCache
from gateway.cache.store import Entry, MemoryStore, StoreUnavailable
from gateway.fleet.observe import scrape
from gateway.fleet.worker import Worker
from gateway.ops.metrics import GatewayMetrics
from gateway.policy.loader import TenantView
from gateway.policy.schema import CachePolicy
from gateway.upstream.http1 import Client

TENANT = TenantView("acme", "standard", None, 512, 4096, "clamp")
SPEC = CachePolicy(enabled=True)


class FakeEmbedder:
    name, dim = "fake", 8

    def __init__(self, wait_s: float = 0.0) -> None:
        self.wait_s = wait_s
        self.calls = 0

    async def embed(self, text: str) -> np.ndarray:
        self.calls += 1
        vector = np.zeros(self.dim, np.float32)
        vector[hash(text) % self.dim] = 1.0
        return vector

    def expected_wait_s(self) -> float:
        return self.wait_s

    def close(self) -> None:
        return None


class DownStore(MemoryStore):
    """A store that is unreachable until ``up`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.up = False

    async def put(self, entry: Entry, max_per_tenant: int) -> list[str]:
        if not self.up:
            raise StoreUnavailable("down")
        return await super().put(entry, max_per_tenant)


def key(question: str) -> CacheKey:
    body = {"model": "m", "messages": [{"role": "user", "content": question}], "max_tokens": 16}
    made = cache_key("chat", body, TENANT, True, SPEC, 16)
    assert isinstance(made, CacheKey)
    return made


def answer(text: str) -> bytes:
    return (b'{"choices":[{"index":0,"message":{"role":"assistant","content":"' + text.encode()
            + b'"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":3}}')


def started_cache(embedder: FakeEmbedder) -> SemanticCache:
    cache = SemanticCache(SPEC, GatewayMetrics(), embedder=embedder)
    return cache


def test_a_busy_embedder_is_skipped_at_once() -> None:
    async def main() -> None:
        embedder = FakeEmbedder(wait_s=10.0)
        cache = started_cache(embedder)
        await cache.start()
        found = await cache.lookup(key("What is a service mesh?"), SPEC)
        assert (found.result, found.reason) == ("bypass", "embedder_busy")
        assert embedder.calls == 0, "no vector was asked for"
        embedder.wait_s = 0.0
        found = await cache.lookup(key("What is a service mesh?"), SPEC)
        assert found.result == "miss" and embedder.calls == 1
        await cache.close()
    asyncio.run(main())


def test_writes_during_a_store_outage_are_replayed_once_per_request() -> None:
    async def main() -> None:
        cache = started_cache(FakeEmbedder())
        store = DownStore()
        cache.store = store
        await cache.start()
        questions = [f"What is item number {i} for?" for i in range(5)]
        for _ in range(10):
            for q in questions:
                await cache._remember(key(q), "chat", answer("ok"), False, None, SPEC)
        assert len(cache._pending) == 5, "one pending write per exact request, not one per request"
        store.up = True
        cache._down_until = 0.0
        await cache.flush_pending()
        assert len(store.entries) == 5 and not cache._pending
        assert await cache.purge(entry_id="no-such-entry") == 0, "purge reports what it removed"
        assert await cache.purge(tenant="acme") == 5
        await cache.close()
    asyncio.run(main())


def test_one_late_health_check_does_not_drop_a_worker() -> None:
    async def main() -> None:
        slow = asyncio.Event()

        async def health(request: web.Request) -> web.Response:
            if slow.is_set():
                await asyncio.sleep(1.0)
            return web.Response(text="")

        async def metrics(request: web.Request) -> web.Response:
            return web.Response(text="vllm:num_requests_waiting 0\n")
        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        worker = Worker(url, "p")
        timeout = 0.2
        client = Client(2, 60.0, timeout, timeout)
        await scrape(worker, client, timeout, unhealthy_after=3)
        assert worker.observed.healthy
        slow.set()
        for n in (1, 2):
            await scrape(worker, client, timeout, unhealthy_after=3)
            assert worker.observed.healthy and worker.observed.failed_checks == n
        assert worker.observed.last_error and "Timeout" in worker.observed.last_error, "the reason is never empty"
        await scrape(worker, client, timeout, unhealthy_after=3)
        assert not worker.observed.healthy, "the third failure in a row leaves the worker out"
        slow.clear()
        await scrape(worker, client, timeout, unhealthy_after=3)
        assert worker.observed.healthy and worker.observed.failed_checks == 0
        client.close()
        await runner.cleanup()
    asyncio.run(main())


