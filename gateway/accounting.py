"""One finish() per request: its price, the budget and rate-limit settlements, Prometheus, the JSON log line
(written off the loop by gateway.ops.logs) and the ledger record (written off the loop by the ledger writer)."""

from __future__ import annotations

import time

from gateway.context import STAGES, RequestContext
from gateway.ledger.records import draft, price
from gateway.ledger.writer import LedgerWriter
from gateway.ops import logs
from gateway.ops.metrics import GatewayMetrics
from gateway.ops.tracing import Tracer
from gateway.ratelimit import RateLimiter
from gateway.spend.service import Spend


def finish(ctx: RequestContext, metrics: GatewayMetrics, ledger: LedgerWriter | None = None,
           spend: Spend | None = None, ratelimit: RateLimiter | None = None, tracer: Tracer | None = None) -> None:
    t = ctx.timings
    t.total = time.perf_counter() - t.start
    now = time.time()
    if ctx.tenant is not None:
        ctx.cost_usd, ctx.price_version = price(ctx, now)
        if ctx.cost_usd:
            metrics.child(metrics.cost, ctx.tenant.name, ctx.served_model or "none").inc(ctx.cost_usd)
        if spend is not None:
            spend.settle(ctx, ctx.cost_usd)
        if ratelimit is not None and ctx.charge is not None:
            hit = bool(ctx.cache and ctx.cache.startswith("hit"))
            ran = hit or ctx.timings.upstream_connect is not None
            used = 0 if hit else (ctx.prompt_tokens or 0) + (ctx.completion_tokens or 0)
            ratelimit.settle(ctx.charge, used, ran)  # type: ignore[arg-type]
    if ledger is not None and (record := draft(ctx, now)) is not None:
        ledger.append(record)
    tier, model = ctx.label, ctx.served_model or "none"  # the class the request ran in: batch lines count as batch
    queue_wait, connect, ttft, tpot, duration = metrics.stage_children(tier, model)
    for child, value in ((queue_wait, t.queue_wait), (connect, t.upstream_connect), (ttft, t.ttft),
                         (tpot, t.tpot), (duration, t.total)):
        if value is not None:
            child.observe(value)
    child = metrics.child
    child(metrics.requests, tier, model, str(ctx.status)).inc()
    if ctx.error:
        child(metrics.errors, tier, model, ctx.error).inc()
    if ctx.prompt_tokens:
        child(metrics.tokens, tier, model, "prompt").inc(ctx.prompt_tokens)
    if ctx.completion_tokens:
        child(metrics.tokens, tier, model, "completion").inc(ctx.completion_tokens)
    if ctx.cache:
        child(metrics.cache_requests, tier, ctx.cache).inc()
        if ctx.cache.startswith("hit"):
            child(metrics.cache_tokens_saved, tier, "prompt").inc(ctx.prompt_tokens or 0)
            child(metrics.cache_tokens_saved, tier, "completion").inc(ctx.completion_tokens or 0)
    if tracer is not None and ctx.trace is not None:
        tracer.finish(ctx)
    logs.emit({
        "time": now, "request_id": ctx.request_id, "tenant": ctx.tenant.name if ctx.tenant else None,
        "tier": ctx.tenant.tier if ctx.tenant else None, "class": tier, "batch": ctx.batch,
        "model": ctx.model, "served_model": ctx.served_model, "endpoint": ctx.endpoint.name, "stream": ctx.stream,
        "worker": ctx.worker, "route": ctx.route, "past_limit": ctx.past_limit,
        "attempts": ctx.attempts, "status": ctx.status, "error": ctx.error,
        "prompt_tokens": ctx.prompt_tokens, "completion_tokens": ctx.completion_tokens,
        "cached_tokens": ctx.cached_tokens, "usage_estimated": ctx.usage_estimated,
        "max_tokens": ctx.max_tokens_applied, "cache": ctx.cache, "cost_usd": ctx.cost_usd,
        "policy": ctx.snapshot.digest,
        "stages_ms": {name: None if (v := getattr(t, name)) is None else round(v * 1000, 3) for name in STAGES},
    })
