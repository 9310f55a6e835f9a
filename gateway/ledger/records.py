"""One ledger record per request: drafted at finish on the event loop (plain values, no formatting),
completed on the writer's thread (UTC time, price version, cost)."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gateway.context import RequestContext
from gateway.ledger import prices as pricing
from gateway.policy.schema import Prices

_PREFIX = "rec-" + os.urandom(6).hex()
_counter = itertools.count()


@dataclass(slots=True)
class Draft:
    fields: dict[str, Any]
    finished_at: float  # time.time()
    prices: Prices


def draft(ctx: RequestContext, finished_at: float) -> Draft | None:
    """The record of an authenticated request (an unauthenticated one belongs to no tenant: metrics only)."""
    tenant = ctx.tenant
    if tenant is None:
        return None
    t = ctx.timings
    return Draft({
        "id": f"{_PREFIX}-{next(_counter):x}", "request_id": ctx.request_id, "tenant": tenant.name,
        "key_id": ctx.key_id, "tier": tenant.tier, "service_class": ctx.service_class, "model": ctx.model,
        "endpoint": ctx.endpoint, "stream": ctx.stream, "status": ctx.status, "error": ctx.error,
        "prompt_tokens": ctx.prompt_tokens or 0, "completion_tokens": ctx.completion_tokens or 0,
        "cached_tokens": ctx.cached_tokens or 0, "cache": ctx.cache, "estimated": ctx.usage_estimated,
        "batch": ctx.batch, "queue_wait_ms": _ms(t.queue_wait), "ttft_ms": _ms(t.ttft), "total_ms": _ms(t.total),
        "worker": ctx.worker,
    }, finished_at, ctx.snapshot.policy.prices)


def complete(d: Draft) -> dict[str, Any]:
    record = d.fields
    when = datetime.fromtimestamp(d.finished_at, UTC)
    record["time"] = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    version = pricing.version_on(d.prices, record["model"], when.date())
    if version is None or not (record["prompt_tokens"] or record["completion_tokens"]):
        record["cost_usd"], record["price_version"] = 0.0, None if version is None else pricing.version_id(
            record["model"], version)
        return record
    usage = pricing.Usage(record["prompt_tokens"], record["completion_tokens"], record["cached_tokens"])
    record["cost_usd"] = pricing.cost(d.prices, version, usage, record["service_class"], record["batch"] is not None,
                                      bool(record["cache"] and record["cache"].startswith("hit")))
    record["price_version"] = pricing.version_id(record["model"], version)
    return record


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)
