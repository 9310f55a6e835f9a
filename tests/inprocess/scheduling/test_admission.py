"""The scheduler's rules in-process: priority between classes, fairness inside one, deadlines, bounds, leaving."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.context import RequestContext
from gateway.endpoints import CHAT
from gateway.errors import Shed
from gateway.outcomes import render
from gateway.policy.loader import PolicySnapshot
from gateway.policy.schema import Policy
from gateway.scheduling.capacity import HOLD_READS, SEQUENCE_HOLD_READS, learn, worker_slots
from gateway.scheduling.controller import PREFILL_STUCK_S, Controller
from gateway.state.replicas import Share
from tests.fakes import live_worker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def snapshot(slots: int = 2, **scheduling: Any) -> PolicySnapshot:
    policy = Policy.model_validate({
        "tenants": {"p1": {"tier": "premium"}, "p2": {"tier": "premium"}, "s1": {"tier": "standard"},
                    "s2": {"tier": "standard"}, "heavy": {"tier": "standard", "weight": 1.0}, "b1": {"tier": "batch"}},
        "models": {"m": {"pool": "p"}},
        "pools": {"p": {"workers": ["http://w1"], "max_inflight_per_worker": slots}},
        "scheduling": {"batch_headroom": 0.0, "premium_reserve": 0.0, "tenant_headroom": 0.0, **scheduling}})
    return PolicySnapshot.build(policy, "test")


class Harness:
    def __init__(self, slots: int = 2, **scheduling: Any) -> None:
        self.clock = Clock()
        self.snap = snapshot(slots, **scheduling)
        self.controller = Controller(clock=self.clock)
        self.worker = live_worker("http://w1", scraped_at=self.clock.now, limit=slots)
        self.worker.learned.limit_found = True  # the engine has shown what it runs: forecasts may refuse
        self.spec = self.snap.policy.pools["p"]
        self.controller.track("p", [self.worker], self.spec)
        self.pool = self.controller.states["p"]  # the pool's queues and counts, as the controller keeps them
        self.granted: list[str] = []

    def ctx(self, tenant: str, klass: str | None = None) -> RequestContext:
        ctx = RequestContext(tenant, self.snap, CHAT)
        ctx.tenant = self.snap.tenants[tenant]
        ctx.service_class = klass or ctx.tenant.tier
        return ctx

    async def admit(self, ctx: RequestContext, cost: int = 100, size: int = 100) -> RequestContext:
        assert await self.controller.admit(ctx, "p", cost, size) is self.pool
        self.worker.inflight += 1  # what the dispatch lease does
        self.granted.append(ctx.request_id)
        return ctx

    def release(self, ctx: RequestContext) -> None:
        self.worker.inflight -= 1
        self.controller.release(ctx, self.pool)

    def queue(self, tenant: str, klass: str | None = None, **kw: Any) -> asyncio.Task[RequestContext]:
        return asyncio.ensure_future(self.admit(self.ctx(tenant, klass), **kw))

    async def overlapping(self, tenant: str, at_once: int, times: int = 3, hold_s: float = 2.0) -> None:
        """A tenant's habit: ``at_once`` requests running together for ``hold_s``, ``times`` times."""
        for _ in range(times):
            held = [await self.admit(self.ctx(tenant)) for _ in range(at_once)]
            self.clock.now += hold_s
            for ctx in held:
                self.release(ctx)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_strict_priority_between_classes() -> None:
    async def main() -> None:
        h = Harness()
        running = [await h.admit(h.ctx("s1")), await h.admit(h.ctx("s2"))]  # capacity 2, both taken
        waiting = [h.queue("b1"), h.queue("s1"), h.queue("p1")]
        await settle()
        assert h.granted == ["s1", "s2"], "nothing starts while the worker is full"
        for ctx in running:
            h.release(ctx)
            await settle()
        assert h.granted[2:] == ["p1", "s1"], "premium first, then standard"
        h.release(waiting[2].result())
        await settle()
        assert h.granted[4:] == ["b1"], "batch last"
    asyncio.run(main())


def test_batch_leaves_headroom_and_never_passes_waiting_work() -> None:
    async def main() -> None:
        h = Harness(batch_headroom=0.5)  # of 2 slots, batch leaves 1 free
        batch = h.queue("b1")
        await settle()
        assert h.granted == ["b1"], "an idle pool takes batch work"
        second = h.queue("b1")
        await settle()
        assert h.granted == ["b1"], "but keeps the headroom free for interactive work"
        await h.admit(h.ctx("p1"))
        assert h.granted == ["b1", "p1"], "premium starts at once in the headroom"
        h.release(batch.result())
        await settle()
        assert h.granted == ["b1", "p1"], "with premium running, batch still leaves the headroom"
        second.cancel()
    asyncio.run(main())


