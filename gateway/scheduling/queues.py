"""The waiting requests of one pool: a queue per class, fair between tenants inside a class, FIFO inside a tenant.

Fairness is weighted fair queuing in tokens: each tenant carries a virtual time that grows by a request's
token cost divided by the tenant's weight when it is granted; the tenant with the lowest virtual time goes
next. A tenant that was idle starts at the class's current virtual time, so idling earns no credit and a
flooding tenant cannot starve a quiet one.
"""

from __future__ import annotations

import asyncio
import collections
import math
from dataclasses import dataclass, field

from gateway.context import RequestContext
from gateway.fleet.worker import Worker
from gateway.policy.schema import TIERS, Pool, SchedulingPolicy

ACTIVE_S = 60.0  # a tenant that asked this recently counts as using the pool, at most
# A tenant that has not asked for this many of its own mean gaps between requests has stopped, whatever ACTIVE_S
# says: a Poisson sender leaves such a gap once in e^20 of its requests, while a flood at 18 a second is known
# gone in about a second (a minute's claim held its demand free for it: a quiet tenant using a third of the pool
# queued alone, its p95 522 ms, beside 8 slots left for a flood that had stopped, loadtest/RESULTS.md).
IDLE_GAPS = 20.0
ACTIVE_FLOOR_S = 1.0
GAP_WEIGHT = 0.1  # how fast a tenant's mean gap follows its latest ones
# A stream still before its first token this long after its grant (this many of the workers' least TTFTs, at
# least STUCK_MIN_S) is stuck (a worker that hangs), not prefilling: pacing stops counting it, or one hung
# upstream would hold its tenant's flow to the bound until the upstream's timeout.
STUCK_TTFTS = 20.0
STUCK_MIN_S = 2.0
FORGET_S = 600.0  # what is kept of a tenant that has not asked for this long is dropped (forget_idle)
ARRIVALS_KEPT = 64  # a tenant's recent arrivals from which its concurrency is read
# Arrivals before a tenant's average use is read (usage): its rate over n arrivals is within about 1/sqrt(n) of
# the truth; 64 took a tenant at 0.4 req/s two and a half minutes, and its requests were shed meanwhile.
USAGE_ARRIVALS = 16


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

    def forget_caught_up(self) -> None:
        """Drop the virtual times of tenants not queued that the class has caught up with: push starts them at
        the class's time anyway, so nothing changes but the memory kept for tenants that come no more."""
        for tenant in [t for t, v in self.virtual.items() if v <= self.now and t not in self.tenants]:
            del self.virtual[tenant]

    def ahead_of(self, tenant: str) -> int:
        """How many waiters go before a new one of ``tenant``: its own, and of each other tenant as many as one
        more than its own (fair turns; weights and token sizes left out, as a forecast may)."""
        own = len(self.tenants.get(tenant, ()))
        return own + sum(min(len(fifo), own + 1) for name, fifo in self.tenants.items() if name != tenant)

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


