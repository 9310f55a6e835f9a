"""Admission between validation and dispatch: the one place where a request may be held.

The priority scheduler (premium/standard/batch queues, tenant fairness, deadline-aware shedding)
replaces the body of ``admit``; callers already time the wait and always call ``release``.
Until then every request is admitted at once.
"""

from __future__ import annotations

import time

from gateway.context import RequestContext


class Scheduler:
    async def admit(self, ctx: RequestContext) -> None:
        started = time.perf_counter()
        ctx.timings.queue_wait = time.perf_counter() - started

    def release(self, ctx: RequestContext) -> None:
        """Called once per admitted request when it is done (the priority scheduler frees its slot here)."""