def test_a_request_that_would_miss_its_deadline_is_shed_at_once() -> None:
    async def main() -> None:
        h = Harness(tiers={"standard": {"max_queue_wait_ms": 1600}})
        running = [await h.admit(h.ctx("s1")), await h.admit(h.ctx("s2"))]
        state = h.pool
        for i in range(10):  # it drains 2 requests a second
            state.completions.append(h.clock.now - 5 + i * 0.5)
        waiting = [h.queue("s1") for _ in range(3)]  # 0.5, 1.0 and 1.5 s away: within the 1.6 s deadline
        await settle()
        assert state.queues["standard"].count == 3
        with pytest.raises(Shed) as caught:
            await h.admit(h.ctx("s1"))
        assert caught.value.code == "queue_overloaded" and caught.value.reason == "predicted_wait"
        status, headers, _ = render(caught.value)
        assert status == 429 and dict(headers)[b"retry-after"] == b"2", "4 ahead at 2/s"
        assert state.queues["standard"].count == 3, "shed at once, never queued"
        other = h.queue("s2")  # another tenant goes after one of s1's (fair turns): 1 s away, it waits
        await settle()
        assert state.queues["standard"].count == 4 and not other.done()
        waiting.append(other)
        h.worker.learned.limit_found = False  # a fresh engine whose limit is still growing: no forecast
        late = h.queue("s1")
        await settle()
        assert state.queues["standard"].count == 5 and not late.done(), "it waits instead"
        for task in [*waiting, late]:
            task.cancel()
        for ctx in running:
            h.release(ctx)
    asyncio.run(main())


def test_premium_is_not_refused_on_a_forecast_only_at_its_deadline() -> None:
    async def main() -> None:
        h = Harness(tiers={"premium": {"max_queue_wait_ms": 1600}})
        running = [await h.admit(h.ctx("p1")), await h.admit(h.ctx("p1"))]
        state = h.pool
        for i in range(10):  # it drains 2 requests a second: 5 ahead would forecast 2.5 s, past 1.6 s
            state.completions.append(h.clock.now - 5 + i * 0.5)
        waiting = [h.queue("p1") for _ in range(5)]
        await settle()
        assert state.queues["premium"].count == 5, "queued, not refused on the forecast"
        h.release(running[0])
        await settle()
        assert state.queues["premium"].count == 4 and waiting[0].done(), "the next release goes to the first"
        for task in waiting[1:]:
            task.cancel()
        for task in waiting[:1]:
            h.release(task.result())
        h.release(running[1])
    asyncio.run(main())


def test_a_queued_request_past_its_deadline_gets_429_and_leaves() -> None:
    async def main() -> None:
        h = Harness(tiers={"standard": {"max_queue_wait_ms": 50}})
        running = [await h.admit(h.ctx("s1")), await h.admit(h.ctx("s2"))]
        with pytest.raises(Shed) as caught:
            await h.admit(h.ctx("s1"))
        assert caught.value.reason == "deadline" and b"retry-after" in dict(render(caught.value)[1])
        assert h.pool.queues["standard"].count == 0
        for ctx in running:
            h.release(ctx)
        assert h.pool.granted == 0
    asyncio.run(main())


def test_a_client_that_leaves_the_queue_takes_nothing_with_it() -> None:
    async def main() -> None:
        h = Harness()
        running = [await h.admit(h.ctx("s1")), await h.admit(h.ctx("s2"))]
        leaving = h.queue("s1")
        staying = h.queue("s2")
        await settle()
        leaving.cancel()
        await settle()
        assert h.pool.queues["standard"].count == 1
        h.release(running[0])
        await settle()
        assert staying.done() and h.granted[-1] == "s2", "the next one in line got the slot"
        assert h.controller.tenant_inflight == {"s2": 2}, "the leaver's tenant count was given back"
    asyncio.run(main())


def test_a_flooding_tenant_leaves_a_slot_for_another_active_tenant() -> None:
    async def main() -> None:
        h = Harness(tenant_headroom=0.1)
        h.worker.learned.limit = 8
        alone = [await h.admit(h.ctx("s1")) for _ in range(8)]
        assert len(alone) == 8, "a lone tenant may use every slot"
        for ctx in alone:
            h.release(ctx)
        h.release(await h.admit(h.ctx("s2")))  # a second tenant has used the pool this minute
        flood = [h.queue("s1") for _ in range(12)]
        await settle()
        state = h.pool
        assert state.held() == {"s1": 7} and state.queues["standard"].count == 5, "one slot (10%) left free"
        quiet = h.queue("s2")
        await settle()
        assert quiet.done(), "the quiet tenant starts at once beside the flood"
        h.release(next(t for t in flood if t.done()).result())  # a flood request ends: the flood may not refill
        await settle()
        assert state.held() == {"s1": 6, "s2": 1} and state.granted == 7, "one slot stays free for the quiet one"
        again = h.queue("s2")
        await settle()
        assert again.done(), "so its next request starts at once too"
        for task in flood:
            task.cancel()
    asyncio.run(main())


