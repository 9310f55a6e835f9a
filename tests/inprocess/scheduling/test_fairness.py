"""The scheduler's guarantees as properties over arrival sequences, request sizes and pool shapes.

A discrete-event simulation drives the real Controller with a hand clock: requests arrive, are admitted, run
for a time that grows with their output, and are released with the tokens the engine did. After every event
(and at every grant) the trace is checked:

- fairness: two flows of a class both backlogged (requests queued) have counters within (S + 1) U of each
  other, U the largest charge of one request (its estimate or the work it did), S the pool's slots: one
  request's charge, and the estimates of the requests in flight, which release may credit back;
- a quiet flow (nothing held or queued when its request comes) starts at once or at the first release after it
  (beside flows with two or more requests outstanding: one with a single request is as quiet as it is), and is
  never refused while a flow over its share has requests queued;
- work conserving: no slot is free while a request that may take it waits, beyond the reserves (premium's,
  batch's, and the headroom held for flows under their share);
- premium never waits behind standard or batch: no lower class is granted while premium waits.

Each property has a positive control: a deliberately broken scheduler that the same check catches. The requests
are whole answers, except in the quiet flow's property, which runs them also as streams (a first token after a
prefill that grows with the prompt), so that the pacing by prefills in flight is in play there."""

from __future__ import annotations

import asyncio
import heapq
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.context import RequestContext
from gateway.endpoints import CHAT
from gateway.errors import Shed
from gateway.policy.loader import PolicySnapshot
from gateway.policy.schema import TIERS, Policy, SchedulingPolicy
from gateway.scheduling import controller as controller_module
from gateway.scheduling import flows
from gateway.scheduling.capacity import capacity
from gateway.scheduling.controller import Controller
from gateway.scheduling.flows import Flow, ServedTokens
from gateway.scheduling.queues import PoolState, kept_free
from tests.fakes import live_worker

TENANTS = {**{f"s{i}": "standard" for i in range(6)}, **{f"p{i}": "premium" for i in range(3)}, "b0": "batch"}


@dataclass(frozen=True)
class Req:
    tenant: str
    at: float  # arrival, hand-clock seconds
    prompt: int
    out: int  # output tokens the engine makes
    max_out: int  # what the request allows (the estimate's part); >= out
    cached: int = 0


@dataclass
class Trace:
    spread: list[tuple[float, float]] = field(default_factory=list)  # (counter spread, its bound) per check
    quiet_waited: list[str] = field(default_factory=list)  # a quiet request that missed the first release
    quiet_shed: list[str] = field(default_factory=list)  # a quiet request refused while a flow served more waited
    quiet_held: list[str] = field(default_factory=list)  # a quiet request under its share not started on a free slot
    idle: list[str] = field(default_factory=list)
    behind: list[str] = field(default_factory=list)  # a lower class granted while premium waited
    served: dict[str, int] = field(default_factory=dict)
    shed: dict[str, int] = field(default_factory=dict)


START = 1000.0


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def snapshot(deadline_ms: float, **scheduling: Any) -> PolicySnapshot:
    return PolicySnapshot.build(Policy.model_validate({
        "tenants": {name: {"tier": tier} for name, tier in TENANTS.items()},
        "models": {"m": {"pool": "p"}},
        "pools": {"p": {"workers": ["http://w0"], "max_inflight_per_worker": 256}},
        "server": {"tenant_max_concurrency": 10_000},
        "scheduling": {"max_queued": 10_000, **scheduling,
                       "tiers": {k: {"max_queue_wait_ms": deadline_ms} for k in TIERS}}}), "test")


async def settle() -> None:
    for _ in range(8):
        await asyncio.sleep(0)


def _counter_bound(reqs: list[Req], slots: int) -> float:
    """(S + 1) U: U the largest charge of one request (its estimate, or the work it did), S the pool's slots."""
    return (slots + 1) * max(max(r.prompt + r.max_out, r.prompt - r.cached + r.out) for r in reqs)


PREFILL_S = 0.00005  # a prompt token's prefill, for streams: a stream's first token comes this long a token in
FIRST, END = 0, 1  # what a running request's next event is


def simulate(reqs: list[Req], limits: list[int], quiet: str | None = None, deadline_ms: float = 1e9,
             streams: bool = False, **scheduling: Any) -> Trace:
    """Run ``reqs`` through a Controller over workers of ``limits``; ``quiet``: the tenant whose requests are
    checked to start by the first release after them; ``streams``: each request is streamed, and the controller
    hears its first token after its prefill."""
    return asyncio.run(_simulate(reqs, limits, quiet, deadline_ms, streams, scheduling))


