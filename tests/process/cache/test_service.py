"""The cache service on Redis (this machine's): what tests/inprocess/cache/test_service.py holds it to in this
process, with the store shared by replicas."""

from __future__ import annotations

import asyncio

import redis

from gateway.cache.service import Lookup, SemanticCache
from gateway.cache.store import RedisStore
from gateway.endpoints import CHAT
from gateway.ops.metrics import GatewayMetrics
from gateway.policy.schema import CachePolicy, StatePolicy
from gateway.state import SharedState
from tests.inprocess.cache.test_service import MIB, FakeEmbedder, answer, key


def test_on_redis_the_entry_cap_holds_before_writing_and_each_replica_index_is_bounded() -> None:
    async def main() -> None:
        redis.Redis(db=15).flushdb()
        store = RedisStore(SharedState(StatePolicy(redis_url="redis://127.0.0.1:6379/15")))
        spec = CachePolicy(enabled=True, max_tenant_bytes=MIB // 4, max_bytes=MIB)  # ~240 vectors of 8 floats
        cache = SemanticCache(spec, GatewayMetrics(), store, embedder=FakeEmbedder())
        await cache.start()
        embedder = FakeEmbedder()
        questions = [f"What is item number {i} for?" for i in range(300)]
        for q in questions:
            looked: asyncio.Future[Lookup] = asyncio.get_running_loop().create_future()
            looked.set_result(Lookup("miss", vector=await embedder.embed(q)))  # the miss that embedded it
            await cache._remember(key(q), CHAT, answer("ok"), False, looked, spec)
        assert cache.index is not None
        assert cache.index.held.tenant_bytes("acme") <= spec.max_tenant_bytes and len(cache.index) < 300
        assert cache.metrics.cache_bytes._value.get() == cache.index.held.total
        assert all([await store.get_exact(key(q).exact) is not None for q in questions]), \
            "an index evicting a vector leaves the entry in Redis (the exact layer)"
        assert (await cache.lookup(key(questions[0]), spec)).result == "hit-exact"
        await cache._remember(key("Tell me everything"), CHAT, answer("word " * 4000), False, None, spec)
        assert await store.get_exact(key("Tell me everything").exact) is None, "over the cap: never written"
        assert cache.metrics.cache_not_stored.labels("too_large")._value.get() == 1
        await cache.close()
    asyncio.run(main())