def test_the_slot_left_for_a_quiet_tenant_is_one_its_class_may_take() -> None:
    """Slots held back for premium are no room for a quiet standard tenant: the flood stops one short of the
    reserve, not at it."""
    async def main() -> None:
        h = Harness(tenant_headroom=0.1, premium_reserve=0.25)
        h.worker.learned.limit = 8
        h.release(await h.admit(h.ctx("s2")))  # a second standard tenant has used the pool this minute
        flood = [h.queue("s1") for _ in range(12)]
        await settle()
        assert h.pool.held() == {"s1": 5}, "two slots for premium, one for the quiet tenant"
        quiet = h.queue("s2")
        await settle()
        assert quiet.done(), "the quiet tenant starts at once beside the flood"
        for task in flood:
            task.cancel()
        await settle()
        for task in flood:
            if task.done() and not task.cancelled():
                h.release(task.result())
        h.release(quiet.result())
    asyncio.run(main())


def test_a_fair_share_is_of_what_the_class_may_take() -> None:
    """Two standard tenants share the six slots standard has of eight (two are premium's): the flood, served
    more of late, leaves what the quiet tenant's arrivals find in use at their 95th percentile (three at once
    for its last six seconds: 1.35 on average over ten, three as Poisson's p95) and one for the arrival, below
    the cap (five of the six), not what it would leave of all eight."""
    async def main() -> None:
        h = Harness(tenant_headroom=0.75, premium_reserve=0.25)
        h.worker.learned.limit = 8
        await h.overlapping("s1", 6, times=4)  # the flood has been served more of late
        await h.overlapping("s2", 3)  # the quiet tenant runs three at once
        flood = [h.queue("s1") for _ in range(12)]
        await settle()
        assert h.pool.held() == {"s1": 2}, "the flood leaves four of the class's six"
        quiet = [h.queue("s2") for _ in range(3)]
        await settle()
        assert all(t.done() for t in quiet), "all three of the quiet tenant's requests start at once"
        for task in quiet:
            h.release(task.result())
        for task in flood:
            task.cancel()
    asyncio.run(main())


def test_with_more_tenants_than_slots_one_running_request_is_not_over_its_share() -> None:
    """Three tenants on two slots: a share is under one slot. A tenant with one short request running and the
    next one asked for is still under its share in tokens beside two floods served far more of late: its next
    request takes the slot the floods leave free, rather than waiting behind them as "over" for holding one."""
    async def main() -> None:
        h = Harness(tenant_headroom=0.5)
        h.worker.learned.limit = 2
        for _ in range(4):  # the two floods, a slot each, for eight seconds
            held = [await h.admit(h.ctx("s1")), await h.admit(h.ctx("heavy"))]
            h.clock.now += 2.0
            for ctx in held:
                h.release(ctx)
        running = await h.admit(h.ctx("s2"))
        floods = [h.queue(t) for t in ("s1", "heavy") for _ in range(4)]
        await settle()
        assert h.pool.held() == {"s2": 1}, "the floods leave the last slot free"
        following = h.queue("s2")
        await settle()
        assert following.done(), "the quiet tenant's next request takes it at once"
        h.release(running)
        h.release(following.result())
        for task in floods:
            task.cancel()
    asyncio.run(main())


def test_the_slots_left_free_for_quiet_tenants_are_capped() -> None:
    async def main() -> None:
        h = Harness(tenant_headroom=0.25)
        h.worker.learned.limit = 8
        await h.overlapping("s1", 8, times=2)
        await h.overlapping("s2", 4)  # what it used would keep five free (1.8 on average: four, one to arrive)
        flood = [h.queue("s1") for _ in range(12)]
        await settle()
        assert h.pool.held() == {"s1": 6}, "at most a quarter of the slots is held back"
        for task in flood:
            task.cancel()
    asyncio.run(main())


def test_full_queues_shed_the_lowest_class_first() -> None:
    async def main() -> None:
        h = Harness(max_queued_bytes=1024)
        await h.admit(h.ctx("s1"))
        await h.admit(h.ctx("s2"))
        batch = h.queue("b1", size=800)
        await settle()
        premium = h.queue("p1", size=500)
        await settle()
        with pytest.raises(Shed) as caught:
            await batch
        assert caught.value.reason == "displaced" and "higher-priority" in caught.value.message
        assert not premium.done() and h.pool.queues["premium"].count == 1
        with pytest.raises(Shed):
            await h.admit(h.ctx("s1"), size=900)  # nothing lower to shed: this one is refused
        premium.cancel()
    asyncio.run(main())