async def _simulate(reqs: list[Req], limits: list[int], quiet: str | None, deadline_ms: float, streams: bool,
                    scheduling: dict[str, Any]) -> Trace:
    clock, trace = Clock(), Trace()
    snap = snapshot(deadline_ms, **scheduling)
    policy = snap.policy.scheduling
    workers = [live_worker(f"http://w{i}", scraped_at=clock.now, limit=n) for i, n in enumerate(limits)]
    for worker in workers:
        worker.learned.limit_found = True
    controller = Controller(clock=clock)
    controller.track("p", workers, snap.policy.pools["p"])
    state = controller.states["p"]
    bound = _counter_bound(reqs, sum(limits))
    _watch_grants(state, trace)
    arrivals = sorted(reqs, key=lambda r: r.at)
    running: list[tuple[float, int, int, RequestContext, Req]] = []  # (when, seq, FIRST or END, ...)
    waiting: dict[asyncio.Task[Any], tuple[RequestContext, Req]] = {}
    quiet_waiting: dict[str, int] = {}  # a quiet request -> releases since it came that were its to take
    seq = 0
    while arrivals or running or waiting:
        if not arrivals and not running:  # what waits can only be for a reserve: nothing will free it
            break
        arriving = bool(arrivals) and (not running or START + arrivals[0].at <= running[0][0])
        clock.now = max(clock.now, START + arrivals[0].at if arriving else running[0][0])
        for worker in workers:
            worker.observed.scraped_at = clock.now
        if arriving:
            req = arrivals.pop(0)
            ctx = RequestContext(f"r{seq}", snap, CHAT)
            ctx.tenant = snap.tenants[req.tenant]
            ctx.service_class = ctx.tenant.tier
            ctx.stream = streams
            queue = state.queues[TENANTS[req.tenant]]
            others = [f for f in queue.flows.values() if f.waiters]
            own = queue.flows.get(req.tenant)
            if req.tenant == quiet and all(f.held + len(f.waiters) > 1 for f in others) and \
                    (own is None or all(own.counter <= f.counter for f in others)):
                # beside flows with more outstanding than its one, and served no more than they were: checked
                quiet_waiting[ctx.request_id] = 0
            free = ctx.request_id in quiet_waiting and _free(state, controller, policy, TENANTS[req.tenant], clock.now)
            task = asyncio.ensure_future(controller.admit(ctx, "p", req.prompt + req.max_out, 100))
            waiting[task] = (ctx, req)
            if free:
                await settle()
                queue = state.queues[TENANTS[req.tenant]]
                if not task.done() and queue.flows.get(req.tenant) in queue.split(clock.now)[1]:
                    trace.quiet_held.append(f"{req.tenant} at {req.at:.3f} under its share waited beside a free slot")
        elif running[0][2] == FIRST:
            _, _, _, ctx, req = heapq.heappop(running)
            worker = workers[seq % len(workers)]
            controller.first_token(ctx, state, worker, policy, state.granted, req.prompt * PREFILL_S)
            heapq.heappush(running, (clock.now + 0.01 + req.out * 0.001, seq, END, ctx, req))
        else:
            _, _, _, ctx, req = heapq.heappop(running)
            ctx.prompt_tokens, ctx.cached_tokens, ctx.completion_tokens = req.prompt, req.cached, req.out
            controller.release(ctx, state)
            if quiet is not None and _first_in_line(state, quiet):  # the release was the quiet flow's to take
                for other in quiet_waiting:
                    quiet_waiting[other] += 1
        seq += 1
        await settle()
        for task in [t for t in waiting if t.done()]:
            ctx, req = waiting.pop(task)
            if isinstance(task.exception(), Shed):
                trace.shed[req.tenant] = trace.shed.get(req.tenant, 0) + 1
                if req.tenant == quiet and _flood_queued(state, quiet):
                    trace.quiet_shed.append(f"{req.tenant} shed at {clock.now:.3f} beside a queued flood")
                quiet_waiting.pop(ctx.request_id, None)
                continue
            assert task.exception() is None, task.exception()
            if quiet_waiting.pop(ctx.request_id, 0) > 1:
                trace.quiet_waited.append(f"{req.tenant} at {req.at:.3f} started after two releases or more")
            trace.served[req.tenant] = trace.served.get(req.tenant, 0) + req.prompt - req.cached + req.out
            if streams:
                heapq.heappush(running, (clock.now + req.prompt * PREFILL_S, seq, FIRST, ctx, req))
            else:
                heapq.heappush(running, (clock.now + 0.01 + req.out * 0.001, seq, END, ctx, req))
            seq += 1
        _check(state, controller, policy, clock.now, bound, trace)
    for task in waiting:
        task.cancel()
    await settle()
    return trace


