"""The cache service's failure rules in-process: it sheds its own work under load, an outage of its store
loses nothing and duplicates nothing, and what it holds is bounded in bytes per tenant and in total. (On Redis:
tests/process/cache/test_service.py.)"""

from __future__ import annotations

import asyncio

import numpy as np
import orjson
from aiohttp import web

from gateway.cache.keys import CacheKey, cache_key
from gateway.cache.service import SemanticCache
from gateway.cache.store import Entry, MemoryStore, StoreUnavailable
from gateway.endpoints import CHAT, EMBEDDINGS
from gateway.fleet.observe import scrape
from gateway.fleet.worker import Worker
from gateway.ops.metrics import GatewayMetrics
from gateway.policy.loader import TenantView
from gateway.policy.schema import CachePolicy
from gateway.transport.http1 import Client
from tests.fakes import chunk, usage_event

TENANT = TenantView("acme", "standard", None, 512, 4096, "clamp")
SPEC = CachePolicy(enabled=True)


class FakeEmbedder:
    name, dim = "fake", 8

    def __init__(self, wait_s: float = 0.0) -> None:
        self.wait_s = wait_s
        self.calls = 0

    async def embed(self, text: str, priority: int = 0) -> np.ndarray:
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

    async def put(self, entry: Entry, spec: CachePolicy) -> list[str]:
        if not self.up:
            raise StoreUnavailable("down")
        return await super().put(entry, spec)


def key(question: str) -> CacheKey:
    body = {"model": "m", "messages": [{"role": "user", "content": question}], "max_tokens": 16, "temperature": 0}
    made = cache_key(CHAT, body, TENANT, True, SPEC, 16)
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
                await cache._remember(key(q), CHAT, answer("ok"), False, None, SPEC)
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




MIB = 1 << 20
SMALL = CachePolicy(enabled=True, max_tenant_bytes=MIB, max_bytes=2 * MIB)  # an entry may hold up to 64 KiB


def embedding_key(tenant: str, n: int) -> CacheKey:
    view = TenantView(tenant, "standard", None, 512, 4096, "clamp")
    made = cache_key(EMBEDDINGS, {"model": "e", "input": [f"text {n}"]}, view, True, SMALL, 0)
    assert isinstance(made, CacheKey)
    return made


def embeddings_answer(inputs: int) -> bytes:
    """An answer of ``inputs`` 384-float vectors: ~8 KB of JSON each."""
    rng = np.random.default_rng(inputs)
    data = [{"object": "embedding", "index": i, "embedding": rng.standard_normal(384).tolist()}
            for i in range(inputs)]
    return orjson.dumps({"object": "list", "data": data, "usage": {"prompt_tokens": inputs, "total_tokens": inputs}})


async def remember_all(cache: SemanticCache, keys: list[CacheKey], payload: bytes) -> None:
    for k in keys:
        await cache._remember(k, EMBEDDINGS, payload, False, None, SMALL)


async def stored(store: MemoryStore, keys: list[CacheKey]) -> list[bool]:
    return [await store.get_exact(k.exact) is not None for k in keys]


async def in_memory_cache() -> tuple[SemanticCache, MemoryStore]:
    """A started cache on the in-process store, and that store."""
    cache = started_cache(FakeEmbedder())
    await cache.start()
    assert isinstance(cache.store, MemoryStore)
    return cache, cache.store


def test_large_answers_from_one_tenant_stay_within_its_bytes() -> None:
    async def main() -> None:
        cache, store = await in_memory_cache()
        payload = embeddings_answer(5)
        assert 32 << 10 < len(payload) < SMALL.max_entry_bytes
        keys = [embedding_key("acme", n) for n in range(60)]  # ~2.3 MiB of answers for a 1 MiB share
        for i, k in enumerate(keys):
            await cache._remember(k, EMBEDDINGS, payload, False, None, SMALL)
            if i % 8 == 0:  # the first answer keeps being asked for
                assert (await cache.lookup(keys[0], SMALL)).result == "hit-exact"
                await asyncio.wait(cache._tasks)  # the LRU touch runs in the background
        kept = await stored(store, keys)
        assert store.held == store.footprint.tenant_bytes("acme") <= SMALL.max_tenant_bytes
        assert store.held > SMALL.max_tenant_bytes - SMALL.max_entry_bytes, "the share is used, not emptied"
        assert sum(len(e.answer) for e in store.entries.values()) < store.held, "the bytes held are counted"
        assert 10 < sum(kept) < 40 and kept[0] and all(kept[-10:]), "the most recently used stay"
        assert not any(kept[1:20]), "the least recently used went first"
        assert cache.metrics.cache_bytes._value.get() == store.held
        await cache.close()
    asyncio.run(main())