def test_a_full_queue_refuses_the_flood_not_a_tenant_served_less() -> None:
    """The class's queue is full of one tenant's requests: a request of another tenant, served less, is queued and
    the flood's newest refused in its place; the flood's own next one is refused (none is served more than it)."""
    async def main() -> None:
        h = Harness(max_queued=3)
        running = [await h.admit(h.ctx("s1")), await h.admit(h.ctx("s1"))]
        flood = [h.queue("s1") for _ in range(3)]
        await settle()
        quiet = h.queue("s2")
        await settle()
        with pytest.raises(Shed) as caught:
            await flood[-1]
        assert caught.value.reason == "displaced" and not quiet.done()
        with pytest.raises(Shed) as refused:
            await h.admit(h.ctx("s1"))
        assert refused.value.reason == "queue_full"
        h.release(running[0])
        await settle()
        assert quiet.done() and h.granted[-1] == "s2", "served less, it goes first"
        for task in flood[:2]:
            task.cancel()

    async def control() -> None:  # in arrival order (fcfs), the one refused is whoever arrives last
        h = Harness(max_queued=3, fairness="fcfs")
        for _ in range(2):
            await h.admit(h.ctx("s1"))
        flood = [h.queue("s1") for _ in range(3)]
        await settle()
        with pytest.raises(Shed):
            await h.admit(h.ctx("s2"))
        for task in flood:
            task.cancel()
    asyncio.run(main())
    asyncio.run(control())


def test_a_flow_over_its_share_waits_for_the_pools_flow_of_prefills_and_one_under_it_does_not() -> None:
    """With no completions yet the bound is one stream per worker. The flow charged more than the mean waits for
    the first stream's first token (its backlog stays in the gateway's order, not in the engine's prefill queue),
    while a flow charged less starts at once: pacing holds what the headroom would hold, the flows over their
    share. One still without its first token after PREFILL_STUCK_S is a hung worker's, and stops holding the
    others back."""
    async def main() -> None:
        h = Harness(slots=4)
        h.worker.learned.ttft_floor = 0.05
        await h.admit(h.ctx("s2"), cost=10)  # a light flow, holding one whole answer
        first = h.ctx("s1")
        first.stream = True
        await h.admit(first)
        second = h.ctx("s1")
        second.stream = True
        waiting = asyncio.ensure_future(h.admit(second))
        await settle()
        assert not waiting.done(), "one stream before its first token: the flood's next one waits"
        light = h.ctx("s2")
        light.stream = True
        started = asyncio.ensure_future(h.admit(light, cost=10))
        await settle()
        assert started.done(), "the flow under its share is not paced: it goes to the engine at once"
        assert not waiting.done(), "two streams before their first token now"
        h.controller.first_token(light, h.pool, h.worker, h.snap.policy.scheduling, 3, 0.05)
        h.controller.first_token(first, h.pool, h.worker, h.snap.policy.scheduling, 3, 0.05)
        await settle()
        assert waiting.done(), "their first tokens came: the next stream starts"
        h.release(first)
        third = h.ctx("s1")
        third.stream = True
        held = asyncio.ensure_future(h.admit(third))
        await settle()
        assert not held.done(), "the second stream is still before its first token"
        h.clock.now += PREFILL_STUCK_S
        h.controller.grant(h.pool, h.snap.policy.scheduling)  # what the next scrape does
        await settle()
        assert held.done(), "stuck that long, it no longer counts"
        held.result()
    asyncio.run(main())


def test_one_tenant_alone_is_not_paced() -> None:
    """Pacing orders the backlog between tenants: a tenant alone in the pool starts its second stream beside the
    first one's prefill (the engine batches prefills), where it would wait while another tenant holds a request
    (the test above). A tenant that asked a moment ago and holds nothing now is not one to order it against."""
    async def main() -> None:
        h = Harness()
        h.worker.learned.ttft_floor = 0.05
        h.release(await h.admit(h.ctx("s2"), cost=10))
        first, second = h.ctx("s1"), h.ctx("s1")
        first.stream = second.stream = True
        await h.admit(first)
        waiting = asyncio.ensure_future(h.admit(second))
        await settle()
        assert waiting.done(), "nobody to order it against: not held for the first one's first token"
        waiting.result()
    asyncio.run(main())


def test_standard_leaves_the_premium_reserve() -> None:
    async def main() -> None:
        h = Harness(premium_reserve=0.5)  # of 2 slots, 1 is premium's
        await h.admit(h.ctx("s1"))
        second = h.queue("s2")
        await settle()
        assert h.granted == ["s1"], "standard stops at the reserve"
        await h.admit(h.ctx("p1"))
        assert h.granted == ["s1", "p1"], "premium takes the reserved slot at once"
        second.cancel()
    asyncio.run(main())


