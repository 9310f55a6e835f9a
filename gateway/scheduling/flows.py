"""Flows and the fairness between them inside one class of one pool.

A flow is one tenant's requests in one class: its FIFO of waiters, the slots it holds, and its counter, the
tokens it was served divided by its weight (a request is charged its estimate when granted and corrected to the
work the engine did at its release). Flows are created by their first request and collected when idle; nothing
else keeps per-tenant figures.

Guarantees (the properties in tests/inprocess/scheduling/test_fairness.py):

- ``served_tokens`` (the Virtual Token Counter): the flow with the least counter goes next, so two flows
  backlogged together stay within a bound of each other in charged tokens (``docs/decisions/003``). A flow that
  becomes active again (nothing held or queued) starts at the least counter of the flows queueing, less what
  they have in flight: neither idling nor flooding buys anything. At equal counters the flow with fewer requests
  outstanding (held and queued) goes first, so a returning flow takes the next slot its class frees beside flows
  with more; at equal outstanding too, the flow granted longest ago (round robin), so a flow just served does not
  go again ahead of one that waited, whatever the order their requests came in.
- ``fcfs``: the oldest waiter of the class goes next (the comparison, and the positive control of the tests).

Imports nothing of the gateway but the request context and the policy's schema.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import math
import statistics
from dataclasses import dataclass, field
from typing import ClassVar

from gateway.context import RequestContext
from gateway.policy.schema import SchedulingPolicy

ACTIVE_S = 10.0  # a flow that asked within this long is active (others hold its headroom), queued or not
STARTS_AT_ONCE = 0.95  # of a quiet flow's arrivals, the share the headroom is sized to start at once (the SLOs' p95)


@dataclass(eq=False, slots=True)
class Flow:
    klass: str
    tenant: str
    weight: float = 1.0
    waiters: collections.deque[Waiter] = field(default_factory=collections.deque)
    held: int = 0  # granted and not yet released
    counter: float = 0.0  # tokens served / weight, the requests in flight at their estimates
    pending: float = 0.0  # of which the estimates of the requests in flight
    seen: float = 0.0  # when it last asked
    turn: int = 0  # the pool's grant count at its last grant (queues.PoolState.take)
    tokens_recent: float = 0.0  # tokens charged over about the last ACTIVE_S, as of ``accounted``
    slots_recent: float = 0.0  # slots held on average over about the last ACTIVE_S, as of ``accounted``
    accounted: float = 0.0  # when ``held`` or the charges last changed

    def active(self, now: float) -> bool:
        return bool(self.held or self.waiters) or now - self.seen < ACTIVE_S

    def account(self, now: float, held: int, tokens: float, charged_at: float) -> None:
        """At ``now`` the flow holds ``held`` more slots and is charged ``tokens`` more (over its weight) on the
        counter. The recent averages are brought up to ``now`` first; ``tokens`` count in the recent sum as of
        ``charged_at``, the grant they belong to (a release's correction decays with its estimate, so what a
        request leaves in the sum is the work done, decayed from its grant: never below zero)."""
        decay = math.exp(-max(0.0, now - self.accounted) / ACTIVE_S)
        since = math.exp(-max(0.0, now - charged_at) / ACTIVE_S)
        self.tokens_recent = max(0.0, self.tokens_recent * decay + tokens * since)
        self.slots_recent = self.held + (self.slots_recent - self.held) * decay
        self.accounted = max(self.accounted, now)
        self.held += held
        self.counter += tokens

    def recent_tokens(self, now: float) -> float:
        """Tokens charged over about the last ACTIVE_S: a sum decaying with that time constant."""
        return self.tokens_recent * math.exp(-max(0.0, now - self.accounted) / ACTIVE_S)

    def recent_slots(self, now: float) -> float:
        """Slots held on average over about the last ACTIVE_S (Little's law read directly: a time average decaying
        with that time constant)."""
        return self.held + (self.slots_recent - self.held) * math.exp(-max(0.0, now - self.accounted) / ACTIVE_S)


@dataclass(eq=False, slots=True)
class Waiter:
    ctx: RequestContext
    flow: Flow
    cost: int  # tokens: prompt estimate + max_tokens (what the grant charges)
    size: int  # bytes held while queued
    enqueued_at: float
    future: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Fairness(abc.ABC):
    """Which backlogged flow of a class goes next."""

    name: ClassVar[str]

    @abc.abstractmethod
    def key(self, flow: Flow) -> tuple[float, float, float]:
        """The flow with the least key goes next (``flow`` has a waiter)."""


class ServedTokens(Fairness):
    name = "served_tokens"

    def key(self, flow: Flow) -> tuple[float, float, float]:
        return flow.counter, flow.held + len(flow.waiters), flow.turn


class Fcfs(Fairness):
    name = "fcfs"

    def key(self, flow: Flow) -> tuple[float, float, float]:
        return flow.waiters[0].enqueued_at, 0.0, 0.0


FAIRNESS: dict[str, Fairness] = {policy.name: policy for policy in (ServedTokens(), Fcfs())}


def fairness_of(scheduling: SchedulingPolicy) -> Fairness:
    """The fairness policy the scheduling policy names."""
    return FAIRNESS[scheduling.fairness]


def _order(flow: Flow) -> tuple[float, int]:
    """Where ``flow`` stands in the served-token order (its counter, then its requests held and queued)."""
    return flow.counter, flow.held + len(flow.waiters)


class ClassQueue:
    """One class's flows (the registry: created by ``arrive``, collected by ``collect``) and its waiters."""

    def __init__(self) -> None:
        self.flows: dict[str, Flow] = {}
        self.count = 0  # waiters queued

    def arrive(self, klass: str, tenant: str, weight: float, now: float) -> Flow:
        """The flow of ``tenant``, created on its first request; one that held and queued nothing is lifted to
        the least counter of the flows queueing (of those holding, when none queues), less their requests in
        flight (their estimates may yet be credited back), so idling earns no credit."""
        flow = self.flows.get(tenant)
        if flow is None:
            flow = self.flows[tenant] = Flow(klass, tenant, weight)
        if not flow.held and not flow.waiters:
            flow.counter = max(flow.counter, self._floor())
            if not flow.active(now):  # back from idle: its slots average stands as it was when it last ran
                flow.tokens_recent, flow.accounted = flow.recent_tokens(now), now
        flow.weight, flow.seen = weight, now
        return flow

    def push(self, waiter: Waiter) -> None:
        waiter.flow.waiters.append(waiter)
        self.count += 1

    def pop(self, fairness: Fairness, skip: set[Flow] | frozenset[Flow] = frozenset()) -> Waiter | None:
        """The head of the flow that goes next (not one of ``skip``)."""
        candidates = [f for f in self.flows.values() if f.waiters and f not in skip]
        if not candidates:
            return None
        waiter = min(candidates, key=fairness.key).waiters.popleft()
        self.count -= 1
        return waiter

    def remove(self, waiter: Waiter) -> bool:
        if waiter not in waiter.flow.waiters:
            return False
        waiter.flow.waiters.remove(waiter)
        self.count -= 1
        return True

    def active(self, now: float) -> list[Flow]:
        return [f for f in self.flows.values() if f.active(now)]

    def over_share(self, room: int, now: float, elsewhere: dict[str, int] | None = None) -> set[Flow]:
        """The flows holding at least an equal share of ``room`` while two or more are active (``elsewhere``:
        what other gateway processes report each tenant holds, counted in). A flow alone is never over."""
        others = elsewhere or {}
        active = {f.tenant: f for f in self.active(now)}
        tenants = active.keys() | others.keys()
        if len(tenants) < 2:
            return set()
        fair = room / len(tenants)
        return {f for f in active.values() if f.held + others.get(f.tenant, 0) >= fair}

    def headroom(self, under: list[Flow], cap: int, now: float) -> int:
        """The slots kept free for the flows ``under`` their share (``split``'s second part), at most ``cap``:
        what their arrivals find in use at the STARTS_AT_ONCE quantile, plus one slot for the arrival itself,
        less what they hold now; at least one slot, and 0 with none under (every active flow alike). What an
        arrival finds in use is read as Poisson with the slots they held on average (requests that arrive at
        random and each hold a slot for a while: M/G/infinity), so at least STARTS_AT_ONCE of their arrivals
        start at once while the cap allows."""
        if cap <= 0 or not under:
            return 0
        usage = sum(f.recent_slots(now) for f in under)
        need = poisson_quantile(usage, STARTS_AT_ONCE) + 1 - sum(f.held for f in under)
        return min(max(1, need), cap)

    def split(self, now: float) -> tuple[set[Flow], list[Flow]]:
        """The active flows charged at least their mean over about the last ACTIVE_S (over their share), and the
        others; both empty with fewer than two active, and nobody over when all are alike. The charge is the
        counter's measure: tokens over the weight, estimates while in flight, the work done once released; so a
        flood is over from its first grants, and a flow of many short requests is not over for holding a
        slot."""
        active = self.active(now)
        if len(active) < 2:
            return set(), []
        share = sum(f.recent_tokens(now) for f in active) / len(active)
        over = {f for f in active if f.recent_tokens(now) >= share}
        under = [f for f in active if f not in over]
        return (over, under) if under else (set(), [])

    def victim(self, spared: Flow, queued: bool) -> Waiter | None:
        """Who is refused in place of a request of ``spared`` (``queued``: that request is among its waiters, else
        it is about to join them): the newest waiter of the flow served most, by counter and then by requests
        outstanding (held and queued) as the served-token order breaks its ties, if that flow comes after
        ``spared`` in that order. A flow back from idle is lifted to the busy flows' least counter, so at a tie it
        is the one with fewer outstanding and is spared; two flows alike in both are not each other's victims."""
        mine = (spared.counter, spared.held + len(spared.waiters) + (0 if queued else 1))
        later = [f for f in self.flows.values() if f.waiters and f is not spared and _order(f) > mine]
        return max(later, key=_order).waiters[-1] if later else None

    def ahead_of(self, flow: Flow) -> int:
        """How many waiters go before a new one of ``flow``: its own, and of each other flow as many as one more
        than its own (fair turns; a forecast may leave token sizes out)."""
        own = len(flow.waiters)
        return own + sum(min(len(f.waiters), own + 1) for f in self.flows.values() if f is not flow)

    def newest(self) -> Waiter | None:
        """The most recently queued waiter (the first to shed when a higher class needs room)."""
        tails = [f.waiters[-1] for f in self.flows.values() if f.waiters]
        return max(tails, key=lambda w: w.enqueued_at) if tails else None

    def oldest_wait(self, now: float) -> float:
        heads = [f.waiters[0].enqueued_at for f in self.flows.values() if f.waiters]
        return now - min(heads) if heads else 0.0

    def collect(self, now: float) -> None:
        """Drop the flows idle (nothing held or queued, not asked for ACTIVE_S) whose counter is no more than the
        one a returning flow is lifted to (every idle one, when none is busy: there is nobody to be fair to):
        they lose nothing, and the registry stays bounded."""
        floor = self._floor()
        floor = math.inf if floor == -math.inf else floor
        for tenant in [t for t, f in self.flows.items() if not f.active(now) and f.counter <= floor]:
            del self.flows[tenant]

    def _floor(self) -> float:
        """What a returning flow is lifted to: the least counter of the flows queueing (of those holding, when
        none queues; -inf with neither), less their requests in flight (their estimates may be credited back)."""
        busy = [f.counter - f.pending for f in self.flows.values() if f.waiters] or \
            [f.counter - f.pending for f in self.flows.values() if f.held]
        return min(busy, default=-math.inf)


def poisson_quantile(mean: float, p: float) -> int:
    """The least n with P(N <= n) >= p for N ~ Poisson(``mean``); past a mean of 100 the normal approximation
    (its p95 within a slot of the exact one there)."""
    if mean > 100:
        return math.ceil(mean + statistics.NormalDist().inv_cdf(p) * math.sqrt(mean))
    term = total = math.exp(-mean)
    n = 0
    while total < p:
        n += 1
        term *= mean / n
        total += term
    return n