def _watch_grants(state: PoolState, trace: Trace) -> None:
    """Record, at every grant, a lower class granted while premium waits."""
    take = state.take

    def watched(flow: Flow, key: int, cost: float, *, now: float, stream: bool = False) -> None:
        if flow.klass != "premium" and state.queues["premium"].count:
            trace.behind.append(f"{flow.klass} of {flow.tenant} granted beside {state.queues['premium'].count} "
                                "premium waiting")
        take(flow, key, cost, now=now, stream=stream)

    state.take = watched  # type: ignore[method-assign]


def _room(state: PoolState, controller: Controller, policy: Any, klass: str, now: float) -> tuple[int, int]:
    """The pool's slots, and those ``klass`` may take (the reserves as the policy states them)."""
    total = capacity(state.workers, state.spec, policy, now, controller.share)
    reserve = 0 if klass == "premium" else kept_free(total, policy.premium_reserve)
    if klass == "batch":
        reserve = max(reserve, kept_free(total, policy.batch_headroom))
    return total, total - reserve


def _free(state: PoolState, controller: Controller, policy: Any, klass: str, now: float) -> bool:
    """Is a slot ``klass`` may take free (beyond the reserves)?"""
    return _room(state, controller, policy, klass, now)[1] - state.granted > 0


def _first_in_line(state: PoolState, quiet: str) -> bool:
    """After a release and its grants: does every other flow holding or queueing requests in ``quiet``'s class
    have more than one outstanding and a counter no lower than ``quiet``'s? Then the slot freed was ``quiet``'s
    to take. A flood shed down to a single request meanwhile is as quiet as it is, and at a tie may go first."""
    queue = state.queues[TENANTS[quiet]]
    mine = queue.flows.get(quiet)
    return mine is not None and all(f.held + len(f.waiters) > 1 and mine.counter <= f.counter
                                    for f in queue.flows.values() if (f.held or f.waiters) and f is not mine)


def _flood_queued(state: PoolState, quiet: str) -> bool:
    """Has a flow served more than ``quiet`` requests queued in ``quiet``'s class? Served more: a higher counter,
    or at an equal one more requests outstanding than ``quiet`` with the one just refused (the served-token order
    breaks its ties so). A flow that was served more is the flood a refusal must fall on instead."""
    queue = state.queues[TENANTS[quiet]]
    mine = queue.flows.get(quiet)
    if mine is None:
        return any(f.waiters for f in queue.flows.values())
    order = (mine.counter, mine.held + len(mine.waiters) + 1)
    return any(f.waiters and f is not mine and (f.counter, f.held + len(f.waiters)) > order
               for f in queue.flows.values())


def _check(state: PoolState, controller: Controller, policy: Any, now: float, bound: float, trace: Trace) -> None:
    for queue in state.queues.values():
        backlogged = [f.counter for f in queue.flows.values() if f.waiters]
        if len(backlogged) > 1:
            trace.spread.append((max(backlogged) - min(backlogged), bound))
    klass = next((k for k in TIERS if state.queues[k].count), None)
    if klass is None:
        return
    total, room = _room(state, controller, policy, klass, now)
    free = total - state.granted
    active = state.queues[klass].active(now)
    headroom = kept_free(room, policy.tenant_headroom) if len(active) > 1 else 0
    if free > total - room + headroom:
        trace.idle.append(f"{free} of {total} free while {klass} waits (reserve {total - room}, headroom "
                          f"{headroom})")


# -- the strategies -----------------------------------------------------------------------------------------

sizes = st.integers(16, 2048)


@st.composite
def floods(draw: st.DrawFn, tenants: list[str], start: float = 0.0) -> list[Req]:
    """Each tenant sends a burst of requests at once, of sizes drawn per tenant (so some flows are heavier)."""
    reqs = []
    for tenant in tenants:
        n = draw(st.integers(3, 12))
        at = start + draw(st.floats(0, 0.05))
        for _ in range(n):
            out = draw(sizes)
            reqs.append(Req(tenant, at, draw(sizes), out, out + draw(st.sampled_from([0, 0, 64, 1024]))))
    return reqs


pools = st.lists(st.integers(1, 16), min_size=1, max_size=4)
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- fairness between backlogged flows ----------------------------------------------------------------------

