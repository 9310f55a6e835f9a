"""Admission between validation and dispatch: the one place where a request may be held or turned away.

Today it caps the requests each tenant has in flight (the policy's server.tenant_max_concurrency), so one
tenant's flood cannot hold every connection and worker slot; the priority scheduler (premium/standard/batch
queues, tenant fairness, deadline-aware shedding) will replace the body of ``admit``. Callers time nothing
themselves and call ``release`` once for every admitted request.
"""

from __future__ import annotations

import time

from gateway.context import RequestContext
from gateway.openai_api import ApiError


class Scheduler:
    def __init__(self) -> None:
        self.inflight: dict[str, int] = {}  # tenant -> admitted requests not yet released

    async def admit(self, ctx: RequestContext) -> None:
        started = time.perf_counter()
        assert ctx.tenant is not None
        name = ctx.tenant.name
        held = self.inflight.get(name, 0)
        cap = ctx.snapshot.policy.server.tenant_max_concurrency
        if held >= cap:
            raise ApiError(429, f"Too many requests in flight for this tenant (limit {cap}); retry shortly.",
                           "rate_limit_error", "tenant_concurrency_exceeded", headers=[(b"retry-after", b"1")])
        self.inflight[name] = held + 1
        ctx.timings.queue_wait = time.perf_counter() - started

    def release(self, ctx: RequestContext) -> None:
        """Called once per admitted request when it is done."""
        assert ctx.tenant is not None
        name = ctx.tenant.name
        left = self.inflight[name] - 1
        if left:
            self.inflight[name] = left
        else:
            del self.inflight[name]