@pytest.mark.parametrize("engine_priority", [False, True])
def test_premium_goes_past_a_full_limit_only_to_engines_that_run_it_first(engine_priority: bool) -> None:
    """An engine run with --scheduling-policy priority (the pool's engine_priority) starts premium ahead of all
    it has waiting, so premium need not wait for a slot of this process's: it may hold up to the workers' whole
    limit (not this process's part of it, here half), whatever lower classes hold. Without it, premium waits."""
    async def main() -> None:
        h = Harness()
        h.worker.learned.limit = 4
        h.controller.share = Share(0, 2)  # one of two replicas: its part of the worker is 2
        h.spec = h.spec.model_copy(update={"engine_priority": engine_priority})
        h.controller.track("p", [h.worker], h.spec)
        first = await h.admit(h.ctx("s1"))
        await h.admit(h.ctx("s2"))  # this process's part is full
        premium = [h.queue("p1") for _ in range(5)]
        standard = h.queue("s2")
        await settle()
        if not engine_priority:
            assert h.granted == ["s1", "s2"], "an engine that runs in order: premium waits for a slot"
        else:
            assert h.granted == ["s1", "s2", "p1", "p1", "p1", "p1"], "premium up to the worker's whole limit"
            assert (h.pool.premium, h.pool.granted) == (4, 6)
        h.release(first)
        await settle()
        if not engine_priority:
            assert h.granted == ["s1", "s2", "p1"], "a slot freed goes to premium, not standard"
        else:
            assert h.granted.count("p1") == 4 and h.granted.count("s2") == 1, "premium holds the whole limit"
        for task in (*premium, standard):
            task.cancel()
    asyncio.run(main())


def test_premium_still_queued_at_half_its_deadline_goes_past_this_process_s_part() -> None:
    """On an engine that runs in arrival order, premium that has waited half its longest wait for a slot of this
    process's part takes one past it, up to the workers' whole limit in premium requests: the other replicas'
    parts may be free, and if not, the engine holds nothing else waiting (every other class stays within the
    limit), so it starts at the next end of any of the engine's sequences. Its latency teaches the limit
    nothing. Beyond the whole limit it waits, and is shed at its deadline."""
    async def main() -> None:
        h = Harness(tiers={"premium": {"max_queue_wait_ms": 400}})
        h.worker.learned.limit = 4
        h.controller.share = Share(0, 2)  # one of two replicas: its part of the worker is 2
        running = [await h.admit(h.ctx("s1")), await h.admit(h.ctx("s2"))]  # this process's part is full
        standard = h.queue("s2")
        premium = [h.queue("p1") for _ in range(5)]
        await settle()
        assert h.granted == ["s1", "s2"], "premium first waits for a slot of this process's own"
        spilled = await asyncio.gather(*premium[:4])
        assert h.granted == ["s1", "s2", "p1", "p1", "p1", "p1"], "then past the part, up to the whole limit"
        assert all(ctx.past_limit for ctx in spilled) and (h.pool.premium, h.pool.granted) == (4, 6)
        learned = h.worker.learned.stream_limit
        for _ in range(4):  # slow first tokens of spilled requests: they waited in the engine by design
            h.controller.first_token(spilled[0], h.pool, h.worker, h.snap.policy.scheduling, 6, 0.01)
            h.controller.first_token(spilled[1], h.pool, h.worker, h.snap.policy.scheduling, 6, 5.0)
        assert h.worker.learned.stream_limit == learned, "nothing learned from them"
        h.controller.first_token(running[0], h.pool, h.worker, h.snap.policy.scheduling, 6, 0.01)
        assert h.worker.learned.stream_limit != learned, "a request within the limit teaches"
        assert not standard.done(), "standard still waits for a slot within the part"
        with pytest.raises(Shed) as caught:
            await premium[4]
        assert caught.value.reason == "deadline", "the fifth would pass the whole limit: it waits, then is shed"
        for ctx in (*spilled, *running):
            h.release(ctx)
        await settle()
        assert standard.done() and not standard.result().past_limit
        h.release(standard.result())
        assert (h.pool.premium, h.pool.granted, h.controller.tenant_inflight) == (0, 0, {})
    asyncio.run(main())