@dataclass
class PoolState:
    """One pool's queues and counts: created and kept by the controller under the pool's name, and re-pointed
    to a replacing pool's workers on a policy reload, so queued and admitted requests stay counted; only the
    controller changes it (others read a QueueView)."""

    name: str
    workers: list[Worker]
    spec: Pool
    granted: int = 0  # admitted and not yet released
    premium: int = 0  # of those, premium requests
    held: dict[str, int] = field(default_factory=dict)  # granted, by tenant
    seen: dict[tuple[str, str], float] = field(default_factory=dict)  # (class, tenant) -> when it last asked
    gaps: dict[tuple[str, str], float] = field(default_factory=dict)  # (class, tenant) -> its mean gap between
    # requests (asked)
    overlaps: dict[str, collections.deque[int]] = field(default_factory=dict)  # tenant -> its own in flight or
    # queued at each of its recent arrivals
    arrived_at: dict[str, collections.deque[float]] = field(default_factory=dict)  # tenant -> when they came
    hold_s: dict[str, float] = field(default_factory=dict)  # tenant -> how long its requests hold a slot (mean)
    granted_at: dict[int, float] = field(default_factory=dict)  # a granted request's key (id of its context) -> when
    queues: dict[str, ClassQueue] = field(default_factory=lambda: {t: ClassQueue() for t in TIERS})
    queued_bytes: int = 0
    completions: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=256))
    elsewhere: dict[str, dict[str, int]] = field(default_factory=dict)  # class -> tenant -> what the other gateway
    # processes report it holds in this pool (their heartbeats: Controller.fleet_changed)
    starting: dict[str, set[int]] = field(default_factory=dict)  # tenant -> its streams granted that have not
    # shown a first token (by id() of their contexts: a client chooses its X-Request-Id, and may repeat one)
    prefilling: dict[int, tuple[str, int, bool]] = field(default_factory=dict)  # of those, the ones sent: key ->
    # the worker's URL, the body's bytes, and whether their tenant was under its share (sent_to; two workers or more)

    def take(self, tenant: str, klass: str, key: int, now: float, stream: bool = False) -> None:
        """A slot granted to the request ``key`` (the id of its context: a client chooses its X-Request-Id,
        and may repeat one); ``stream``: it is starting until its first token."""
        self.granted += 1
        self.premium += klass == "premium"
        self.held[tenant] = self.held.get(tenant, 0) + 1
        self.granted_at[key] = now
        if stream:
            self.starting.setdefault(tenant, set()).add(key)

    def sent_to(self, key: int, url: str, size: int, light: bool) -> None:
        """The starting stream ``key`` (a body of ``size`` bytes) was sent to the worker at ``url`` (``light``: of
        a tenant under its share)."""
        self.prefilling[key] = (url, size, light)

    def contention(self, now: float) -> tuple[collections.Counter[str], set[str]]:
        """Per worker URL, the bytes of the streams sent there still before their first token (not stuck: see
        STUCK_TTFTS), the prefill work in its engine's steps; and the URLs where one of them is of a tenant
        under its share."""
        counts: collections.Counter[str] = collections.Counter()
        guarded = set()
        since = self._stuck_before(now)
        for key, (url, size, light) in self.prefilling.items():
            if self.granted_at.get(key, now) < since:
                continue
            counts[url] += size
            if light:
                guarded.add(url)
        return counts, guarded

    def started(self, tenant: str, key: int) -> None:
        """The request's first token came (or it ended without one): it is past its prefill."""
        self.prefilling.pop(key, None)
        ids = self.starting.get(tenant)
        if ids is not None:
            ids.discard(key)
            if not ids:
                del self.starting[tenant]

    def give(self, tenant: str, klass: str, key: int, now: float | None = None) -> None:
        """The request ``key`` gave its slot back; ``now``: it ran (it teaches how long the tenant's hold a
        slot), not None for a request granted and left before it started."""
        self.granted -= 1
        self.premium -= klass == "premium"
        left = self.held.get(tenant, 1) - 1
        if left > 0:
            self.held[tenant] = left
        else:
            self.held.pop(tenant, None)
        self.started(tenant, key)
        since = self.granted_at.pop(key, None)
        if since is not None and now is not None:
            mean = self.hold_s.get(tenant)
            self.hold_s[tenant] = now - since if mean is None else mean + GAP_WEIGHT * (now - since - mean)

    def asked(self, klass: str, tenant: str, now: float) -> None:
        """A request of ``tenant`` in ``klass`` asks for a slot now: when it last asked, and how often it asks."""
        key = (klass, tenant)
        last = self.seen.get(key)
        if last is not None:
            gap, mean = now - last, self.gaps.get(key)
            self.gaps[key] = gap if mean is None else mean + GAP_WEIGHT * (gap - mean)
        self.seen[key] = now

    def forget_idle(self, now: float) -> None:
        """Drop what is kept of the tenants that have not asked for FORGET_S and hold and queue nothing (their gaps,
        overlaps, arrivals, hold times, and virtual times no later than their class's), so what a pool keeps
        is bounded by its tenants of the last minutes, not by every tenant it ever served."""
        queued = {tenant for queue in self.queues.values() for tenant in queue.tenants}
        idle = {key for key, t in self.seen.items()
                if now - t >= FORGET_S and not self.held.get(key[1]) and key[1] not in queued}
        for key in idle:
            del self.seen[key]
            self.gaps.pop(key, None)
        kept = {tenant for _, tenant in self.seen} | queued | set(self.held)
        for tenant in [t for t in {*self.overlaps, *self.hold_s} if t not in kept]:
            self.overlaps.pop(tenant, None)
            self.arrived_at.pop(tenant, None)
            self.hold_s.pop(tenant, None)
        for queue in self.queues.values():
            queue.forget_caught_up()

    def _active(self, key: tuple[str, str], last: float, now: float) -> bool:
        """Has the tenant asked recently enough, for how often it asks, to count as using the pool?"""
        gap = self.gaps.get(key)
        idle_s = ACTIVE_S if gap is None else min(ACTIVE_S, max(ACTIVE_FLOOR_S, IDLE_GAPS * gap))
        return now - last < idle_s

    def arrived(self, klass: str, tenant: str, now: float) -> None:
        """A request of ``tenant`` in ``klass`` asks for a slot: note when, and how many of its own it already
        has in flight or queued (queued too: a tenant held to its share would otherwise never show more)."""
        overlaps = self.overlaps.get(tenant)
        if overlaps is None:
            overlaps = self.overlaps[tenant] = collections.deque(maxlen=ARRIVALS_KEPT)
            self.arrived_at[tenant] = collections.deque(maxlen=ARRIVALS_KEPT)
        overlaps.append(self.held.get(tenant, 0) + len(self.queues[klass].tenants.get(tenant, ())))
        self.arrived_at[tenant].append(now)

    def demand(self, tenant: str) -> int:
        """The slots ``tenant`` needs so that 19 of 20 of its requests start at once, read from its recent
        arrivals (1 with none). Computed only when a pool is nearly full (blocked_tenants), not per request."""
        overlaps = self.overlaps.get(tenant)
        if not overlaps:
            return 1
        ranked = sorted(overlaps)
        return ranked[math.ceil(0.95 * len(ranked)) - 1] + 1

    def usage(self, tenant: str) -> float | None:
        """The slots ``tenant`` would hold on average if nothing held it back: its arrival rate (over its last
        ARRIVALS_KEPT requests; over its last 16 alone, whose rate is off by about a quarter, a quiet tenant
        at a third of capacity, 0.7 of its share, read 4.07x with 4 of 174 shed on the fairness matrix, against
        1.84x and none with all 64) times how long its requests hold a slot (Little's law). What it finds at its
        arrivals would count its own queue, so a tenant held back would look heavier the more it is. None
        before USAGE_ARRIVALS arrivals and one request's end: a new tenant's few are not yet its habit."""
        arrivals, hold = self.arrived_at.get(tenant), self.hold_s.get(tenant)
        if arrivals is None or len(arrivals) < USAGE_ARRIVALS or hold is None:
            return None
        span = arrivals[-1] - arrivals[0]
        return math.inf if span <= 0 else (len(arrivals) - 1) / span * hold

    def blocked_tenants(self, klass: str, total: int, scheduling: SchedulingPolicy, now: float,
                        reserved: int = 0) -> set[str]:
        """Tenants of ``klass`` that may not take the next slot, while taking it would leave fewer slots free
        than the other tenants need to start their next requests at once (at least one slot, at most
        ``tenant_headroom`` of the capacity; nothing is held back while more than that is free).

        The share: of what the class may take (``reserved``: slots held back for the classes above are neither
        room nor anyone's share), over the class's tenants using the pool (active_in). Each tenant is held
        free its demand, the slots 19 of 20 of its requests find at once (its own recent overlaps), up to the
        share; a tenant whose average use is under the share (``usage``) is held free its whole demand, past
        the share at a moment, and the others (over the share on average, or without a record yet) share
        what is left (or the share, if less).

        Why each part, measured (loadtest/RESULTS.md):
        - demand, not one slot: a tenant at 1 req/s of 0.8 s answers has 2 in flight when its next one comes
          about one arrival in seven (Poisson arithmetic); one free slot made its TTFT p95 6.3x what it had
          alone, its second request waiting for the flood's next release;
        - past the share on average use: a tenant at a third of the pool's capacity needs 11-12 of 16 slots at
          its bursts and 5-6 on average; held to its moment's share (8), its bursts waited for its own
          releases, up to its deadline (TTFT p95 602 ms against 90 alone, 4 of 174 shed). Use by its arrival
          rate and hold time, not by what it finds at its arrivals: held back, it finds its own queue and
          looks heavier the more it is held back; a share plus the unused part of it (a credit) was 9-10
          slots and left it at 245-303 ms;
        - the class's room: a share of the whole pool let a standard flood hold 8 of the 12 slots standard has
          of 16, and a quiet tenant needing 5 at its bursts queued for the flood's releases (313 ms against 83).
        - a tenant alone leaves the last slot to the class's tenants heard from within the minute (ACTIVE_S),
          not active now (their idle gaps): one of them that returns starts at once, rather than wait for the
          lone tenant's next answer to end. A flood that took a whole pool while a quiet tenant paused made the
          quiet tenant's first request back wait 661-671 ms (the fairness matrix's overload 3x cell: the flood
          filled the pool's 16 slots in 0.35 s and its first answers ended 0.6 s later; TTFT p95 1.88x what it
          had alone). It costs the lone tenant one slot of the pool for a minute after another's last request;
          a tenant never seen, or not for a minute, still waits for the next answer to end. Only while the lone
          tenant holds a slot: its own release then grants the last one once the minute is out, and in a pool
          whose class has one slot of room (two, less the premium reserve) it is not shed beside an idle slot.
        A lone tenant is never blocked otherwise.
        """
        if not scheduling.tenant_headroom:
            return set()
        room = total - reserved
        free_after = room - self.granted - 1
        cap = held_back(total, scheduling.tenant_headroom)
        if free_after >= cap:
            return set()
        active = self.active_in(klass, now)
        if len(active) < 2:
            lone = set(active)
            returning = set(self.active(now).get(klass, ())) - lone  # heard from within the minute, not active
            return lone if lone and free_after < 1 and self.held.get(active[0], 0) > 0 and returning else set()
        fair = room / len(active)
        entitled = {t: max(fair, self.demand(t)) for t in active if self._light(t, fair)}
        rest = [t for t in active if t not in entitled]
        share = min(fair, max(1.0, room - sum(entitled.values())) / len(rest)) if rest else fair
        reserve = 0
        heavy: set[str] = set()
        for tenant in active:
            held, mine = self.held.get(tenant, 0), entitled.get(tenant, share)
            if held >= mine:
                heavy.add(tenant)
            else:
                reserve += max(0, min(self.demand(tenant), math.ceil(mine)) - held)
        return heavy if free_after < min(max(1, reserve), cap) else set()

    def under_share(self, klass: str, tenant: str, room: int, now: float) -> bool:
        """Is ``tenant`` under its fair share of ``room`` (the slots ``klass`` may take), beside at least one
        other tenant of the class using the pool: holding less now, or using less on average (``usage``; a
        tenant at its share for a moment, in a burst, is not the overload either)? A tenant alone is the
        overload itself."""
        active = self.active_in(klass, now)
        if len(active) < 2:
            return False
        fair = room / len(active)
        return self.held.get(tenant, 0) < fair or self._light(tenant, fair)

    def paced(self, klass: str, room: int, now: float) -> set[str]:
        """Tenants of ``klass`` that may not take another slot yet: those holding at least their fair share
        of ``room`` (the slots the class may take) with as many streams before their first token as the pool's
        steady flow needs (``prefill_bound``).

        Why: equal answers started together end together, and the slots a wave of them frees went to the
        flooding tenant at once: the engine then prefilled the whole wave in one step (26 prompts of ~256
        tokens: about half a second on the simulator's arithmetic), and a quiet tenant's request arriving then
        waited for that step, 0.2 ms of its wait in the gateway's queue. Paced, the wave's slots refill as the
        prompts before them reach their first token, and what a new request waits behind in an engine is the
        flow's few prefills, not a wave's: on the fairness matrix's 2 x 64 cell the quiet tenant's TTFT p95
        beside the flood was 467, 401 and 585 ms unpaced, 317, 262 and 252 paced (66-70 ms alone), with the
        flood answering as many (with the bound at twice the least latency plus 50 ms; 214 and 168 ms at the
        least, prefill_bound; loadtest/RESULTS.md). Only streams are counted (a whole answer shows no first
        token), but a paced tenant's next request waits whatever it is: its queue is FIFO. Not a tenant using
        under its share on average (``usage``): its bursts are its own demand, held free for it
        (blocked_tenants), not the overload's waves, and paced they waited for their own first tokens."""
        least = max(1, len(self.workers))  # prefill_bound is never below this: most calls end here, unread
        if not any(len(ids) >= least for ids in self.starting.values()):
            return set()
        bound = self.prefill_bound(now)
        since = self._stuck_before(now)
        crowded = [t for t, ids in self.starting.items()
                   if len(ids) >= bound and sum(self.granted_at.get(i, now) > since for i in ids) >= bound]
        if not crowded:
            return set()
        active = self.active_in(klass, now)
        if len(active) < 2:
            return set()
        fair = room / len(active)
        return {t for t in crowded if t in active and self.held.get(t, 0) >= fair and not self._light(t, fair)}

    def _light(self, tenant: str, fair: float) -> bool:
        """Does ``tenant`` use less than ``fair`` slots on average (``usage``)?"""
        use = self.usage(tenant)
        return use is not None and use < fair

    def prefill_bound(self, now: float) -> int:
        """How many of one tenant's streams may be before their first token at once: the pool's completions
        per second times the workers' least times to a first token (their mean) (Little's law: the prompts the flow has
        starting while none queues in an engine), plus one per worker, so each engine has its next prompt.
        The least time, not the learner's uncongested bound (twice it, plus 50 ms): on the matrix's 2 x 64
        cell the quiet tenant's p95 was 214 and 168 ms against 317, 262 and 252, and the flood answered as
        many beside it (47.5-49.0 a second against 47.8-48.1), its engines being bound by prefill, not by how
        many prompts the gateway lets start at once."""
        return math.ceil(self.drain_rate(now) * self._least_ttft()) + max(1, len(self.workers))

    def _stuck_before(self, now: float) -> float:
        """A stream granted before this time and still without its first token is stuck, not prefilling."""
        return now - max(STUCK_MIN_S, STUCK_TTFTS * self._least_ttft())

    def _least_ttft(self) -> float:
        """The workers' least times to a first token (their mean; 0 while none is known)."""
        floors = [w.learned.ttft_floor for w in self.workers if w.learned.ttft_floor > 0]
        return sum(floors) / len(floors) if floors else 0.0

    def active_in(self, klass: str, now: float) -> list[str]:
        """The tenants of ``klass`` using this pool: holding a slot, or asked within the last minute and within
        IDLE_GAPS of their mean gaps (at least ACTIVE_FLOOR_S): a burst's own gaps are short, and a tenant
        whose burst still runs has not stopped."""
        return [key[1] for key, t in self.seen.items()
                if key[0] == klass and (self.held.get(key[1], 0) or self._active(key, t, now))]

    def active(self, now: float) -> dict[str, dict[str, int]]:
        """The tenants that asked for this pool in the last minute, by class, with what each holds here: what
        this process tells the others (its heartbeat). The minute, not active_in's gaps: what a tenant takes past
        its process's part is another replica's slot, and a tenant returning there waits for it to drain (a
        whole answer); judged by gaps, a flood spilled into the other replica's part as soon as the quiet tenant
        there paused, which then waited 320-570 ms on its return (TTFT p95 1.31 and 3.49x, against 1.03 and
        0.98x with the minute, loadtest/RESULTS.md)."""
        out: dict[str, dict[str, int]] = {}
        for (klass, tenant), t in self.seen.items():
            if now - t < ACTIVE_S:
                out.setdefault(klass, {})[tenant] = self.held.get(tenant, 0)
        return out

    def fleet_heavy(self, klass: str, whole: int, now: float) -> set[str]:
        """Tenants of ``klass`` holding at least their share of the fleet: ``whole`` (the workers' limits, every
        process's parts together) over the class's tenants active at any process, counting what each holds
        here and at the others. What a request takes past this process's part is another process's slot,
        where a tenant that only that process sees may be next: so it is judged by the fleet, not by the
        tenants this process alone sees (with one process the two agree)."""
        others = self.elsewhere.get(klass, {})
        active = {*self.active_in(klass, now), *others}
        if len(active) < 2:
            return set()
        fair = whole / len(active)
        return {t for t in active if self.held.get(t, 0) + others.get(t, 0) >= fair}

    def drain_rate(self, now: float, window: float = 10.0) -> float:
        """Requests finished per second over the recent window (0 when unknown)."""
        recent = [t for t in self.completions if now - t <= window]
        if len(recent) < 2:
            return 0.0
        return len(recent) / max(now - recent[0], 1e-3)


class QueueView:
    """A pool's queues as the rest of the gateway reads them (the pools' gauges, the scaling signal): read-only,
    so only the controller changes a pool's state."""

    __slots__ = ("_state",)

    def __init__(self, state: PoolState) -> None:
        self._state = state

    def depths(self) -> dict[str, int]:
        """Requests queued, by class."""
        return {klass: queue.count for klass, queue in self._state.queues.items()}

    @property
    def queued(self) -> int:
        """Requests queued, all classes."""
        return sum(queue.count for queue in self._state.queues.values())


def held_back(total: int, fraction: float) -> int:
    """Slots held back for a higher class: a share of the capacity, never all of it."""
    return min(math.ceil(total * fraction), max(0, total - 1))
