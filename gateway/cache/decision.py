"""The cache step of the pipeline: may this request be answered from the cache, and may its answer be kept?

The exact layer is read on the request's path (one store read, bounded). The semantic layer (an embedding, a
search, the verifier) runs beside the request instead: the pipeline sends the request on at once and serves a
semantic hit only if it comes before the worker's answer starts, so the semantic layer never delays an answer
(the embedder takes ~20 ms a question on one core here, and much longer on a saturated host)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.cache.index import SEARCH_ON_LOOP, VectorIndex
from gateway.cache.keys import CacheKey, cache_key
from gateway.cache.service import Lookup, SemanticCache
from gateway.context import RequestContext
from gateway.ops.metrics import GatewayMetrics
from gateway.policy.schema import CachePolicy


@dataclass(slots=True)
class CacheDecision:
    """What the cache said about one request: its key (None if not cacheable), the exact lookup, the semantic
    lookup still running beside the request (None if there is none), and whether to store the answer."""

    key: CacheKey | None
    store: bool
    lookup: Lookup | None = None
    semantic: asyncio.Task[Lookup] | None = None
    semantic_due: float | None = None  # perf_counter() time the semantic lookup should end; None: it cannot hit
    settled: bool = False  # settle() has written the outcome: a lookup ending later leaves the context alone

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
    answers = ctx.tenant.cache_answers(body["model"]) if ctx.tenant.cache_models else ctx.tenant.cache
    key = cache_key(ctx.endpoint, body, ctx.tenant, answers, spec, max_tokens)
    directive = cache_control.lower()
    decision = CacheDecision(key=None if isinstance(key, str) else key, store=b"no-store" not in directive)
    if isinstance(key, str) or b"no-cache" in directive:
        ctx.cache = "bypass"
        ctx.cache_reason = key if isinstance(key, str) else "no-cache"
        metrics.child(metrics.cache_bypass, ctx.cache_reason).inc()
        return decision
    started = time.perf_counter()
    found = await cache.lookup_exact(key)
    ctx.timings.cache = time.perf_counter() - started
    ctx.timings.cache_at = started - ctx.timings.start
    metrics.child(metrics.cache_lookup, found.result).observe(ctx.timings.cache)
    ctx.cache = found.result
    ctx.cache_similarity = found.similarity
    ctx.cache_reason = found.reason if found.result != "miss" or key.language else None  # nothing to say of ""
    decision.lookup = found
    if found.result == "bypass":
        metrics.child(metrics.cache_bypass, found.reason or "unknown").inc()
    elif found.result == "miss" and key.semantic:  # not a scope the audit turned off ("off")
        expected = cache.expected_semantic_s(key, spec)
        decision.semantic_due = None if expected is None else time.perf_counter() + expected
        decision.semantic = asyncio.get_running_loop().create_task(
            _semantic(cache, key, spec, ctx, decision, metrics))
    return decision


def settle(ctx: RequestContext, decision: CacheDecision, semantic: Lookup | None, metrics: GatewayMetrics) -> None:
    """What the request's cache outcome was once its semantic lookup raced the answer: ``semantic`` is that
    lookup's result if it ended before the answer ended, else None (it came late)."""
    decision.settled = True
    if semantic is None:
        metrics.child(metrics.cache_bypass, "late").inc()
        return
    _show(ctx, semantic)
    if semantic.result == "bypass":
        metrics.child(metrics.cache_bypass, semantic.reason or "unknown").inc()


def _show(ctx: RequestContext, found: Lookup) -> None:
    ctx.cache = found.result
    ctx.cache_similarity = found.similarity
    ctx.cache_reason = found.reason
    if found.hit or found.result != "miss":
        ctx.cache_nearest = None


async def _semantic(cache: SemanticCache, key: CacheKey, spec: CachePolicy, ctx: RequestContext,
                    decision: CacheDecision, metrics: GatewayMetrics) -> Lookup:
    """The semantic lookup, timed. A lookup that did not hit is put on the context as soon as it is known, with a
    miss's nearest similarity (in the key's scope, which is the tenant's own), so that the answer's headers say it
    if they are written after; ``settle`` writes the same once the answer is over, and a lookup that ends after
    that leaves the context alone. A hit is left to ``settle``, which serves it."""
    started = time.perf_counter()
    found = await cache.lookup_semantic(key, spec)
    metrics.child(metrics.cache_semantic, found.result).observe(time.perf_counter() - started)
    if not found.hit and not decision.settled:
        nearest = None
        if found.result == "miss" and found.vector is not None:
            nearest = await _nearest(cache.index, key.scope, found.vector)
        if not decision.settled:
            _show(ctx, found)
            ctx.cache_nearest = nearest
    return found


async def _nearest(index: VectorIndex | None, scope: str, vector: np.ndarray) -> float | None:
    """The best cosine in ``scope`` (None: it holds nothing); a large scope is searched off the event loop."""
    if index is None or not index.size(scope):
        return None
    if index.size(scope) > SEARCH_ON_LOOP:
        best = await asyncio.to_thread(index.search, scope, vector, 1)
    else:
        best = index.search(scope, vector, 1)
    return best[0][1] if best else None