def test_a_tenant_over_its_share_evicts_its_own_and_the_total_the_oldest() -> None:
    async def main() -> None:
        cache, store = await in_memory_cache()
        payload = embeddings_answer(5)
        globex = [embedding_key("globex", n) for n in range(5)]
        acme = [embedding_key("acme", n) for n in range(60)]
        await remember_all(cache, globex, payload)
        await remember_all(cache, acme, payload)
        assert all(await stored(store, globex)), "acme filling its share evicts only acme's entries"
        assert store.footprint.tenant_bytes("acme") <= SMALL.max_tenant_bytes
        held = [k for k, kept in zip(globex + acme, await stored(store, globex + acme), strict=True) if kept]
        # a third tenant fills its share: the total (2 MiB) is passed, and the oldest entries of all go
        initech = [embedding_key("initech", n) for n in range(60)]
        await remember_all(cache, initech, payload)
        assert store.held <= SMALL.max_bytes
        still = await stored(store, held)
        assert not still[0] and still[-1] and still == sorted(still), "the least recently used of all went"
        assert all((await stored(store, initech))[-10:])
        await cache.close()
    asyncio.run(main())


def test_an_answer_over_the_entry_cap_is_not_stored() -> None:
    async def main() -> None:
        cache, store = await in_memory_cache()
        big = embeddings_answer(20)
        assert len(big) > SMALL.max_entry_bytes
        await cache._remember(embedding_key("acme", 1), EMBEDDINGS, big, False, None, SMALL)
        # a streamed chat answer: its SSE is parsed, and the text it holds is over the cap
        events = chunk("word " * 14_000, "stop") + usage_event(5, 14_000) + b"data: [DONE]\n\n"
        await cache._remember(key("Tell me everything"), CHAT, events, True, None, SMALL)
        assert store.entries == {} and store.held == 0
        assert cache.metrics.cache_not_stored.labels("too_large")._value.get() == 2
        assert (await cache.lookup(embedding_key("acme", 1), SMALL)).result == "miss"
        await cache._remember(embedding_key("acme", 2), EMBEDDINGS, embeddings_answer(5), False, None, SMALL)
        assert len(store.entries) == 1, "the positive control: an answer under the cap is stored"
        await cache.close()
    asyncio.run(main())


def test_writes_held_while_the_store_is_down_are_bounded_in_bytes() -> None:
    async def main() -> None:
        cache = started_cache(FakeEmbedder())
        cache.store = DownStore()
        await cache.start()
        keys = [embedding_key("acme", n) for n in range(60)]
        await remember_all(cache, keys, embeddings_answer(5))
        assert 10 < len(cache._pending) < 40, "the latest writes are kept, within the tenant's share"
        assert cache._pending_held.total <= SMALL.max_tenant_bytes
        assert list(cache._pending) == [k.exact for k in keys[-len(cache._pending):]]
        await cache.close()
    asyncio.run(main())


def test_a_scope_the_audit_turned_off_answers_off_with_its_reason_in_both_layers() -> None:
    async def main() -> None:
        cache = started_cache(FakeEmbedder())
        await cache.start()
        asked = key("What is a service mesh?")
        assert (await cache.lookup(asked, SPEC)).result == "miss"
        cache.audits._scope(asked.scope, asked.tenant, asked.model).off = True
        exact, semantic = await cache.lookup_exact(asked), await cache.lookup_semantic(asked, SPEC)
        assert (exact.result, exact.reason) == (semantic.result, semantic.reason) == ("off", "audit")
        body = {"model": "other", "messages": [{"role": "user", "content": "What is a service mesh?"}],
                "max_tokens": 16, "temperature": 0}
        other = cache_key(CHAT, body, TENANT, True, SPEC, 16)
        assert isinstance(other, CacheKey) and (await cache.lookup(other, SPEC)).result == "miss", "its own scope"
        await cache.close()
    asyncio.run(main())