@SETTINGS
@given(data=st.data(), limits=pools, n=st.integers(2, 4))
def test_two_backlogged_flows_stay_within_the_bound_in_charged_tokens(data: st.DataObject, limits: list[int],
                                                                     n: int) -> None:
    reqs = data.draw(floods([f"s{i}" for i in range(n)]))
    trace = simulate(reqs, limits, premium_reserve=0.0, tenant_headroom=0.0)
    assert all(spread <= bound for spread, bound in trace.spread), max(trace.spread)


class FloodFirst(ServedTokens):
    """Unfair on purpose: the flow served most goes next."""

    def key(self, flow: Flow) -> tuple[float, float, float]:
        return -flow.counter, 0.0, flow.waiters[0].enqueued_at


def _unfair_reqs() -> list[Req]:
    return [Req(t, 0.0, 100, 100, 100) for t in ("s0", "s1") for _ in range(30)]


def test_the_fairness_check_catches_a_flow_served_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """Positive control: with the flow served most going next, the backlogged flows drift apart."""
    assert all(s <= b for s, b in simulate(_unfair_reqs(), [2], premium_reserve=0.0, tenant_headroom=0.0).spread)
    monkeypatch.setitem(flows.FAIRNESS, "served_tokens", FloodFirst())
    spread = simulate(_unfair_reqs(), [2], premium_reserve=0.0, tenant_headroom=0.0).spread
    assert any(s > b for s, b in spread)


# -- a quiet flow beside floods ----------------------------------------------------------------------------

@st.composite
def quiet_beside_floods(draw: st.DrawFn) -> list[Req]:
    """Floods of standard tenants, and a quiet one (s5) sending a request now and then, each long after the last
    (it holds and queues nothing when the next one comes). Quiet in time is not light in tokens: one large answer
    can leave its counter above the floods', and then the served-token order rightly puts it after them; the
    check below holds the quiet flow to its guarantee only when it was served no more than the busy flows."""
    reqs = draw(floods([f"s{i}" for i in range(draw(st.integers(1, 4)))]))
    at = 0.0
    for _ in range(draw(st.integers(1, 5))):
        at += draw(st.floats(3.0, 6.0))  # longer than any answer (at most ~2.1 s): the last one has ended
        out = draw(sizes)
        reqs.append(Req("s5", at, draw(sizes), out, out))
        # the floods go on: more of their requests keep their queues full past the quiet one's
        reqs += draw(floods([f"s{i}" for i in range(2)], start=at - 2.0))
    return reqs


@SETTINGS
@given(reqs=quiet_beside_floods(), limits=pools, headroom=st.sampled_from([0.0, 0.1, 0.5]),
       deadline_ms=st.sampled_from([200.0, 1e9]), streams=st.booleans())
def test_a_quiet_flow_starts_by_the_next_release_and_is_never_refused_for_a_flood(
        reqs: list[Req], limits: list[int], headroom: float, deadline_ms: float, streams: bool) -> None:
    trace = simulate(reqs, limits, quiet="s5", deadline_ms=deadline_ms, streams=streams, premium_reserve=0.0,
                     tenant_headroom=headroom)
    assert trace.quiet_waited == [] and trace.quiet_shed == [] and trace.quiet_held == []


def _quiet_reqs() -> list[Req]:
    flood = [Req("s0", 0.0, 100, 500, 500) for _ in range(60)]
    return [*flood, Req("s5", 1.0, 100, 100, 100), Req("s5", 4.0, 100, 100, 100)]


def test_the_quiet_check_catches_first_come_first_served(monkeypatch: pytest.MonkeyPatch) -> None:
    """Positive control: served in arrival order (and no headroom), the quiet flow waits behind the flood's
    backlog, and with a deadline it is the one refused."""
    plain: dict[str, Any] = {"premium_reserve": 0.0, "tenant_headroom": 0.0}
    assert simulate(_quiet_reqs(), [4], quiet="s5", **plain).quiet_waited == []
    assert simulate(_quiet_reqs(), [4], quiet="s5", deadline_ms=200.0, **plain).quiet_shed == []
    monkeypatch.setitem(flows.FAIRNESS, "served_tokens", flows.Fcfs())
    assert simulate(_quiet_reqs(), [4], quiet="s5", **plain).quiet_waited != []
    assert simulate(_quiet_reqs(), [4], quiet="s5", deadline_ms=200.0, **plain).quiet_shed != []


