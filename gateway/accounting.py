"""How every request closes: ``Finish(ctx)`` stamps its total time and the moment it ended, then runs the
observers, one concern each, always in this order:

1. ``price_of``: ctx.cost_usd and ctx.price_version, at the version in force that day (every later one reads them);
2. ``settle_spend``: the budget's reservation swapped for the cost (gateway.spend);
3. ``settle_ratelimit``: the tokens the request did not use given back (gateway.ratelimit);
4. ``record``: the ledger record (written off the loop by the ledger writer);
5. ``count``: Prometheus;
6. ``end_span``: the request's span, when it was traced;
7. ``write_line``: the JSON log line (written off the loop by gateway.ops.logs).

One that raises is logged and the rest still run: a settlement that fails must not cost the request its ledger
record or its metrics. The runtime builds the observers once (``observers``); per request that is one loop over a
tuple of closures, with nothing looked up or allocated beyond what each concern writes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from gateway.context import STAGES, RequestContext
from gateway.ledger.records import draft, price
from gateway.ledger.writer import LedgerWriter
from gateway.ops import logs
from gateway.ops.metrics import GatewayMetrics
from gateway.ops.tracing import Tracer
from gateway.ratelimit import Charge, RateLimiter
from gateway.spend.service import Spend

log = logging.getLogger("tollgate.accounting")

# What one concern does with a finished request: (ctx, when it ended on the wall clock, epoch seconds).
Observer = Callable[[RequestContext, float], None]


class Finish:
    """``finish(ctx)``: close the request once, then hand it to each observer in turn."""

    __slots__ = ("observers",)

    def __init__(self, observers: Iterable[Observer]) -> None:
        self.observers = tuple(observers)

    def __call__(self, ctx: RequestContext) -> None:
        t = ctx.timings
        t.total = time.perf_counter() - t.start
        finished_at = time.time()  # one moment for the price's day, the record and the log line
        for observe in self.observers:
            try:
                observe(ctx, finished_at)
            except Exception:
                log.exception("request %s: %s failed while it finished", ctx.request_id, observe.__name__)


def observers(metrics: GatewayMetrics, ledger: LedgerWriter | None = None, spend: Spend | None = None,
              ratelimit: RateLimiter | None = None, tracer: Tracer | None = None,
              emit: Callable[[dict[str, Any]], None] = logs.emit) -> tuple[Observer, ...]:
    """The observers, in the module's order; a part the gateway runs without (no ledger, no tracer) has none."""
    chosen: list[Observer | None] = [
        price_of, spend_settlement(spend), ratelimit_settlement(ratelimit), ledger_record(ledger),
        metrics_update(metrics), span_end(tracer), log_line(emit)]
    return tuple(o for o in chosen if o is not None)


def price_of(ctx: RequestContext, finished_at: float) -> None:
    """An authenticated request's cost (an unauthenticated one costs nothing and belongs to no tenant)."""
    if ctx.tenant is not None:
        ctx.cost_usd, ctx.price_version = price(ctx, finished_at)


def spend_settlement(spend: Spend | None) -> Observer | None:
    if spend is None:
        return None
    settle = spend.settle

    def settle_spend(ctx: RequestContext, finished_at: float) -> None:
        if ctx.tenant is not None:
            settle(ctx, ctx.cost_usd)
    return settle_spend


def ratelimit_settlement(ratelimit: RateLimiter | None) -> Observer | None:
    if ratelimit is None:
        return None
    settle = ratelimit.settle

    def settle_ratelimit(ctx: RequestContext, finished_at: float) -> None:
        """A cache hit used no tokens but did run; a request that never reached a worker gets its request back."""
        if ctx.tenant is not None and ctx.charge is not None:
            hit = bool(ctx.cache and ctx.cache.startswith("hit"))
            ran = hit or ctx.timings.upstream_connect is not None
            used = 0 if hit else (ctx.prompt_tokens or 0) + (ctx.completion_tokens or 0)
            assert isinstance(ctx.charge, Charge)  # the limiter's own, stored by the pipeline
            settle(ctx.charge, used, ran)
    return settle_ratelimit


def ledger_record(ledger: LedgerWriter | None) -> Observer | None:
    if ledger is None:
        return None
    append = ledger.append

    def record(ctx: RequestContext, finished_at: float) -> None:
        if (drafted := draft(ctx, finished_at)) is not None:
            append(drafted)
    return record


def metrics_update(metrics: GatewayMetrics) -> Observer:
    child = metrics.child
    requests, errors, tokens, spent = metrics.requests.add, metrics.errors.add, metrics.tokens.add, metrics.cost.add

    def count(ctx: RequestContext, finished_at: float) -> None:
        t = ctx.timings
        tier, model = ctx.label, ctx.served_model or "none"  # the class the request ran in: batch lines count as batch
        if ctx.cost_usd and ctx.tenant is not None:
            spent((ctx.tenant.name, model), ctx.cost_usd)
        metrics.observe_stages(tier, model, (t.queue_wait, t.upstream_connect, t.ttft, t.tpot, t.total))
        requests((tier, model, str(ctx.status)))
        if ctx.error:
            errors((tier, model, ctx.error))
        if ctx.prompt_tokens:
            tokens((tier, model, "prompt"), ctx.prompt_tokens)
        if ctx.completion_tokens:
            tokens((tier, model, "completion"), ctx.completion_tokens)
        if ctx.cache:
            child(metrics.cache_requests, tier, ctx.cache).inc()
            if ctx.cache.startswith("hit"):
                child(metrics.cache_tokens_saved, tier, "prompt").inc(ctx.prompt_tokens or 0)
                child(metrics.cache_tokens_saved, tier, "completion").inc(ctx.completion_tokens or 0)
    return count


def span_end(tracer: Tracer | None) -> Observer | None:
    if tracer is None:
        return None
    finish = tracer.finish

    def end_span(ctx: RequestContext, finished_at: float) -> None:
        if ctx.trace is not None:
            finish(ctx)
    return end_span


def log_line(emit: Callable[[dict[str, Any]], None]) -> Observer:
    def write_line(ctx: RequestContext, finished_at: float) -> None:
        t, tenant = ctx.timings, ctx.tenant
        emit({
            "time": finished_at, "request_id": ctx.request_id, "tenant": tenant.name if tenant else None,
            "tier": tenant.tier if tenant else None, "class": ctx.label, "batch": ctx.batch,
            "model": ctx.model, "served_model": ctx.served_model, "endpoint": ctx.endpoint.name, "stream": ctx.stream,
            "worker": ctx.worker, "route": ctx.route, "past_limit": ctx.past_limit,
            "attempts": ctx.attempts, "status": ctx.status, "error": ctx.error,
            "prompt_tokens": ctx.prompt_tokens, "completion_tokens": ctx.completion_tokens,
            "cached_tokens": ctx.cached_tokens, "usage_estimated": ctx.usage_estimated,
            "max_tokens": ctx.max_tokens_applied, "cache": ctx.cache, "cost_usd": ctx.cost_usd,
            "policy": ctx.snapshot.digest,
            "stages_ms": {name: None if (v := getattr(t, name)) is None else round(v * 1000, 3) for name in STAGES},
        })
    return write_line
