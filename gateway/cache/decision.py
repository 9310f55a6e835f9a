"""The cache step of the pipeline: may this request be answered from the cache, and may its answer be kept?"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gateway.cache.keys import CacheKey, cache_key
from gateway.cache.service import Lookup, SemanticCache
from gateway.context import RequestContext
from gateway.ops.metrics import GatewayMetrics


@dataclass(slots=True)
class CacheDecision:
    """What the cache said about one request: its key (None if not cacheable), the lookup, whether to store."""

    key: CacheKey | None
    store: bool
    lookup: Lookup | None = None

    @property
    def hit(self) -> bool:
        return self.lookup is not None and self.lookup.hit

    @property
    def keep_answer(self) -> bool:
        return self.store and self.key is not None and not self.hit


async def decide(cache: SemanticCache | None, ctx: RequestContext, body: dict[str, Any], cache_control: bytes,
                 metrics: GatewayMetrics) -> CacheDecision | None:
    """Look the request up unless it is not cacheable; None when the cache is off.

    `Cache-Control: no-cache` skips the lookup and `no-store` the storing, as for HTTP caches."""
    spec = ctx.snapshot.policy.cache
    if cache is None or not spec.enabled or ctx.tenant is None:
        return None
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    key = cache_key(ctx.endpoint, body, ctx.tenant, ctx.tenant.cache, spec, max_tokens)
    directive = cache_control.lower()
    decision = CacheDecision(key=None if isinstance(key, str) else key, store=b"no-store" not in directive)
    if isinstance(key, str) or b"no-cache" in directive:
        ctx.cache = "bypass"
        metrics.child(metrics.cache_bypass, key if isinstance(key, str) else "no-cache").inc()
        return decision
    started = time.perf_counter()
    found = await cache.lookup(key, spec)
    ctx.timings.cache = time.perf_counter() - started
    ctx.timings.cache_at = started - ctx.timings.start
    metrics.child(metrics.cache_lookup, found.result).observe(ctx.timings.cache)
    ctx.cache = found.result
    ctx.cache_similarity = found.similarity
    if found.result == "bypass":
        metrics.child(metrics.cache_bypass, found.reason or "unknown").inc()
    decision.lookup = found
    return decision
