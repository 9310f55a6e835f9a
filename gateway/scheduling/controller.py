"""Admission: hold each request in its pool's queues until a worker can start it, in the order the policy sets.

- Between classes, strict priority: premium, then standard, then batch. Standard leaves a share of the
  capacity (premium_reserve) to premium, and batch takes a slot only when no premium or standard request
  waits and a share (batch_headroom) stays free, so a premium request arriving next starts at once even when
  the slots below it finish in lockstep (equal answers started together end together).
- Inside a class, fair between tenants by tokens (queues.ClassQueue), FIFO inside a tenant.
- Granting is event-driven: a release or a metrics update grants what now fits; nothing polls.
- Deadlines: each class has a longest queue wait (80% of its TTFT SLO by default). A standard or batch request
  whose predicted wait (the work ahead of it at the measured drain rate) would pass it is answered at once with
  429 and a Retry-After; premium is not refused on a forecast; one still queued at its deadline gets the same.
  A premium request still queued at half its deadline goes past this process's part of the workers' limits
  (to where another replica's part is free, or to the head of the engine's own queue), unless its tenant is
  over its fair share. Queues are bounded in count and bytes; when full, the newest batch waiter is shed
  first, then standard; premium is refused only when nothing lower is queued.
- A client that leaves while queued leaves the queue at once (its task is cancelled; nothing is sent upstream).

Each pool's queues and counts (queues.PoolState) are the controller's own, kept by pool name. The pools tell it
what changes (gateway.upstream.pools names the calls): ``track`` when a pool's workers are placed or replaced by a
policy reload, ``untrack`` when a pool goes, ``metrics_changed`` after each scrape of a pool's workers (the one path
from a scrape to a grant). Everyone else reads a queues.QueueView, or ``snapshot``. ``admit`` hands the request
its pool's state once, and the request gives it back to ``release``, ``with_room`` and ``first_token``: one
lookup by name per request.

The clock is injectable, so the rules are unit-tested without sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping

from gateway.context import RequestContext
from gateway.errors import Shed, TenantBusy, Unavailable, UpstreamFailed
from gateway.fleet.worker import Worker
from gateway.ops.metrics import GatewayMetrics
from gateway.policy.schema import DEFAULT_TTFT_P95_MS, TIERS, Pool, SchedulingPolicy
from gateway.scheduling.capacity import answered, capacity, failed, learn, still_learning, worker_slots
from gateway.scheduling.queues import PoolState, QueueView, Waiter, held_back
from gateway.state.replicas import ALONE, Share

BATCH_WAIT_S = 600.0
_DEADLINE_MARGIN_S = 0.01
# A class's longest queue wait, as a share of its TTFT p95 objective: the rest is left for prefill and the first
# token (tens of milliseconds on these workers; the sources' scale-out bar is the same 80%).
DEADLINE_SHARE = 0.8
# A premium request still queued after this share of its longest wait goes past this process's part of the
# limit (Controller._spilled): half leaves the other half for the engine's next sequence to end.
SPILL_SHARE = 0.5


def _rounded(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 2)


class Controller:
    """Per-pool admission; the one place that counts what each pool has started."""

    def __init__(self, metrics: GatewayMetrics | None = None, clock: Callable[[], float] = time.monotonic,
                 share: Share = ALONE, scheduling: Callable[[], SchedulingPolicy] = SchedulingPolicy) -> None:
        """``scheduling``: the live scheduling policy, read when a scrape or a new share may grant (a request
        brings its own snapshot's); the default policy when none is given (the rule tests)."""
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
        """Fresh metrics of the pool's workers: learn each one's concurrency from them, then grant what now fits (a
        worker's waiting queue may have emptied); the pool forgets its long-idle tenants."""
        state = self.states.get(pool)
        if state is not None:
            state.forget_idle(self.clock())
            self._relearn(state, self._current_scheduling())

    def set_share(self, share: Share) -> None:
        """This process's new part of each worker's limit: a larger part may have room for what waits, so each pool
        is read again as after a scrape."""
        self.share = share
        scheduling = self._current_scheduling()
        for state in self.states.values():
            self._relearn(state, scheduling)

    def fleet_changed(self, elsewhere: Mapping[str, dict[str, dict[str, int]]]) -> None:
        """What the other gateway processes' tenants hold, per pool and class (their heartbeats): a premium
        request goes past this process's part only within its tenant's share of the fleet (_fleet_heavy)."""
        for name, state in self.states.items():
            state.elsewhere = elsewhere.get(name, {})

    def tenants(self) -> dict[str, dict[str, dict[str, int]]]:
        """This process's tenants of the last minute, per pool and class, with what each holds: its heartbeat's
        (PoolState.active)."""
        now = self.clock()
        return {name: active for name, state in self.states.items() if (active := state.active(now))}

    def _relearn(self, state: PoolState, scheduling: SchedulingPolicy) -> None:
        wanted = any(q.count for q in state.queues.values())
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
        if state is None:  # a pool the policy no longer has (nothing awaits between its lookup and this, today)
            raise Unavailable(f"No worker pool serves the model '{ctx.served_model}' right now.",
                              "upstream_unavailable")
        started = self.clock()
        policy = ctx.snapshot.policy
        self._tenant_take(ctx, policy.server.tenant_max_concurrency)
        try:
            if policy.scheduling.mode == "fifo":
                state.take(ctx.tenant.name, ctx.service_class, id(ctx), started, ctx.stream)
            else:
                await self._wait_turn(ctx, state, policy.scheduling, cost, size)
        except BaseException:
            self._tenant_give(ctx)
            raise
        ctx.timings.queue_wait = self.clock() - started
        return state

    def release(self, ctx: RequestContext, state: PoolState, ended: BaseException | None = None) -> None:
        """Once per admitted request, with the state ``admit`` returned, when its answer is done (``ended``: what
        cut it short, if anything): learns from it, frees its slot and grants what fits now."""
        self._tenant_give(ctx)
        if ctx.worker is not None:
            self._learn_from(ctx, state, ended)
        now = self.clock()
        state.give(ctx.tenant.name if ctx.tenant else "", ctx.service_class, id(ctx), now)
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

    # -- the queues ---------------------------------------------------------------------------------------

    async def _wait_turn(self, ctx: RequestContext, state: PoolState, scheduling: SchedulingPolicy, cost: int,
                         size: int) -> None:
        klass = ctx.service_class
        now = self.clock()
        if not any(w.available(now) for w in state.workers):
            # nothing to wait for: every worker is down or cooling down
            raise Unavailable(f"No healthy worker serves the model '{ctx.model}' right now.", "upstream_unavailable")
        tenant = ctx.tenant.name if ctx.tenant else ""
        state.asked(klass, tenant, now)
        if scheduling.tenant_headroom:
            state.arrived(klass, tenant, now)
        if self._fits_now(state, scheduling, klass, now, tenant=tenant):
            state.take(tenant, klass, id(ctx), now, ctx.stream)
            return
        deadline_s = self._max_wait(ctx, klass)
        # Premium is never refused on a forecast: slots free in waves, so the forecast is coarse, and a premium
        # request served a little late costs less (one slow TTFT) than one refused (an error). It waits for its
        # deadline. The other classes are refused at once when the forecast says they would miss theirs.
        # Nor while the pool's capacity is still being learned (a fresh engine doubling its limit): the drain
        # rate of the last seconds then says too little about the next ones, and would refuse what will fit.
        learning = any(still_learning(w, now, scheduling) for w in state.workers)
        predicted = self._predicted_wait(state, klass, now, tenant) if klass != "premium" and not learning else None
        if predicted is not None and predicted > deadline_s:
            raise self._shed(klass, "predicted_wait", predicted, "would wait past its class's deadline")
        self._make_room(state, scheduling, klass, size)
        waiter = Waiter(ctx, tenant, ctx.tenant.weight if ctx.tenant else 1.0, cost, size, now)
        state.queues[klass].push(waiter)
        state.queued_bytes += size
        self.grant(state, scheduling)  # a free slot that the tenants ahead may not take can be this one's
        # a little before the deadline, so that a grant racing the timer still starts within it
        deadline_at = asyncio.get_running_loop().time() + max(0.0, deadline_s - _DEADLINE_MARGIN_S)
        try:
            if klass == "premium" and await self._spilled(state, scheduling, waiter, deadline_s * SPILL_SHARE):
                return
            if await self._granted_by(waiter, deadline_at):
                return
            # Not the overload: a tenant under its share (now, or on average) waits one more deadline for the next
            # release (what it waits for is a slot others took while it held fewer, or one of its own, each
            # freed within one answer): on the fairness matrix's 1 x 4 cell a quiet tenant was shed at its 640 ms,
            # 1 of 20 in each of six runs, and none in four since.
            # Not batch: its deadline is minutes, and what it waits for is idle capacity, not a share.
            if scheduling.tenant_headroom and klass != "batch" and \
                    self._under_share(state, scheduling, klass, tenant) and self._requeued(state, waiter) and \
                    await self._granted_by(waiter, deadline_at + deadline_s):
                return
            self._forget(state, waiter)
            raise self._shed(klass, "deadline", self._predicted_wait(state, klass, self.clock()) or deadline_s,
                             "waited its class's longest queue wait")
        except asyncio.CancelledError:  # the client left (or the server stops)
            if waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                state.give(tenant, klass, id(ctx))  # granted but never started: the slot to the next one
                self.grant(state, scheduling)
            else:
                self._forget(state, waiter)
            raise

    @staticmethod
    async def _granted_by(waiter: Waiter, at: float) -> bool:
        """Wait for the waiter's grant until loop time ``at``: True when granted (at the last moment too), False
        when the time passed; the Shed it was given when displaced. (The future is awaited as it is: a timeout
        or a cancellation cancels it unless it was granted first, which is read here and by admit's handler;
        wait_for with shield cost two more futures and a task step per queued request.)"""
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
        """Give a waiter whose wait timed out a fresh future, if it is still queued (a grant may have passed
        over its cancelled one in the meantime: then it is not, and is shed)."""
        if waiter not in state.queues[waiter.ctx.service_class].tenants.get(waiter.tenant, ()):
            return False
        waiter.future = asyncio.get_running_loop().create_future()
        return True

    def _under_share(self, state: PoolState, scheduling: SchedulingPolicy, klass: str, tenant: str) -> bool:
        """Does ``tenant`` hold less than its fair share of what ``klass`` may take, beside other tenants?"""
        now = self.clock()
        total = capacity(state.workers, state.spec, scheduling, now, self.share)
        return state.under_share(klass, tenant, total - self._reserved(total, scheduling, klass), now)

    async def _spilled(self, state: PoolState, scheduling: SchedulingPolicy, waiter: Waiter, after_s: float) -> bool:
        """Wait ``after_s`` for a grant; still waiting then, take a slot past this process's part of the limit
        when the premium requests held stay within the workers' whole limits (True: it took one; it goes to an
        engine that is full, and starts there at the next end of any of its sequences).

        Why: this process's part of a worker is what it may fill, not what the worker has free. With two
        replicas a part of two 4-slot workers is 4 slots, and a burst of premium at one replica waited for one
        of its own four answers to end, past the deadline, while the other replica's reserved slot stood free
        (measured: 6 of 244 premium shed at 2x overload). Past the part it lands in the other replica's free
        slot, or, when the engine is full too, at the head of its queue: an engine that runs in arrival order
        holds nothing else waiting, since the gateway keeps every other class within the limit, so the wait
        there is for the next of all the engine's sequences to end, not of this process's share of them.
        Not for a tenant over its fair share of the class, counted across the fleet (``_fleet_heavy``): a flooding
        premium tenant's requests went past the limit into the engines' queues, and a quiet premium tenant's then
        waited behind them there (its TTFT p95 6.2x what it had alone, against 1.1-1.2x); and a tenant flooding
        one replica sees no other tenant there, while the slots past its part are the other replica's.
        Not at once: while this process's own answers end soon enough, waiting here chooses the first worker
        to free a slot instead of committing to one."""
        try:
            async with asyncio.timeout(after_s):
                await asyncio.shield(waiter.future)
        except TimeoutError:
            pass
        now = self.clock()
        if waiter.future.done() or not self._premium_within_limits(state, scheduling, now):
            return False
        if waiter.tenant in self._fleet_heavy(state, scheduling, now) or \
                waiter.tenant in self._held_back(state, scheduling, "premium", capacity(
                    state.workers, state.spec, scheduling, now, self.share), now):
            return False  # a tenant over its fair share waits here: in the engine it would queue ahead of the others
        self._forget(state, waiter)
        state.take(waiter.tenant, waiter.ctx.service_class, id(waiter.ctx), now, waiter.ctx.stream)
        waiter.ctx.past_limit = True
        return True

    def grant(self, state: PoolState, scheduling: SchedulingPolicy) -> None:
        """Grant queued requests while capacity allows, in priority order (skipping tenants at their cap)."""
        now = self.clock()
        while True:
            klass = next((k for k in TIERS if state.queues[k].count), None)
            if klass is None or not self._fits_now(state, scheduling, klass, now, queued=True):
                break
            total = capacity(state.workers, state.spec, scheduling, now, self.share)
            blocked = self._held_back(state, scheduling, klass, total, now)
            if klass == "premium" and state.granted >= total:  # past this process's part: the fleet's shares
                blocked |= self._fleet_heavy(state, scheduling, now)
            waiter = state.queues[klass].pop(skip=blocked)
            if waiter is None:
                break  # only tenants over their share wait in the top class: the slot stays free for others
            state.queued_bytes -= waiter.size
            if waiter.future.done():
                continue
            state.take(waiter.tenant, klass, id(waiter.ctx), now, waiter.ctx.stream)
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
        if isinstance(ended, UpstreamFailed):
            failed(worker, ceiling)
        elif ended is None and not ctx.stream and ctx.timings.ttft is not None and not ctx.past_limit:
            engine = ctx.timings.ttft - (ctx.timings.queue_wait or 0.0)
            answered(worker, ceiling, worker.inflight + 1, engine / max(1, ctx.completion_tokens or 0), whole=True)

    def first_token(self, ctx: RequestContext, state: PoolState, worker: Worker, scheduling: SchedulingPolicy,
                    held: int, ttft: float) -> None:
        """A stream's first token from ``worker`` (``ttft``: the engine's part): learn from it, and grant what
        now fits: a larger limit (a fresh engine without metrics grows within a few TTFTs, not stream ends), or
        the tenant's next stream if it was paced (queues.PoolState.paced). A request sent past the limit may
        have waited in the engine by design: it teaches nothing."""
        state.started(ctx.tenant.name if ctx.tenant else "", id(ctx))
        if not ctx.past_limit:
            answered(worker, state.spec.max_inflight_per_worker, held, ttft)
        if any(q.count for q in state.queues.values()):
            self.grant(state, scheduling)

    def _fits_now(self, state: PoolState, scheduling: SchedulingPolicy, klass: str, now: float,
                  queued: bool = False, tenant: str | None = None) -> bool:
        """May a request of ``klass`` start now? (``queued``: it is the head of its queue, nothing ahead.)"""
        if not queued and any(state.queues[k].count for k in TIERS[: TIERS.index(klass) + 1]):
            return False  # others of its class or above are waiting first
        total = capacity(state.workers, state.spec, scheduling, now, self.share)
        free = total - state.granted
        if tenant is not None and tenant in self._held_back(state, scheduling, klass, total, now):
            return False
        if klass == "premium":
            return free > 0 or (self._premium_past_limit(state, scheduling, now)
                                and (tenant is None or tenant not in self._fleet_heavy(state, scheduling, now)))
        if klass == "batch" and (state.queues["premium"].count or state.queues["standard"].count):
            return False
        return free > self._reserved(total, scheduling, klass)

    def sent(self, ctx: RequestContext, state: PoolState, size: int, worker: Worker) -> None:
        """A try of the request goes to ``worker``: a stream before its first token is prefilling there (what
        ``with_room`` reads to keep other prefills off a quiet tenant's)."""
        tenant = ctx.tenant.name if ctx.tenant else ""
        if len(state.workers) > 1 and id(ctx) in state.starting.get(tenant, ()):
            scheduling = ctx.snapshot.policy.scheduling
            light = bool(scheduling.tenant_headroom) and self._under_share(state, scheduling, ctx.service_class,
                                                                           tenant)
            state.sent_to(id(ctx), worker.url, size, light)

    def with_room(self, state: PoolState, scheduling: SchedulingPolicy,
                  ctx: RequestContext | None = None) -> set[Worker]:
        """The pool's workers that can start one more request now (they hold fewer than their limit), for the
        router to choose among: admission counts the pool's slots, and a worker chosen for its prefix or its
        load alone may be one already at its limit, where the request waits in the engine's own queue for a
        sequence to end while another engine has a slot free (measured: a quiet premium tenant's TTFT 216 and
        344 ms beside a flood, 0.1 ms of it in the gateway's queue). Empty when none can (premium past the limit
        on engines that schedule by priority), or with one worker (nothing to choose): then any available one."""
        if len(state.workers) < 2:
            return set()
        now = self.clock()
        room = {w for w in state.workers if w.inflight < worker_slots(w, state.spec, scheduling, now, self.share)}
        if ctx is not None and len(room) > 1 and state.prefilling:
            room = self._least_contended(ctx, state, scheduling, room)
        return room

    def _least_contended(self, ctx: RequestContext, state: PoolState, scheduling: SchedulingPolicy,
                         room: set[Worker]) -> set[Worker]:
        """Of the workers with room, those where the request's prefill shares an engine step with the fewest
        others: for a tenant under its share, the workers with the least prefill in flight; for the others,
        those where no stream of such a tenant is prefilling (when there are any).

        Why: an engine runs every prompt admitted in one step together, and each running sequence waits for the
        step. On the fairness matrix's 2 x 64 cell the flood kept both engines prefilling most of the time, and
        a quiet tenant's request, started at once by the gateway (0.3 ms in its queue), waited there for the
        step in progress and then shared its own with the flood's new prompts: TTFT p95 224 ms beside the flood,
        62 alone; 147 ms with this (the same requests; the flood answered 48.2 a second against 49.2 before it,
        within the quiet tenant's slots). Prefill work is read as the bodies' bytes: by count of streams, 152 ms.
        Sending the flood's streams to the worker already prefilling most (so the other stays clear) was tried:
        one engine then took a flood's worth of prompts, and the quiet tenant's p95 went to 312 ms."""
        counts, guarded = state.contention(self.clock())
        tenant = ctx.tenant.name if ctx.tenant else ""
        if scheduling.tenant_headroom and self._under_share(state, scheduling, ctx.service_class, tenant):
            least = min(counts[w.url] for w in room)
            return {w for w in room if counts[w.url] == least}
        return {w for w in room if w.url not in guarded} or room

    def _premium_past_limit(self, state: PoolState, scheduling: SchedulingPolicy, now: float) -> bool:
        """May premium go past this process's limit now? Only to engines that schedule by priority
        (``engine_priority``): such an engine starts a premium request ahead of everything it has waiting (and,
        short of KV cache, preempts lower-priority ones first), so premium past the limit waits at the head of
        the engine's own queue for the next sequence there to end. Up to the workers' whole limits in premium
        requests, not this process's part of them: once replicas split each worker's limit, a process's part
        is two slots of four, and premium bursts waited past their deadline while the engines had room."""
        return state.spec.engine_priority and self._premium_within_limits(state, scheduling, now)

    def _held_back(self, state: PoolState, scheduling: SchedulingPolicy, klass: str, total: int,
                   now: float) -> set[str]:
        """Tenants of ``klass`` that may not take the next slot: over their share while others need room
        (blocked_tenants), or at their share with as many streams still starting as the flow needs (paced)."""
        reserved = self._reserved(total, scheduling, klass)
        blocked = state.blocked_tenants(klass, total, scheduling, now, reserved)
        if scheduling.tenant_headroom and state.starting:
            blocked |= state.paced(klass, total - reserved, now)
        return blocked

    @staticmethod
    def _reserved(total: int, scheduling: SchedulingPolicy, klass: str) -> int:
        """The slots ``klass`` leaves to the classes above it: premium's reserve, and batch's headroom."""
        if klass == "premium":
            return 0
        reserve = held_back(total, scheduling.premium_reserve)
        return reserve if klass == "standard" else max(reserve, held_back(total, scheduling.batch_headroom))

    @staticmethod
    def _fleet_heavy(state: PoolState, scheduling: SchedulingPolicy, now: float) -> set[str]:
        """Premium tenants that may not go past this process's part: those holding their share of the workers'
        whole limits or more, across every process (none when the policy keeps queue order alone)."""
        if not scheduling.tenant_headroom:
            return set()
        return state.fleet_heavy("premium", capacity(state.workers, state.spec, scheduling, now), now)

    @staticmethod
    def _premium_within_limits(state: PoolState, scheduling: SchedulingPolicy, now: float) -> bool:
        """Does the premium this process holds stay below the workers' whole limits (not its part of them)?"""
        return state.premium < capacity(state.workers, state.spec, scheduling, now)

    def _predicted_wait(self, state: PoolState, klass: str, now: float, tenant: str | None = None) -> float | None:
        """Seconds until a new request of ``klass`` (of ``tenant``) would start: the work ahead of it at the drain
        rate. Ahead of it: the classes above, and in its own class what fair queuing grants before it, not the
        whole queue (a quiet standard tenant beside a flooding one was refused on the flood's backlog: 20 of 47
        requests, when it goes next)."""
        rate = state.drain_rate(now)
        if rate <= 0:
            return None
        above = sum(state.queues[k].count for k in TIERS[: TIERS.index(klass)])
        queue = state.queues[klass]
        return (above + (queue.count if tenant is None else queue.ahead_of(tenant)) + 1) / rate

    def _make_room(self, state: PoolState, scheduling: SchedulingPolicy, klass: str, size: int) -> None:
        """Bound the queues: shed the newest of the lowest class below ``klass``; else refuse this one."""
        while state.queues[klass].count >= scheduling.max_queued or \
                state.queued_bytes + size > scheduling.max_queued_bytes:
            victim_class = next((k for k in reversed(TIERS) if TIERS.index(k) > TIERS.index(klass)
                                 and state.queues[k].count), None)
            if victim_class is None or state.queues[klass].count >= scheduling.max_queued:
                raise self._shed(klass, "queue_full", self._predicted_wait(state, klass, self.clock()) or 1.0,
                                 "found its queue full")
            victim = state.queues[victim_class].newest()
            assert victim is not None
            self._forget(state, victim)
            if victim.future.done():  # its wait timed out or its client left, its task not yet resumed
                continue
            victim.future.set_exception(self._shed(
                victim_class, "displaced", self._predicted_wait(state, victim_class, self.clock()) or 1.0,
                "was shed to make room for higher-priority work"))

    def _forget(self, state: PoolState, waiter: Waiter) -> None:
        if state.queues[waiter.ctx.service_class].remove(waiter):
            state.queued_bytes -= waiter.size

    # -- bookkeeping --------------------------------------------------------------------------------------

    @staticmethod
    def _max_wait(ctx: RequestContext, klass: str) -> float:
        policy = ctx.snapshot.policy
        override = policy.scheduling.tiers.get(klass)  # type: ignore[call-overload]
        if override is not None and override.max_queue_wait_ms is not None:
            return override.max_queue_wait_ms / 1000
        if klass == "batch":
            return BATCH_WAIT_S
        tier = policy.tiers.get(klass)  # type: ignore[call-overload]
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
        return {s.name: {"granted": s.granted, "granted_by_tenant": dict(s.held),
                       "tenant_demand": {t: {"at_once": s.demand(t), "mean": _rounded(s.usage(t))} for t in s.overlaps},
                       "drain_rate_per_s": round(s.drain_rate(now), 2), "queued_bytes": s.queued_bytes,
                       "learned_limits": {w.url: w.learned.limit for w in s.workers},
                       "stream_limits": {w.url: round(w.learned.stream_limit, 1) for w in s.workers},
                       "agreed_limits": {w.url: w.agreed.limit for w in s.workers if w.agreed.limit},
                       "share": {"index": self.share.index, "of": self.share.of, "ready": self.share.ready},
                       "classes": {k: {"depth": q.count, "oldest_wait_s": round(q.oldest_wait(now), 3),
                                       "by_tenant": q.depth_by_tenant()} for k, q in s.queues.items()}}
                for s in states}
