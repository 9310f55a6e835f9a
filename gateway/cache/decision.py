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

from gateway.cache.keys import CacheKey, cache_key
from gateway.cache.service import Lookup, SemanticCache
from gateway.context import RequestContext
from gateway.ops.metrics import GatewayMetrics


@dataclass(slots=True)
class CacheDecision:
    """What the cache said about one request: its key (None if not cacheable), the exact lookup, the semantic
    lookup still running beside the request (None if there is none), and whether to store the answer."""

    key: CacheKey | None
    store: bool
    lookup: Lookup | None = None
    semantic: asyncio.Task[Lookup] | None = None
    semantic_due: float | None = None  # perf_counter() time the semantic lookup should end; None: it cannot hit

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
    found = await cache.lookup_exact(key)
    ctx.timings.cache = time.perf_counter() - started
    ctx.timings.cache_at = started - ctx.timings.start
    metrics.child(metrics.cache_lookup, found.result).observe(ctx.timings.cache)
    ctx.cache = found.result
    ctx.cache_similarity = found.similarity
    decision.lookup = found
    if found.result == "bypass":
        metrics.child(metrics.cache_bypass, found.reason or "unknown").inc()
    elif not found.hit and key.semantic:
        expected = cache.expected_semantic_s(key, spec)
        decision.semantic_due = None if expected is None else time.perf_counter() + expected
        decision.semantic = asyncio.get_running_loop().create_task(cache.lookup_semantic(key, spec))
        decision.semantic.add_done_callback(_observed(metrics, time.perf_counter()))
    return decision


def settle(ctx: RequestContext, decision: CacheDecision, semantic: Lookup | None, metrics: GatewayMetrics) -> None:
    """What the request's cache outcome was once its semantic lookup raced the answer: ``semantic`` is that
    lookup's result if it ended before the answer started, else None (it came late, or the answer came first)."""
    if semantic is None:
        metrics.child(metrics.cache_bypass, "late").inc()
        return
    ctx.cache = semantic.result
    ctx.cache_similarity = semantic.similarity
    if semantic.result == "bypass":
        metrics.child(metrics.cache_bypass, semantic.reason or "unknown").inc()


def _observed(metrics: GatewayMetrics, started: float):  # type: ignore[no-untyped-def]
    def done(task: asyncio.Task[Lookup]) -> None:
        if not task.cancelled():
            metrics.child(metrics.cache_semantic, task.result().result).observe(time.perf_counter() - started)
    return done