def test_the_quiet_check_catches_pacing_that_holds_every_flow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Positive control: floods of streams whose prompts are short and long (the least TTFT is the short ones',
    so the pool is at its pacing bound while the long ones prefill); pacing every flow alike, not only those over
    their share, holds the quiet flow's stream beside a free slot until the next first token."""
    flood = [Req(tenant, 0.0, prompt, 40, 40) for tenant in ("s0", "s1") for _ in range(40) for prompt in (100, 2000)]
    reqs = [*flood, Req("s5", 1.0, 100, 100, 100), Req("s5", 4.0, 100, 100, 100)]
    plain: dict[str, Any] = {"premium_reserve": 0.0, "tenant_headroom": 0.0}
    assert simulate(reqs, [8], quiet="s5", streams=True, **plain).quiet_held == []

    blocked = Controller._blocked

    def every_flow(self: Controller, state: PoolState, scheduling: SchedulingPolicy, klass: str, total: int,
                   now: float, flow: Flow | None = None) -> set[Flow]:
        if self._pacing(state, now, flow):
            return set(state.queues[klass].flows.values())
        return blocked(self, state, scheduling, klass, total, now, flow)

    monkeypatch.setattr(Controller, "_blocked", every_flow)
    assert simulate(reqs, [8], quiet="s5", streams=True, **plain).quiet_held != []


def test_at_a_tie_in_counter_and_outstanding_the_flow_granted_longest_ago_goes_first() -> None:
    """Round robin at a tie: a flood just granted (its waiter queued first) and a quiet flow that waited, both at
    the same counter with one request each: the quiet one goes next (found by the quiet property above)."""
    async def main() -> str:
        queue, snap = flows.ClassQueue(), snapshot(1e9)
        flood, quiet = queue.arrive("standard", "s0", 1.0, 0.0), queue.arrive("standard", "s5", 1.0, 0.0)
        flood.counter = quiet.counter = 1696.0
        flood.turn, quiet.turn = 9, 2  # the flood was granted last
        for flow, at in ((flood, 1.0), (quiet, 2.0)):
            ctx = RequestContext(flow.tenant, snap, CHAT)
            queue.push(flows.Waiter(ctx, flow, 32, 0, at))
        waiter = queue.pop(ServedTokens())
        assert waiter is not None
        return waiter.flow.tenant
    assert asyncio.run(main()) == "s5"


# -- no idle slot, and premium first ------------------------------------------------------------------------

@st.composite
def mixed(draw: st.DrawFn) -> list[Req]:
    tenants = draw(st.lists(st.sampled_from(sorted(TENANTS)), min_size=1, max_size=6, unique=True))
    reqs = []
    for tenant in tenants:
        for _ in range(draw(st.integers(1, 15))):
            out = draw(sizes)
            reqs.append(Req(tenant, draw(st.floats(0, 3.0)), draw(sizes), out, out + draw(st.integers(0, 512))))
    return reqs


@SETTINGS
@given(reqs=mixed(), limits=pools, reserve=st.sampled_from([0.0, 0.25]), batch=st.sampled_from([0.0, 0.1]),
       headroom=st.sampled_from([0.0, 0.25, 0.75]))
def test_no_slot_idle_while_a_request_that_may_take_it_waits_and_premium_goes_first(
        reqs: list[Req], limits: list[int], reserve: float, batch: float, headroom: float) -> None:
    trace = simulate(reqs, limits, premium_reserve=reserve, batch_headroom=batch, tenant_headroom=headroom)
    assert trace.idle == [] and trace.behind == []


def _mixed_reqs() -> list[Req]:
    return [Req(t, i * 0.001, 100, 100, 100) for i in range(20) for t in ("s0", "p0", "b0")]


def test_the_idle_check_catches_a_slot_kept_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """Positive control: a scheduler that keeps one slot more than the reserves free."""
    assert simulate(_mixed_reqs(), [4]).idle == []
    reserved = Controller._reserved
    monkeypatch.setattr(Controller, "_reserved", staticmethod(lambda total, s, k: reserved(total, s, k) + 1))
    assert simulate(_mixed_reqs(), [4]).idle != []


def test_the_priority_check_catches_classes_out_of_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Positive control: a scheduler that ranks standard above premium."""
    assert simulate(_mixed_reqs(), [4], premium_reserve=0.0, batch_headroom=0.0).behind == []
    monkeypatch.setattr(controller_module, "TIERS", ("standard", "premium", "batch"))
    assert simulate(_mixed_reqs(), [4], premium_reserve=0.0, batch_headroom=0.0).behind != []