def test_a_tenant_over_its_fair_share_of_the_fleet_does_not_go_past_the_part() -> None:
    """Past this process's part a request waits in the engine's own queue, ahead of whatever comes next: a
    flooding premium tenant's requests there made a quiet one's wait behind them. So only a tenant under its
    fair share of the class across the fleet (the workers' whole limits over the tenants any process saw, with
    what the others hold as their heartbeats report it) goes past; one at it waits for a slot here, and is shed
    at its deadline."""
    async def main() -> None:
        h = Harness(tiers={"premium": {"max_queue_wait_ms": 200}}, tenant_headroom=0.5)
        h.worker.learned.limit = 8
        h.controller.share = Share(0, 2)  # this process's part: 4 of 8; two premium tenants: a fair share of 4
        h.controller.fleet_changed({"p": {"premium": {"p1": 2}}})  # the other process holds two of p1's
        held = [await h.admit(h.ctx("p2")), await h.admit(h.ctx("s1"))]
        held += [await h.admit(h.ctx("p1")), await h.admit(h.ctx("p1"))]  # the part is full
        with pytest.raises(Shed) as caught:
            await h.admit(h.ctx("p1"))  # holds its fair share of the fleet, two here and two there: waits here
        assert caught.value.reason == "deadline"
        again = await h.admit(h.ctx("p2"))  # under its share: past the part after half its wait
        assert again.past_limit and h.pool.held() == {"p1": 2, "p2": 2, "s1": 1}
        for ctx in (*held, again):
            h.release(ctx)
    asyncio.run(main())


def test_premium_that_pacing_holds_as_over_its_share_does_not_spill_past_pacing() -> None:
    """Premium's spill at half its deadline is a way past this process's part of the limit, not past the order
    between flows: a premium flood that pacing holds (over its share of the recent tokens, beside a flow under
    it, with the pool's prefills in flight) waits its turn here, and is shed at its deadline, while the quiet
    tenant starts at once. Found on a fresh shape, where most of the flood's grants came through the spill and
    the quiet tenant's requests met a full engine."""
    async def main() -> None:
        h = Harness(slots=8, tiers={"premium": {"max_queue_wait_ms": 400}})
        h.release(await h.admit(h.ctx("p2"), cost=10))  # the quiet tenant: little, and often
        quiet = [await h.admit(h.ctx("p2"), cost=10)]
        flood = [h.ctx("p1"), h.ctx("p1")]
        for ctx in flood:
            ctx.stream = True
        await h.admit(flood[0])  # prefilling: the pool's steady flow of first tokens is one
        with pytest.raises(Shed) as caught:
            await h.admit(flood[1])
        assert caught.value.reason == "deadline" and h.pool.held() == {"p1": 1, "p2": 1}, "never past pacing"
        quiet.append(await h.admit(h.ctx("p2"), cost=10))
        assert not quiet[-1].past_limit and h.pool.held() == {"p1": 1, "p2": 2}, "under its share: at once"
        for ctx in (flood[0], *quiet):
            h.release(ctx)
    asyncio.run(main())


def test_premium_alone_in_its_class_still_spills_while_another_class_paces_the_pool() -> None:
    """Pacing holds every flow of a class when none is under its share; that is no reason to keep a premium
    tenant alone in its class from the other replicas' free part (a standard stream prefilling is enough to
    pace the pool): it goes past its part at half its deadline, as before pacing, and is not shed."""
    async def main() -> None:
        h = Harness(tiers={"premium": {"max_queue_wait_ms": 400}})
        h.worker.learned.limit = 4
        h.controller.share = Share(0, 2)  # one of two replicas: its part of the worker is 2
        prefilling = h.ctx("s1")
        prefilling.stream = True
        held = [await h.admit(prefilling), await h.admit(h.ctx("p1"))]  # the part is full, and paced
        spilled = await h.admit(h.ctx("p1"))
        assert spilled.past_limit and h.pool.held() == {"p1": 2, "s1": 1}
        for ctx in (*held, spilled):
            h.release(ctx)
    asyncio.run(main())


def test_a_tenant_flooding_one_process_stays_in_its_part_when_another_process_has_a_tenant() -> None:
    """A tenant whose traffic reaches only this process sees no other tenant here; the slots past this process's
    part are the other process's, where a quiet tenant this one never sees is next. Its report (a tenant active
    there, holding nothing) makes the flood's fair share half the fleet, which its part already is."""
    async def main() -> None:
        for quiet_elsewhere in (False, True):
            h = Harness(tiers={"premium": {"max_queue_wait_ms": 200}}, tenant_headroom=0.5)
            h.worker.learned.limit = 8
            h.controller.share = Share(0, 2)
            h.controller.fleet_changed({"p": {"premium": {"p2": 0}}} if quiet_elsewhere else {})
            held = [await h.admit(h.ctx("p1")) for _ in range(4)]  # the part is full, all of it p1's
            assert h.controller.tenants() == {"p": {"premium": {"p1": 4}}}, "what its heartbeat reports"
            if quiet_elsewhere:
                with pytest.raises(Shed):
                    await h.admit(h.ctx("p1"))
            else:
                assert (await h.admit(h.ctx("p1"))).past_limit, "alone in the fleet: the other part is free"
            for ctx in held:
                h.release(ctx)
    asyncio.run(main())


