"""The waiting requests of one pool: a queue per class, fair between tenants inside a class, FIFO inside a tenant.

Fairness is weighted fair queuing in tokens: each tenant carries a virtual time that grows by a request's
token cost divided by the tenant's weight when it is granted; the tenant with the lowest virtual time goes
next. A tenant that was idle starts at the class's current virtual time, so idling earns no credit and a
flooding tenant cannot starve a quiet one.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field

from gateway.context import RequestContext


@dataclass(eq=False, slots=True)
class Waiter:
    ctx: RequestContext
    tenant: str
    weight: float
    cost: int  # tokens: prompt estimate + max_tokens
    size: int  # bytes held while queued
    enqueued_at: float
    future: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class ClassQueue:
    """One class's waiters: per-tenant FIFOs picked by lowest virtual time."""

    def __init__(self) -> None:
        self.tenants: dict[str, collections.deque[Waiter]] = {}
        self.virtual: dict[str, float] = {}  # tenant -> virtual time (tokens / weight)
        self.now = 0.0  # the class's virtual time: that of the last grant
        self.count = 0

    def push(self, waiter: Waiter) -> None:
        fifo = self.tenants.get(waiter.tenant)
        if fifo is None:
            fifo = self.tenants[waiter.tenant] = collections.deque()
            self.virtual[waiter.tenant] = max(self.virtual.get(waiter.tenant, 0.0), self.now)
        fifo.append(waiter)
        self.count += 1

    def pop(self, skip: set[str] | frozenset[str] = frozenset()) -> Waiter | None:
        """The next waiter: the head of the tenant with the lowest virtual time (not one of ``skip``)."""
        if not self.count:
            return None
        candidates = [t for t in self.tenants if t not in skip] if skip else self.tenants
        if not candidates:
            return None
        tenant = min(candidates, key=self.virtual.__getitem__)
        fifo = self.tenants[tenant]
        waiter = fifo.popleft()
        self.now = self.virtual[tenant]
        self.virtual[tenant] += waiter.cost / waiter.weight
        if not fifo:
            del self.tenants[tenant]
        self.count -= 1
        return waiter

    def remove(self, waiter: Waiter) -> bool:
        fifo = self.tenants.get(waiter.tenant)
        if fifo is None or waiter not in fifo:
            return False
        fifo.remove(waiter)
        if not fifo:
            del self.tenants[waiter.tenant]
        self.count -= 1
        return True

    def newest(self) -> Waiter | None:
        """The most recently queued waiter (the first to shed when a higher class needs room)."""
        newest: Waiter | None = None
        for fifo in self.tenants.values():
            if fifo and (newest is None or fifo[-1].enqueued_at > newest.enqueued_at):
                newest = fifo[-1]
        return newest

    def oldest_wait(self, now: float) -> float:
        heads = [fifo[0].enqueued_at for fifo in self.tenants.values() if fifo]
        return now - min(heads) if heads else 0.0

    def depth_by_tenant(self) -> dict[str, int]:
        return {tenant: len(fifo) for tenant, fifo in self.tenants.items()}
