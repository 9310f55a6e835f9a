"""One ledger record per request: priced and drafted at finish on the event loop (plain values), its time
formatted on the writer's thread."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any

from gateway.context import RequestContext
from gateway.ledger import prices as pricing
from gateway.ledger import times
from gateway.policy.schema import Prices

_PREFIX = "rec-" + os.urandom(6).hex()
_counter = itertools.count()


@dataclass(slots=True)
class Draft:
    fields: dict[str, Any]
    finished_at: float  # time.time()


def price(ctx: RequestContext, when: float) -> tuple[float, str | None]:
    """(cost in USD, price version id) of a finished request, at the version in force on its UTC day."""
    prices: Prices = ctx.snapshot.policy.prices
    model = ctx.served_model  # a fallback's price when a fallback answered
    version = pricing.version_on(prices, model, times.utc_day(when))
    if version is None or model is None:
        return 0.0, None
    usage = pricing.Usage(ctx.prompt_tokens or 0, ctx.completion_tokens or 0, ctx.cached_tokens or 0)
    hit = bool(ctx.cache and ctx.cache.startswith("hit"))
    return (pricing.cost(prices, version, usage, ctx.service_class, ctx.batch is not None, hit),
            pricing.version_id(model, version))


def draft(ctx: RequestContext, finished_at: float) -> Draft | None:
    """The record of an authenticated request (an unauthenticated one belongs to no tenant: metrics only)."""
    tenant = ctx.tenant
    if tenant is None:
        return None
    t = ctx.timings
    return Draft({
        "id": f"{_PREFIX}-{next(_counter):x}", "request_id": ctx.request_id, "tenant": tenant.name,
        "key_id": ctx.key_id, "tier": tenant.tier, "service_class": ctx.service_class, "model": ctx.served_model,
        "endpoint": ctx.endpoint.name, "stream": ctx.stream, "status": ctx.status, "error": ctx.error,
        "prompt_tokens": ctx.prompt_tokens or 0, "completion_tokens": ctx.completion_tokens or 0,
        "cached_tokens": ctx.cached_tokens or 0, "cache": ctx.cache, "estimated": ctx.usage_estimated,
        "batch": ctx.batch, "cost_usd": ctx.cost_usd, "price_version": ctx.price_version,
        "queue_wait_ms": _ms(t.queue_wait), "ttft_ms": _ms(t.ttft), "total_ms": _ms(t.total), "worker": ctx.worker,
        "worker_ms": None if ctx.worker is None or t.dispatch_at is None or t.total is None
        else _ms(t.total - t.dispatch_at), "tags": ctx.tags,
    }, finished_at)


def complete(d: Draft) -> dict[str, Any]:
    """On the writer's thread: the record's UTC time, formatted."""
    d.fields["time"] = times.at(d.finished_at)
    return d.fields


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)