def test_a_request_may_ask_for_a_lower_class_never_a_higher_one() -> None:
    from gateway.pipeline import lower_class

    assert lower_class("premium", "batch") == "batch"
    assert lower_class("batch", "premium") == "batch"
    assert lower_class("standard", "nonsense") == "standard"
    assert lower_class("standard", None) == "standard"


def test_fifo_mode_admits_at_once() -> None:
    async def main() -> None:
        h = Harness(mode="fifo")
        for _ in range(5):
            await h.admit(h.ctx("s1"))
        assert len(h.granted) == 5
    asyncio.run(main())


def test_worker_concurrency_is_learned_from_its_metrics() -> None:
    worker = live_worker("http://w")
    learn(worker, ceiling=64)
    assert worker.learned.limit == 8, "it starts low, not at the ceiling"
    worker.observed.running = 8  # keeping up at the limit: probe upwards, doubling while no limit has shown
    learn(worker, ceiling=64)
    assert worker.learned.limit == 16
    learn(worker, ceiling=64)
    assert worker.learned.limit == 16, "running 8 of 16: no need for more"
    worker.observed.running, worker.observed.waiting = 8, 3  # the engine runs 8 and queues the rest
    worker.observed.kv_usage = 0.8  # out of KV cache for more: a limit that moves with the requests' sizes
    learn(worker, ceiling=64)
    assert worker.learned.limit == 16, "one read with requests waiting may be a request between two steps"
    learn(worker, ceiling=64)
    assert worker.learned.limit == 8, "two in a row: 8 is what it runs"
    worker.observed.running, worker.observed.waiting = 8, 0  # keeping up at its limit: not above it again at once
    worker.observed.kv_usage = 0.5
    for _ in range(HOLD_READS):
        learn(worker, ceiling=64)
    assert worker.learned.limit == 8, "held at what the engine showed for a while"
    learn(worker, ceiling=64)
    assert worker.learned.limit == 10, "then probing upwards again, a quarter at a time now"
    snap = snapshot()
    spec, scheduling = snap.policy.pools["p"], snap.policy.scheduling
    worker.observed.scraped_at = 100.0
    assert worker_slots(worker, spec, scheduling, now=100.5) == 10
    worker.observed.waiting = 2
    assert worker_slots(worker, spec, scheduling, now=100.5) == 10, "the learned limit, no stall"
    assert worker_slots(worker, spec, scheduling, now=110.0) == 10, "stale metrics: the last good limit stands"
    worker.observed.kv_usage = 0.95
    assert worker_slots(worker, spec, scheduling, now=100.5) == worker.inflight, "KV nearly full: no new work"


def test_a_sequence_cap_is_probed_rarely() -> None:
    """An engine that queues with most of its KV cache free is at its max_num_seqs: probing above it only
    queues a request in the engine, so it is held ten times longer than a memory-bound limit."""
    worker = live_worker("http://w")
    worker.observed.running, worker.observed.waiting, worker.observed.kv_usage = 4, 2, 0.2
    learn(worker, ceiling=64)
    learn(worker, ceiling=64)
    assert worker.learned.limit == 4
    worker.observed.waiting = 0
    for _ in range(SEQUENCE_HOLD_READS):
        learn(worker, ceiling=64)
    assert worker.learned.limit == 4, "no probe while a memory-bound limit would have probed nine times"
    learn(worker, ceiling=64)
    assert worker.learned.limit == 5, "but it is probed again in the end (a limit read low recovers)"


def test_churn_does_not_shrink_the_learned_limit() -> None:
    """Short requests finishing and arriving between steps: reads catch 3 of 4 running with one waiting."""
    worker = live_worker("http://w")
    for running, waiting in ((4, 1), (3, 1), (3, 1), (4, 0), (3, 1), (3, 1), (3, 1)):
        worker.observed.running, worker.observed.waiting = running, waiting
        learn(worker, ceiling=4)
    assert worker.learned.limit == 4, "the engine ran 4 in recent reads: that is its concurrency"


@given(reads=st.integers(2, 12), running=st.integers(1, 6), generated=st.integers(1, 10**6))
def test_reads_within_one_engine_step_are_one_reading(reads: int, running: int, generated: int) -> None:
    """A long prefill step (a 2,048-token prompt on a CPU engine: seconds) read several times shows the request
    that arrived during it as waiting at every read; its generated-token counter has not moved, so the reads are
    one moment of the engine and the limit stays. Once the engine steps and requests still wait, it is lowered."""
    worker = live_worker("http://w", limit=8)
    worker.observed.running, worker.observed.waiting, worker.observed.generated = running, 1, generated
    for _ in range(reads):
        learn(worker, ceiling=64)
    assert worker.learned.limit == 8
    worker.observed.generated += running  # one step: each running sequence generated a token
    learn(worker, ceiling=64)
    assert worker.learned.limit == running, "two readings with requests waiting: what it runs"
    # positive control: the same reads without the counter (the learner blind to steps) lower it at once
    silent = live_worker("http://w", limit=8)
    silent.observed.running, silent.observed.waiting = running, 1
    learn(silent, ceiling=64)
    learn(silent, ceiling=64)
    assert silent.learned.limit == running


