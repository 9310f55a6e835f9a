"""Admission: hold each request in its pool's queues until a worker can start it, in the order the policy sets.

Guarantees:

- Between classes, strict priority: premium, then standard, then batch. No standard or batch request is granted
  while a premium one waits. Standard leaves ``premium_reserve`` of the slots to premium; batch takes a slot only
  when nothing interactive waits and ``batch_headroom`` stays free.
- Inside a class, flows (one per tenant) and the fairness policy (gateway.scheduling.flows): the served-token
  counter by default, ``fcfs`` for comparison. While two or more flows of a class are active, the flows served
  their equal share of the recent tokens or more leave free what the others' arrivals find in use at the p95,
  plus one slot (flows.ClassQueue.headroom; ``tenant_headroom``, the cap). No slot stays free while a request
  that may take it waits, beyond these reserves.
- Paced by prefill: while as many streams before their first token as the pool's steady flow needs are
  starting (its completions a second times the workers' least TTFT, plus one per worker; a stream without its
  first token after PREFILL_STUCK_S no longer counts) and two or more tenants hold or queue requests in the
  pool, the flows over their share of the recent tokens (the headroom's split) are not granted: their backlog
  waits here, in the fairness policy's order, not in the engines' prefill queues. A flow under its share is not
  held (its streams count among those starting); when none is under it, every flow of the class is. One tenant
  alone is not paced: there is nobody to order it against.
- Deadlines: each class has a longest queue wait (80% of its TTFT SLO by default). A standard or batch request
  whose forecast wait (the waiters fairness grants first, at the measured drain rate) would pass it is refused
  at once with 429 and a Retry-After; premium only at its deadline. A premium request still queued at half its
  deadline goes past this process's part of the workers' limits, unless its flow is over its share of the fleet,
  or pacing holds it as over its share of the recent tokens beside a flow under it.
- Refusals fall on the flood: a request that the forecast, its deadline or a full queue would refuse is kept
  while a flow of its class after it in the served-token order (higher counter, then more requests held and
  queued) has waiters, and the newest of those is refused in its place.
- Queues are bounded in count and bytes; when full, the newest batch waiter is shed first, then standard.
- A client that leaves while queued leaves the queue at once; nothing is sent upstream.
- Each grant charges its flow the request's token estimate; ``release`` corrects it to the work the engine did
  (prompt tokens not served from its cache, plus output tokens).

Each pool's queues and counts (queues.PoolState) are the controller's own, kept by pool name; the pools tell it
what changes (``track``, ``untrack``, ``metrics_changed``). ``admit`` hands the request its pool's state, which
it gives back to ``release``, ``with_room`` and ``first_token``. The clock is injectable (the tests' hand clock).
Imports shared leaves (context, errors, policy, ops metrics, state) and the fleet's worker model; never upstream.
Why, with figures: docs/decisions/003-scheduler-fairness.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping

from gateway.context import RequestContext
from gateway.errors import AnswerTooLarge, Shed, TenantBusy, Unavailable, UpstreamFailed
from gateway.fleet.worker import Worker
from gateway.ops.metrics import GatewayMetrics
from gateway.policy.schema import DEFAULT_TTFT_P95_MS, TIERS, Pool, SchedulingPolicy, Tier
from gateway.scheduling.capacity import answered, capacity, failed, learn, still_learning, worker_slots
from gateway.scheduling.flows import Flow, ServedTokens, Waiter, fairness_of
from gateway.scheduling.queues import PoolState, QueueView, kept_free
from gateway.state.replicas import ALONE, Share

BATCH_WAIT_S = 600.0
_DEADLINE_MARGIN_S = 0.01
DEADLINE_SHARE = 0.8  # a class's longest queue wait, as a share of its TTFT p95 objective
SPILL_SHARE = 0.5  # premium still queued after this share of its longest wait goes past this process's part
PREFILL_STUCK_S = 2.0  # a stream granted this long ago and still without its first token is stuck, not prefilling


def _contended(state: PoolState, flow: Flow | None) -> bool:
    """Is another tenant's request held or queued in the pool beside ``flow``'s (the head of a queue's, when
    None)? Pacing orders the backlog between tenants: with one tenant there is nobody to order it against, and
    holding its prefills back would only add to its own time to a first token."""
    tenants = {f.tenant for queue in state.queues.values() for f in queue.flows.values() if f.held or f.waiters}
    if flow is not None:
        tenants.add(flow.tenant)
    return len(tenants) > 1


class Controller:
    """Per-pool admission; the one place that counts what each pool has started."""

    def __init__(self, metrics: GatewayMetrics | None = None, clock: Callable[[], float] = time.monotonic,
                 share: Share = ALONE, scheduling: Callable[[], SchedulingPolicy] = SchedulingPolicy) -> None:
        """``scheduling``: the live scheduling policy, read when a scrape or a new share may grant (a request
        brings its own snapshot's); the default policy when none is given."""
        self.metrics = metrics
        self.clock = clock
        self.share = share  # this process's part of each worker's limit (set_share, as processes come and go)
        self._current_scheduling = scheduling
        self.states: dict[str, PoolState] = {}  # each pool's queues and counts, by pool name (track / untrack)
        self.tenant_inflight: dict[str, int] = {}

    # -- what the pools tell it ---------------------------------------------------------------------------

    def track(self, pool: str, workers: list[Worker], spec: Pool) -> QueueView:
        """The pool ``pool`` now has these workers: a new pool gets empty queues; one that a policy reload
        replaced keeps its queued and admitted requests counted, now against the new workers."""
        state = self.states.get(pool)
        if state is None:
            state = self.states[pool] = PoolState(pool, workers, spec)
        else:
            state.workers, state.spec = workers, spec
        return QueueView(state)

    def untrack(self, pool: str) -> None:
        """The pool is gone from the policy: its requests still admitted or queued keep the state they were handed
        (their releases grant within it); a pool of that name added later starts afresh."""
        self.states.pop(pool, None)

    def metrics_changed(self, pool: str) -> None:
        """Fresh metrics of the pool's workers: learn each one's concurrency, then grant what now fits; idle flows
        are collected."""
        state = self.states.get(pool)
        if state is not None:
            state.collect(self.clock())
            self._relearn(state, self._current_scheduling())

    def set_share(self, share: Share) -> None:
        """This process's new part of each worker's limit: each pool is read again as after a scrape."""
        self.share = share
        scheduling = self._current_scheduling()
        for state in self.states.values():
            self._relearn(state, scheduling)

    def fleet_changed(self, elsewhere: Mapping[str, dict[str, dict[str, int]]]) -> None:
        """What the other gateway processes' flows hold, per pool and class (their heartbeats)."""
        for name, state in self.states.items():
            state.elsewhere = elsewhere.get(name, {})

    def tenants(self) -> dict[str, dict[str, dict[str, int]]]:
        """This process's active flows, per pool and class, with what each holds: its heartbeat's."""
        now = self.clock()
        return {name: active for name, state in self.states.items() if (active := state.active(now))}

    def _relearn(self, state: PoolState, scheduling: SchedulingPolicy) -> None:
        wanted = state.first_waiting(TIERS) is not None
        for worker in state.workers:
            learn(worker, state.spec.max_inflight_per_worker, wanted)
        self.grant(state, scheduling)

    # -- the pipeline's calls -----------------------------------------------------------------------------

    async def admit(self, ctx: RequestContext, pool: str, cost: int, size: int) -> PoolState:
        """Return when the request may go to a worker of ``pool``, with the pool's state: the handle the request
        gives back to ``release``, ``with_room`` and ``first_token``. Raise Shed when it is turned away,
        TenantBusy when the tenant has its most in flight, Unavailable when no worker is healthy."""
        assert ctx.tenant is not None
        state = self.states.get(pool)
        if state is None:  # a pool the policy no longer has
            raise Unavailable(f"No worker pool serves the model '{ctx.served_model}' right now.",
                              "upstream_unavailable")
        started = self.clock()
        policy = ctx.snapshot.policy
        self._tenant_take(ctx, policy.server.tenant_max_concurrency)
        try:
            flow = state.queues[ctx.service_class].arrive(ctx.service_class, ctx.tenant.name, ctx.tenant.weight,
                                                          started)
            if policy.scheduling.mode == "fifo":
                state.take(flow, id(ctx), cost, now=started)
            else:
                await self._wait_turn(ctx, state, flow, policy.scheduling, cost, size)
        except BaseException:
            self._tenant_give(ctx)
            raise
        ctx.timings.queue_wait = self.clock() - started
        return state

    def release(self, ctx: RequestContext, state: PoolState, ended: BaseException | None = None) -> None:
        """Once per admitted request, with the state ``admit`` returned, when its answer is done (``ended``: what
        cut it short, if anything): learns from it, charges its flow the work done, frees its slot and grants
        what fits now."""
        self._tenant_give(ctx)
        if ctx.worker is not None:
            self._learn_from(ctx, state, ended)
        now = self.clock()
        served = None if ctx.prompt_tokens is None else \
            max(0, ctx.prompt_tokens - (ctx.cached_tokens or 0)) + (ctx.completion_tokens or 0)
        state.give(id(ctx), served, now=now)
        state.completions.append(now)
        self.grant(state, ctx.snapshot.policy.scheduling)

    @contextlib.contextmanager
    def tenant_held(self, ctx: RequestContext) -> Iterator[None]:
        """``with scheduler.tenant_held(ctx):`` a request that starts nothing on an engine (a stored response
        read back) still counts against its tenant's most in flight: TenantBusy when that is reached."""
        self._tenant_take(ctx, ctx.snapshot.policy.server.tenant_max_concurrency)
        try:
            yield
        finally:
            self._tenant_give(ctx)

    def first_token(self, ctx: RequestContext, state: PoolState, worker: Worker, scheduling: SchedulingPolicy,
                    held: int, ttft: float) -> None:
        """A stream's first token from ``worker`` (``ttft``: the engine's part): learn from it, and grant what a
        larger limit now fits. A request sent past the limit may have waited in the engine: it teaches nothing."""
        state.starting.pop(id(ctx), None)
        if not ctx.past_limit:
            answered(worker, state.spec.max_inflight_per_worker, held, ttft)
        if state.first_waiting(TIERS) is not None:
            self.grant(state, scheduling)

    def with_room(self, state: PoolState, scheduling: SchedulingPolicy) -> set[Worker]:
        """The pool's workers that can start one more request now (they hold fewer than their limit), for the
        router to choose among. Empty when none can, or with one worker (nothing to choose)."""
        if len(state.workers) < 2:
            return set()
        now = self.clock()
        return {w for w in state.workers if w.inflight < worker_slots(w, state.spec, scheduling, now, self.share)}

    # -- the queues ---------------------------------------------------------------------------------------

    async def _wait_turn(self, ctx: RequestContext, state: PoolState, flow: Flow, scheduling: SchedulingPolicy,
                         cost: int, size: int) -> None:
        klass = ctx.service_class
        now = self.clock()
        if not any(w.available(now) for w in state.workers):
            raise Unavailable(f"No healthy worker serves the model '{ctx.model}' right now.", "upstream_unavailable")
        if self._fits_now(state, scheduling, klass, now, flow=flow):
            state.take(flow, id(ctx), cost, now=now, stream=ctx.stream)
            return
        deadline_s = self._max_wait(ctx, klass)
        # Premium is refused only at its deadline; nor is anything refused on a forecast while a worker's limit is
        # still being learned (the drain rate then says too little about the next seconds).
        learning = any(still_learning(w, now, scheduling) for w in state.workers)
        predicted = self._predicted_wait(state, klass, now, flow) if klass != "premium" and not learning else None
        if predicted is not None and predicted > deadline_s and not self._spare(state, scheduling, flow, False):
            raise self._shed(klass, "predicted_wait", predicted, "would wait past its class's deadline")
        self._make_room(state, scheduling, flow, size)
        waiter = Waiter(ctx, flow, cost, size, now)
        state.queues[klass].push(waiter)
        state.queued_bytes += size
        self.grant(state, scheduling)
        # a little before the deadline, so that a grant racing the timer still starts within it
        deadline_at = asyncio.get_running_loop().time() + max(0.0, deadline_s - _DEADLINE_MARGIN_S)
        try:
            if klass == "premium" and await self._spilled(state, scheduling, waiter, deadline_s * SPILL_SHARE):
                return
            while not await self._granted_by(waiter, deadline_at):
                if not (self._requeued(state, waiter) and self._spare(state, scheduling, flow, True)):
                    self._forget(state, waiter)
                    raise self._shed(klass, "deadline", self._predicted_wait(state, klass, self.clock()) or
                                     deadline_s, "waited its class's longest queue wait")
                deadline_at += deadline_s
        except asyncio.CancelledError:  # the client left (or the server stops)
            if waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                state.give(id(ctx), now=self.clock())  # granted but never started: the slot to the next one
                self.grant(state, scheduling)
            else:
                self._forget(state, waiter)
            raise

    @staticmethod
    async def _granted_by(waiter: Waiter, at: float) -> bool:
        """Wait for the waiter's grant until loop time ``at``: True when granted (at the last moment too), False
        when the time passed; the Shed it was given when displaced."""
        try:
            async with asyncio.timeout_at(at):
                await waiter.future
            return True
        except TimeoutError:
            if waiter.future.done() and not waiter.future.cancelled():
                if (displaced := waiter.future.exception()) is not None:  # in the same step as its deadline
                    raise displaced from None
                return True  # granted at the last moment: keep it
            return False

    @staticmethod
    def _requeued(state: PoolState, waiter: Waiter) -> bool:
        """Give a waiter whose wait timed out a fresh future, if it is still queued."""
        if waiter not in waiter.flow.waiters:
            return False
        waiter.future = asyncio.get_running_loop().create_future()
        return True

    def _spare(self, state: PoolState, scheduling: SchedulingPolicy, flow: Flow, queued: bool) -> bool:
        """Refusals fall on the flood: a request of ``flow`` about to be refused (``queued``: already among its
        waiters) is spared when a flow after it in the served-token order (flows.ClassQueue.victim) has waiters,
        and the newest of them is refused instead (served tokens only)."""
        if not isinstance(fairness_of(scheduling), ServedTokens):
            return False
        victim = state.queues[flow.klass].victim(flow, queued)
        if victim is None:
            return False
        self._displace(state, victim, "a tenant served more makes way for one served less")
        return True

    async def _spilled(self, state: PoolState, scheduling: SchedulingPolicy, waiter: Waiter, after_s: float) -> bool:
        """Wait ``after_s`` for a grant; still waiting then, take a slot past this process's part of the limit
        when the premium requests held stay within the workers' whole limits, the flow is not over its share of
        the fleet, and pacing does not hold it as over its share of the recent tokens beside a flow under it
        (the spill is a way past this process's part, not past the order between flows: a flood pacing holds
        would go to the engines' prefill queues ahead of the quiet flow). True: it took one; past its part it
        lands in another replica's free slot, or at the head of the engine's queue, for the next of its
        sequences to end."""
        try:
            async with asyncio.timeout(after_s):
                await asyncio.shield(waiter.future)
        except TimeoutError:
            pass
        now = self.clock()
        if waiter.future.done() or not self._premium_within_limits(state, scheduling, now) or \
                waiter.flow in self._fleet_over(state, scheduling, now):
            return False
        if self._pacing(state, now, waiter.flow):
            over, under = state.queues["premium"].split(now)
            if under and waiter.flow in over:
                return False
        self._forget(state, waiter)
        state.take(waiter.flow, id(waiter.ctx), waiter.cost, now=now, stream=waiter.ctx.stream)
        waiter.ctx.past_limit = True
        return True

    def grant(self, state: PoolState, scheduling: SchedulingPolicy) -> None:
        """Grant queued requests while capacity allows: by class, then by the fairness policy between flows."""
        now = self.clock()
        fairness = fairness_of(scheduling)
        while True:
            klass = state.first_waiting(TIERS)
            if klass is None or not self._fits_now(state, scheduling, klass, now, queued=True):
                break
            total = capacity(state.workers, state.spec, scheduling, now, self.share)
            blocked = self._blocked(state, scheduling, klass, total, now)
            if klass == "premium" and state.granted >= total:  # past this process's part: the fleet's shares
                blocked |= self._fleet_over(state, scheduling, now)
            waiter = state.queues[klass].pop(fairness, blocked)
            if waiter is None:
                break  # only flows held back or paced wait in the top class: the slot stays free for the others
            state.queued_bytes -= waiter.size
            if waiter.future.done():
                continue
            state.take(waiter.flow, id(waiter.ctx), waiter.cost, now=now, stream=waiter.ctx.stream)
            waiter.future.set_result(None)

    @staticmethod
    def _learn_from(ctx: RequestContext, state: PoolState, ended: BaseException | None) -> None:
        """The end of an answer, for the worker that gave it: a worker failure, or a whole answer's time per
        output token (a stream's TTFT was learned at its first token, by the relay). A client that left or a
        request the worker refused says nothing."""
        worker = next((w for w in state.workers if w.url == ctx.worker), None)
        if worker is None:
            return
        ceiling = state.spec.max_inflight_per_worker
        if isinstance(ended, UpstreamFailed) and not isinstance(ended, AnswerTooLarge):  # a size the request
            failed(worker, ceiling)  # asked for says nothing of the worker's capacity
        elif ended is None and not ctx.stream and ctx.timings.ttft is not None and not ctx.past_limit:
            engine = ctx.timings.ttft - (ctx.timings.queue_wait or 0.0)
            answered(worker, ceiling, worker.inflight + 1, engine / max(1, ctx.completion_tokens or 0), whole=True)

    def _fits_now(self, state: PoolState, scheduling: SchedulingPolicy, klass: str, now: float,
                  queued: bool = False, flow: Flow | None = None) -> bool:
        """May a request of ``klass`` (of ``flow``) start now? (``queued``: it is the head of its queue.) With no
        ``flow`` neither the headroom nor pacing is checked: the caller's ``pop`` leaves out the flows they hold."""
        if not queued and state.first_waiting(TIERS[: TIERS.index(klass) + 1]) is not None:
            return False  # others of its class or above are waiting first
        total = capacity(state.workers, state.spec, scheduling, now, self.share)
        free = total - state.granted
        if flow is not None and flow in self._blocked(state, scheduling, klass, total, now, flow):
            return False
        if klass == "premium":
            return free > 0 or (self._premium_past_limit(state, scheduling, now)
                                and (flow is None or flow not in self._fleet_over(state, scheduling, now)))
        if klass == "batch" and (state.queues["premium"].count or state.queues["standard"].count):
            return False
        return free > self._reserved(total, scheduling, klass)

    def _pacing(self, state: PoolState, now: float, flow: Flow | None = None) -> bool:
        """Does pacing hold the pool now: streams are starting, as many as its steady flow needs (``_paced``),
        and another tenant than ``flow``'s (the head of a queue's, when None) holds or queues requests in it?"""
        return bool(state.starting) and self._paced(state, now) and _contended(state, flow)

    @staticmethod
    def _paced(state: PoolState, now: float) -> bool:
        """Are as many streams before their first token as the pool's steady flow needs? Its completions a second
        times the workers' least time to a first token, plus one per worker (Little's law: the prefills in flight
        when none waits in an engine). More would wait in the engines' prefill queues, where every flow waits
        alike; held here, the fairness policy orders them."""
        floors = [w.learned.ttft_floor for w in state.workers if w.learned.ttft_floor > 0]
        least = sum(floors) / len(floors) if floors else 0.0
        bound = math.ceil(state.drain_rate(now) * least) + len(state.workers)
        return state.prefilling(now, PREFILL_STUCK_S) >= bound

    def _premium_past_limit(self, state: PoolState, scheduling: SchedulingPolicy, now: float) -> bool:
        """May premium go past this process's limit now? Only to engines that schedule by priority
        (``engine_priority``), up to the workers' whole limits in premium requests."""
        return state.spec.engine_priority and self._premium_within_limits(state, scheduling, now)

    def _blocked(self, state: PoolState, scheduling: SchedulingPolicy, klass: str, total: int, now: float,
                 flow: Flow | None = None) -> set[Flow]:
        """The flows of ``klass`` that may not take the next slot now (``flow``: the request asking, counted among
        the tenants), by one split of the class (flows.ClassQueue.split: over or under their share of the recent
        tokens):

        - the headroom: those over their share, while taking the slot would leave fewer slots free than the flows
          under it need (flows.ClassQueue.headroom). What is kept free is of the slots the class holds or may
          take: not the reserves above it, nor what the other classes hold (nothing is preempted);
        - pacing: while as many streams before their first token as the pool's steady flow needs are starting
          and another tenant holds or queues requests in the pool (``_pacing``), those over their share, or every
          flow of the class when none is under it. A flow under its share is not held: its streams count among
          those starting. One tenant alone is not paced: there is nobody to order its backlog against.
        """
        room = total - self._reserved(total, scheduling, klass)
        cap = kept_free(room, scheduling.tenant_headroom)
        free_after = room - state.granted - 1
        short = cap > 0 and free_after < cap
        paced = self._pacing(state, now, flow)
        if not short and not paced:
            return set()
        queue = state.queues[klass]
        over, under = queue.split(now)
        if paced:
            return over if under else set(queue.flows.values())
        return over if under and free_after < queue.headroom(under, cap, now) else set()

    @staticmethod
    def _reserved(total: int, scheduling: SchedulingPolicy, klass: str) -> int:
        """The slots ``klass`` leaves to the classes above it: premium's reserve, and batch's headroom."""
        if klass == "premium":
            return 0
        reserve = kept_free(total, scheduling.premium_reserve)
        return reserve if klass == "standard" else max(reserve, kept_free(total, scheduling.batch_headroom))

    @staticmethod
    def _fleet_over(state: PoolState, scheduling: SchedulingPolicy, now: float) -> set[Flow]:
        """Premium flows holding their share of the workers' whole limits or more, across every process."""
        return state.queues["premium"].over_share(capacity(state.workers, state.spec, scheduling, now), now,
                                                  state.elsewhere.get("premium"))

    @staticmethod
    def _premium_within_limits(state: PoolState, scheduling: SchedulingPolicy, now: float) -> bool:
        """Does the premium this process holds stay below the workers' whole limits (not its part of them)?"""
        return state.premium < capacity(state.workers, state.spec, scheduling, now)

    def _predicted_wait(self, state: PoolState, klass: str, now: float, flow: Flow | None = None) -> float | None:
        """Seconds until a new request of ``klass`` (of ``flow``) would start: the waiters ahead of it (the
        classes above, and what fairness grants first in its own) at the drain rate."""
        rate = state.drain_rate(now)
        if rate <= 0:
            return None
        above = sum(state.queues[k].count for k in TIERS[: TIERS.index(klass)])
        queue = state.queues[klass]
        return (above + (queue.count if flow is None else queue.ahead_of(flow)) + 1) / rate

    def _make_room(self, state: PoolState, scheduling: SchedulingPolicy, flow: Flow, size: int) -> None:
        """Bound the queues: shed the newest of the lowest class below ``flow``'s, or of a flow over its share
        in its own class; else refuse this one."""
        klass = flow.klass
        while state.queues[klass].count >= scheduling.max_queued or \
                state.queued_bytes + size > scheduling.max_queued_bytes:
            victim_class = next((k for k in reversed(TIERS) if TIERS.index(k) > TIERS.index(klass)
                                 and state.queues[k].count), None)
            if victim_class is None or state.queues[klass].count >= scheduling.max_queued:
                if self._spare(state, scheduling, flow, False):
                    continue
                raise self._shed(klass, "queue_full", self._predicted_wait(state, klass, self.clock()) or 1.0,
                                 "found its queue full")
            victim = state.queues[victim_class].newest()
            assert victim is not None
            self._displace(state, victim, "was shed to make room for higher-priority work")

    def _displace(self, state: PoolState, victim: Waiter, why: str) -> None:
        self._forget(state, victim)
        if not victim.future.done():  # else its wait timed out or its client left, its task not yet resumed
            klass = victim.flow.klass
            victim.future.set_exception(self._shed(
                klass, "displaced", self._predicted_wait(state, klass, self.clock()) or 1.0, why))

    def _forget(self, state: PoolState, waiter: Waiter) -> None:
        if state.queues[waiter.flow.klass].remove(waiter):
            state.queued_bytes -= waiter.size

    # -- bookkeeping --------------------------------------------------------------------------------------

    @staticmethod
    def _max_wait(ctx: RequestContext, klass: Tier) -> float:
        policy = ctx.snapshot.policy
        override = policy.scheduling.tiers.get(klass)
        if override is not None and override.max_queue_wait_ms is not None:
            return override.max_queue_wait_ms / 1000
        if klass == "batch":
            return BATCH_WAIT_S
        tier = policy.tiers.get(klass)
        return (tier.slo.ttft_p95_ms if tier else DEFAULT_TTFT_P95_MS) * DEADLINE_SHARE / 1000

    def _tenant_take(self, ctx: RequestContext, cap: int) -> None:
        assert ctx.tenant is not None
        name = ctx.tenant.name
        held = self.tenant_inflight.get(name, 0)
        if held >= cap:
            raise TenantBusy(f"Too many requests in flight for this tenant (limit {cap}); retry shortly.")
        self.tenant_inflight[name] = held + 1

    def _tenant_give(self, ctx: RequestContext) -> None:
        assert ctx.tenant is not None
        name = ctx.tenant.name
        left = self.tenant_inflight.get(name, 1) - 1
        if left > 0:
            self.tenant_inflight[name] = left
        else:
            self.tenant_inflight.pop(name, None)

    def _shed(self, klass: str, reason: str, wait_s: float, why: str) -> Shed:
        """Count a request turned away, and say why: the outcome the caller raises."""
        if self.metrics is not None:
            self.metrics.shed.labels(klass, reason).inc()
        retry = max(1, math.ceil(wait_s))
        return Shed(f"The {klass} queue is too busy: this request {why}. Retry after {retry} s.", klass, reason, retry)

    def snapshot(self, pools: Iterable[str]) -> dict[str, dict[str, object]]:
        """What GET /admin/queues shows of these pools."""
        now = self.clock()
        states = [state for name in pools if (state := self.states.get(name)) is not None]
        return {s.name: {"granted": s.granted, "granted_by_tenant": s.held(),
                       "drain_rate_per_s": round(s.drain_rate(now), 2), "queued_bytes": s.queued_bytes,
                       "learned_limits": {w.url: w.learned.limit for w in s.workers},
                       "stream_limits": {w.url: round(w.learned.stream_limit, 1) for w in s.workers},
                       "agreed_limits": {w.url: w.agreed.limit for w in s.workers if w.agreed.limit},
                       "others_excess": {w.url: w.agreed.excess for w in s.workers if w.agreed.excess},
                       "share": {"index": self.share.index, "of": self.share.of, "ready": self.share.ready},
                       "classes": {k: {"depth": q.count, "oldest_wait_s": round(q.oldest_wait(now), 3),
                                       "flows": {f.tenant: {"held": f.held, "queued": len(f.waiters),
                                                            "counter": round(f.counter, 1)}
                                                 for f in q.flows.values()}} for k, q in s.queues.items()}}
                for s in states}