def test_a_climbing_load_is_no_cap() -> None:
    """A load ramping up shows arrivals waiting for the next step at every read: the limit stays; the same
    engine then running 40 at two reads in a row with requests waiting is at its cap."""
    worker = live_worker("http://w", limit=64)
    worker.learned.limit_found = True
    for running in (2, 9, 17, 26, 33, 40):
        worker.observed.running, worker.observed.waiting = running, 2
        learn(worker, ceiling=64)
    assert worker.learned.limit == 64, "each read ran more than the one before"
    learn(worker, ceiling=64)
    assert worker.learned.limit == 40, "40 twice, with requests waiting: what it runs"


def test_a_limit_above_the_one_the_replicas_agreed_does_not_grow() -> None:
    """Another replica learned 8 for the worker: this process's 16 is not what its requests are held to, so a
    busy engine (running the other replica's requests too) says nothing about it."""
    worker = live_worker("http://w", limit=16)
    worker.agreed.limit = 8
    worker.inflight = 4
    worker.observed.running = 16
    learn(worker, ceiling=256, wanted=True)
    assert worker.learned.limit == 16, "held to the agreed 8: no growth"
    worker.agreed.limit = 16
    learn(worker, ceiling=256, wanted=True)
    assert worker.learned.limit == 32, "the lowest limit, the one in use, probes upwards"


def test_without_metrics_the_limit_is_learned_from_the_answers() -> None:
    """An engine that shows nothing: uncongested answers raise the limit (doubling at first), slow ones lower
    it by a tenth but not below what the engine ran uncongested, a worker failure halves it."""
    from gateway.scheduling.capacity import answered, failed

    worker = live_worker("http://w")
    worker.observed.metrics_error = "/metrics answered 404"
    snap = snapshot()
    spec, scheduling = snap.policy.pools["p"], snap.policy.scheduling
    assert worker_slots(worker, spec, scheduling, now=100.0) == 2, "the pool's ceiling here is 2"
    for held in range(1, 60):  # answers at a steady 40 ms TTFT while it holds more and more
        answered(worker, 256, held, 0.040)
    assert worker.learned.stream_limit >= 58, "slow start: two more per answer while the limit is in use"
    grown = worker.learned.stream_limit
    answered(worker, 256, 10, 0.040)
    assert worker.learned.stream_limit == grown, "a limit not in use does not grow"
    answered(worker, 256, 60, 0.400)  # 10x the floor: one slow answer alone changes nothing
    assert worker.learned.stream_limit == grown and worker.learned.slow_start
    answered(worker, 256, 60, 0.400)  # two among the last eight: the engine queues
    assert worker.learned.stream_limit == pytest.approx(max(grown * 0.9, 59), abs=0.1)
    assert not worker.learned.slow_start
    for _ in range(50):
        answered(worker, 256, 60, 0.500)
    assert worker.learned.stream_limit >= 58, "never below what it ran uncongested"
    failed(worker, 256)
    assert worker.learned.stream_limit == pytest.approx(worker.learned.demonstrated / 2, abs=1)
    for _ in range(5):
        answered(worker, 256, 5, 0.02, whole=True)  # whole answers: per output token
    assert worker.learned.per_token_floor == pytest.approx(0.02)


def test_only_workers_with_a_free_slot_are_offered_to_the_router() -> None:
    """Admission counts the pool's slots; the router must then place the request on an engine that has one
    free, not on the one that holds its prefix while that one is at its limit (it would wait in the engine)."""
    snap = snapshot()
    spec, scheduling = snap.policy.pools["p"], snap.policy.scheduling
    clock = Clock()
    full, roomy = (live_worker(url, scraped_at=clock.now, limit=2) for url in ("http://w1", "http://w2"))
    full.inflight = 2
    roomy.inflight = 1
    controller = Controller(clock=clock)
    controller.track("p", [full, roomy], spec)
    controller.track("one", [full], spec)
    state = controller.states["p"]
    assert controller.with_room(state, scheduling) == {roomy}
    roomy.inflight = 2
    assert controller.with_room(state, scheduling) == set(), "none has room: the router may use any"
    controller.share = Share(0, 2)  # two gateway processes: each may use half of each worker's limit
    roomy.inflight = 1
    full.inflight = 0
    assert controller.with_room(state, scheduling) == {full}
    assert controller.with_room(controller.states["one"], scheduling) == set(), "one worker: nothing to choose"


