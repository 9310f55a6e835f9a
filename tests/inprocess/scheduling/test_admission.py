"""The scheduler's rules in-process: priority between classes, fairness inside one, deadlines, bounds, leaving."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.context import RequestContext
from gateway.endpoints import CHAT
from gateway.errors import Shed
from gateway.outcomes import render
from gateway.policy.loader import PolicySnapshot
from gateway.policy.schema import Policy
from gateway.scheduling.capacity import HOLD_READS, SEQUENCE_HOLD_READS, learn, worker_slots
from gateway.scheduling.controller import Controller
from gateway.scheduling.queues import STUCK_MIN_S, ClassQueue, Waiter
from gateway.state.replicas import Share
from tests.fakes import live_worker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def snapshot(**scheduling: Any) -> PolicySnapshot:
    policy = Policy.model_validate({
        "tenants": {"p1": {"tier": "premium"}, "p2": {"tier": "premium"}, "s1": {"tier": "standard"},
                    "s2": {"tier": "standard"}, "heavy": {"tier": "standard", "weight": 1.0}, "b1": {"tier": "batch"}},
        "models": {"m": {"pool": "p"}},
        "pools": {"p": {"workers": ["http://w1"], "max_inflight_per_worker": 2}},
        "scheduling": {"batch_headroom": 0.0, "premium_reserve": 0.0, "tenant_headroom": 0.0, **scheduling}})
    return PolicySnapshot.build(policy, "test")


class Harness:
    def __init__(self, **scheduling: Any) -> None:
        self.clock = Clock()
        self.snap = snapshot(**scheduling)
        self.controller = Controller(clock=self.clock)
        self.worker = live_worker("http://w1", scraped_at=self.clock.now, limit=2)
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

    def stream(self, tenant: str) -> asyncio.Task[RequestContext]:
        """A streamed request of ``tenant`` asking for a slot (paced by its first token)."""
        ctx = self.ctx(tenant)
        ctx.stream = True
        return asyncio.ensure_future(self.admit(ctx))

    async def paused(self, tenant: str) -> None:
        """A tenant's habit of a request a second, then 30 s of silence: past twenty of its gaps, so not active,
        but heard from within the minute."""
        for _ in range(2):
            self.release(await self.admit(self.ctx(tenant)))
            self.clock.now += 1.0
        self.clock.now += 30.0

    async def overlapping(self, tenant: str, at_once: int, times: int = 3) -> None:
        """A tenant's habit: ``at_once`` requests running together, ``times`` times."""
        for _ in range(times):
            held = [await self.admit(self.ctx(tenant)) for _ in range(at_once)]
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


def test_fair_between_tenants_in_tokens_fifo_inside_one() -> None:
    queue = ClassQueue()

    async def main() -> None:
        for i in range(6):
            queue.push(Waiter(None, "heavy", 1.0, 100, 1, float(i)))  # type: ignore[arg-type]
        for i in range(2):
            queue.push(Waiter(None, "s2", 1.0, 100, 1, 10.0 + i))  # type: ignore[arg-type]
        order = []
        while (waiter := queue.pop()) is not None:
            order.append((waiter.tenant, waiter.enqueued_at))
        assert [t for t, _ in order[:4]].count("s2") == 2, "the quiet tenant is not stuck behind the flood"
        heavy = [at for t, at in order if t == "heavy"]
        assert heavy == sorted(heavy), "FIFO inside a tenant"
        queue.push(Waiter(None, "big", 1.0, 1000, 1, 0.0))  # type: ignore[arg-type]
        queue.push(Waiter(None, "small", 2.0, 100, 1, 0.0))  # type: ignore[arg-type]
        for _ in range(3):
            queue.push(Waiter(None, "big", 1.0, 1000, 1, 0.0))  # type: ignore[arg-type]
            queue.push(Waiter(None, "small", 2.0, 100, 1, 0.0))  # type: ignore[arg-type]
        first_five = [queue.pop().tenant for _ in range(5)]  # type: ignore[union-attr]
        assert first_five.count("small") >= 4, "measured in tokens: small requests get more turns"
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


def test_a_tenant_under_its_share_waits_one_more_deadline_for_the_next_release() -> None:
    """The deadline sheds the overload: a tenant holding its share or more, or alone, is shed at it. A tenant
    under its share beside others is not the overload (it waits for slots taken while it was away): it waits
    one more deadline, and the next release is its."""
    async def main() -> None:
        h = Harness(tiers={"premium": {"max_queue_wait_ms": 200}}, tenant_headroom=0.5)
        flood = [await h.admit(h.ctx("p1")), await h.admit(h.ctx("p1"))]  # the pool is full, all of it p1's
        quiet = h.queue("p2")  # queued first: its deadline passes first
        await settle()
        with pytest.raises(Shed) as caught:
            await h.admit(h.ctx("p1"))  # holds both slots, its share is one: shed at its deadline
        assert caught.value.reason == "deadline"
        assert not quiet.done(), "past its own deadline, still waiting"
        h.release(flood[0])
        await settle()
        assert quiet.done() and h.pool.held == {"p1": 1, "p2": 1}, "the next release is its"
        h.release(quiet.result())
        with pytest.raises(Shed):
            await h.admit(h.ctx("p1"))  # alone in the queue and at its share: the overload
        h.release(flood[1])
        assert h.pool.granted == 0 and h.pool.queues["premium"].count == 0
        assert not h.pool.granted_at and h.pool.queued_bytes == 0
    asyncio.run(main())


def test_with_queue_order_alone_no_tenant_waits_past_its_deadline() -> None:
    """tenant_headroom 0 keeps queue order alone: no share, so no second deadline either."""
    async def main() -> None:
        h = Harness(tiers={"premium": {"max_queue_wait_ms": 200}})
        flood = [await h.admit(h.ctx("p1")), await h.admit(h.ctx("p1"))]
        quiet = h.queue("p2")  # queued first: its deadline passes first
        await settle()
        with pytest.raises(Shed):
            await h.admit(h.ctx("p1"))
        assert quiet.done()
        with pytest.raises(Shed):
            quiet.result()
        for ctx in flood:
            h.release(ctx)
        assert h.pool.granted == 0 and h.pool.queued_bytes == 0
    asyncio.run(main())


def test_a_tenant_light_on_average_at_its_share_in_a_burst_waits_one_more_deadline() -> None:
    """At its share for a moment (two of four slots, the flood the other two), a tenant whose average use is
    a tenth of a slot is not the overload either: its third request waits on past the deadline, for one of
    its own to end; the flood's is shed."""
    async def main() -> None:
        h = Harness(tiers={"premium": {"max_queue_wait_ms": 200}}, tenant_headroom=0.5)
        h.worker.learned.limit = 4
        for _ in range(32):  # its record: two requests of a second at once, every thirty
            pair = [await h.admit(h.ctx("p2")), await h.admit(h.ctx("p2"))]
            h.clock.now += 1.0
            for ctx in pair:
                h.release(ctx)
            h.clock.now += 29.0
        quiet = [await h.admit(h.ctx("p2")), await h.admit(h.ctx("p2"))]
        flood = [await h.admit(h.ctx("p1")), await h.admit(h.ctx("p1"))]
        burst = h.queue("p2")
        await settle()
        with pytest.raises(Shed):
            await h.admit(h.ctx("p1"))
        assert not burst.done(), "past its deadline, still waiting"
        h.release(quiet[0])
        await settle()
        assert burst.done() and h.pool.held == {"p1": 2, "p2": 2}
        for ctx in (quiet[1], burst.result(), *flood):
            h.release(ctx)
        assert h.pool.granted == 0 and not h.pool.granted_at and h.pool.queued_bytes == 0
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
        assert state.held == {"s1": 7} and state.queues["standard"].count == 5, "one slot (10%) left free"
        quiet = h.queue("s2")
        await settle()
        assert quiet.done(), "the quiet tenant starts at once beside the flood"
        h.release(next(t for t in flood if t.done()).result())  # a flood request ends: the flood may not refill
        await settle()
        assert state.held == {"s1": 6, "s2": 1} and state.granted == 7, "one slot stays free for the quiet one"
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
        assert h.pool.held == {"s1": 5}, "two slots for premium, one for the quiet tenant"
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
    """Two standard tenants share the six slots standard has of eight (two are premium's): three each, not
    half of the eight, or the flood's fourth slot is the quiet tenant's third."""
    async def main() -> None:
        h = Harness(tenant_headroom=0.5, premium_reserve=0.25)
        h.worker.learned.limit = 8
        await h.overlapping("s2", 3)  # the quiet tenant runs three at once
        flood = [h.queue("s1") for _ in range(12)]
        await settle()
        assert h.pool.held == {"s1": 3}, "the flood stops at its share of the class's six"
        quiet = [h.queue("s2") for _ in range(3)]
        await settle()
        assert all(t.done() for t in quiet), "all three of the quiet tenant's requests start at once"
        for task in quiet:
            h.release(task.result())
        for task in flood:
            task.cancel()
    asyncio.run(main())


def test_a_flood_over_its_share_starts_a_stream_as_one_before_it_shows_its_first_token() -> None:
    """Slots freed together go to a flooding tenant one prefill at a time, not as a wave the engine prefills
    in one long step; a lone tenant, and a quiet one, start at once."""
    async def main() -> None:
        h = Harness(tenant_headroom=0.5)
        h.worker.learned.limit = 8

        alone = [h.stream("p1") for _ in range(6)]
        await settle()
        assert all(t.done() for t in alone), "a lone tenant's streams all start at once"
        for task in alone:
            h.release(task.result())
        h.clock.now += 11  # no completions in the drain window: the bound is one prompt per worker
        h.release(await h.admit(h.ctx("p2")))  # a second premium tenant has used the pool this minute
        flood = [h.stream("p1") for _ in range(6)]
        await settle()
        assert h.pool.held == {"p1": 4}, "up to its fair share (4 of 8) unpaced"
        scheduling = h.snap.policy.scheduling
        for task in flood[:3]:
            h.controller.first_token(task.result(), h.pool, h.worker, scheduling, held=4, ttft=0.03)
        await settle()
        assert h.pool.held == {"p1": 4}, "one of its prompts still before its first token: the next waits"
        h.controller.first_token(flood[3].result(), h.pool, h.worker, scheduling, held=4, ttft=0.03)
        await settle()
        assert h.pool.held == {"p1": 5}, "none left before a first token: the next one starts"
        quiet = h.stream("p2")
        await settle()
        assert quiet.done(), "the quiet tenant starts at once"
        h.release(quiet.result())
        for task in flood:
            task.cancel()
        await settle()
        assert h.pool.starting == {"p1": {id(flood[4].result())}}, \
            "counted per request, though all share one request id (the tenant's name), until its first token"
    asyncio.run(main())


def test_a_stream_stuck_before_its_first_token_stops_pacing_its_tenant() -> None:
    """A worker that hangs before the first token would hold a paced tenant's flow to the bound until the
    upstream's timeout: past STUCK_MIN_S (and twenty least TTFTs) such a stream no longer counts as starting."""
    async def main() -> None:
        h = Harness(tenant_headroom=0.5)
        h.worker.learned.limit = 8

        h.release(await h.admit(h.ctx("p2")))  # a second premium tenant has used the pool this minute
        h.clock.now += 11  # no completions in the drain window: the bound is one prompt per worker
        flood = [h.stream("p1") for _ in range(6)]
        await settle()
        scheduling = h.snap.policy.scheduling
        for task in flood[:3]:
            h.controller.first_token(task.result(), h.pool, h.worker, scheduling, held=4, ttft=0.03)
        await settle()
        assert h.pool.held == {"p1": 4}, "its fourth stream before its first token: the fifth waits"
        h.clock.now += STUCK_MIN_S - 0.5
        flood.append(h.stream("p1"))  # an arrival grants what fits
        await settle()
        assert h.pool.held == {"p1": 4}, "still within the time a prefill may take"
        h.clock.now += 1.0
        flood.append(h.stream("p1"))
        await settle()
        assert h.pool.held == {"p1": 5}, "the fourth is stuck: the fifth starts"
        for task in flood:
            task.cancel()
        await settle()
    asyncio.run(main())


def test_the_slots_left_free_follow_how_much_the_quiet_tenant_overlaps_itself() -> None:
    async def main() -> None:
        h = Harness(tenant_headroom=0.5)
        h.worker.learned.limit = 8
        await h.overlapping("s2", 3)  # the quiet tenant's habit: a third request while two still run
        assert h.pool.demand("s2") == 3
        flood = [h.queue("s1") for _ in range(12)]
        await settle()
        assert h.pool.held == {"s1": 5}, "three slots left free: what the quiet tenant runs at once"
        quiet = [h.queue("s2") for _ in range(3)]
        await settle()
        assert all(t.done() for t in quiet), "all three of its overlapping requests start at once"
        h.release(next(t for t in flood if t.done()).result())
        await settle()
        assert h.pool.held == {"s1": 4, "s2": 3}, "its slots stay its own while it uses them"
        for task in quiet:
            h.release(task.result())
        await settle()
        assert h.pool.held == {"s1": 5}, "what it gave back goes to the flood, less its demand"
        for task in flood:
            task.cancel()
    asyncio.run(main())


@pytest.mark.parametrize("bursts", [11, 2])
def test_a_tenant_light_on_average_is_held_free_its_bursts_past_the_share(bursts: int) -> None:
    """A tenant that runs six at once for a second every ten uses under one slot of eight on average: it is
    held free its six, past its share of four at the moment, and the flood keeps the other two. Not before a
    record of 16 arrivals (two bursts are 12): then it is held to its share."""
    async def main() -> None:
        h = Harness(tenant_headroom=0.75)
        h.worker.learned.limit = 8
        for _ in range(bursts):
            held = [await h.admit(h.ctx("s2")) for _ in range(6)]
            h.clock.now += 1.0
            for ctx in held:
                h.release(ctx)
            h.clock.now += 9.0
        assert h.pool.demand("s2") == 6
        usage = h.pool.usage("s2")
        assert (usage is None) == (bursts == 2) and (usage is None or usage < 1)
        flood = [h.queue("s1") for _ in range(12)]
        await settle()
        assert h.pool.held == ({"s1": 2} if bursts == 11 else {"s1": 4})
        quiet = [h.queue("s2") for _ in range(6)]
        await settle()
        assert sum(t.done() for t in quiet) == (6 if bursts == 11 else 4)
        for task in quiet + flood:
            task.cancel()
        await settle()
    asyncio.run(main())


def test_a_tenant_light_on_average_is_not_paced_in_its_bursts() -> None:
    """Pacing holds the overload's streams to the flow's prefills; a tenant using under its share on average
    starts its burst's streams at once, past the share at the moment, before their first tokens."""
    async def main() -> None:
        h = Harness(tenant_headroom=0.75)
        h.worker.learned.limit = 8
        for _ in range(11):
            held = [await h.admit(h.ctx("p2")) for _ in range(6)]
            h.clock.now += 1.0
            for ctx in held:
                h.release(ctx)
            h.clock.now += 9.0
        h.release(await h.admit(h.ctx("p1")))  # a second premium tenant uses the pool
        burst = [h.stream("p2") for _ in range(6)]
        await settle()
        assert all(t.done() for t in burst), "all six start, none has shown a first token"
        assert len(h.pool.starting["p2"]) == 6
        for task in burst:
            h.release(task.result())
    asyncio.run(main())


def test_a_lone_tenant_leaves_the_last_slot_to_a_tenant_heard_from_within_the_minute() -> None:
    """A tenant paused past its idle gaps is not active (no share held for it), but one slot stays free for its
    return while it was heard from within the minute; after the minute, the lone tenant may take every slot."""
    async def main() -> None:
        h = Harness(tenant_headroom=0.75)
        h.worker.learned.limit = 8
        await h.paused("p2")
        flood = [h.queue("p1") for _ in range(12)]
        await settle()
        assert h.pool.held == {"p1": 7} and h.pool.queues["premium"].count == 5, "the last slot is left free"
        back = h.queue("p2")
        await settle()
        assert back.done(), "the returning tenant starts at once, beside the lone tenant's queue"
        h.release(back.result())
        h.clock.now += 61.0  # a minute since its last request: the lone tenant may use every slot
        h.release(next(t for t in flood if t.done()).result())
        await settle()
        assert h.pool.held == {"p1": 8}, "nothing is held for a tenant gone a minute"
        for task in flood:
            task.cancel()
    asyncio.run(main())


def test_a_lone_tenant_holding_nothing_takes_the_last_slot() -> None:
    """Held off the last slot only while it holds one: a standard tenant alone on an idle pool whose class has
    one slot of room (two, less the premium reserve) starts at once, a minute's returning tenant or not."""
    async def main() -> None:
        h = Harness(tenant_headroom=0.75, premium_reserve=0.25)
        await h.paused("s2")
        lone = h.queue("s1")
        await settle()
        assert lone.done(), "nothing held: no release of its own would ever grant it"
        h.release(lone.result())
    asyncio.run(main())


def test_the_slots_left_free_for_quiet_tenants_are_capped() -> None:
    async def main() -> None:
        h = Harness(tenant_headroom=0.25)
        h.worker.learned.limit = 8
        await h.overlapping("s2", 4)
        assert h.pool.demand("s2") == 4  # its fair share (4 of 8): more would not be reserved anyway
        flood = [h.queue("s1") for _ in range(12)]
        await settle()
        assert h.pool.held == {"s1": 6}, "at most a quarter of the slots is held back"
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
        assert again.past_limit and h.pool.held == {"p1": 2, "p2": 2, "s1": 1}
        for ctx in (*held, again):
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


def test_a_quiet_tenants_prefill_shares_an_engine_step_with_as_little_as_the_pool_allows() -> None:
    """An engine prefills every prompt admitted in one step together: a quiet tenant's stream goes to the worker
    with the least prefill in flight, and the flood's next streams keep off that worker until its first token."""
    async def main() -> None:
        snap = snapshot(tenant_headroom=0.5)
        spec, scheduling = snap.policy.pools["p"], snap.policy.scheduling
        clock = Clock()
        w1, w2 = (live_worker(url, scraped_at=clock.now, limit=8) for url in ("http://w1", "http://w2"))
        controller = Controller(clock=clock)
        controller.track("p", [w1, w2], spec)
        state = controller.states["p"]

        def stream(tenant: str) -> RequestContext:
            ctx = RequestContext(tenant, snap, CHAT)
            ctx.tenant, ctx.service_class, ctx.stream = snap.tenants[tenant], "premium", True
            return ctx

        flood = [stream("p1") for _ in range(9)]  # over its share (8 of 16) once the quiet tenant asks
        for ctx in flood:
            await controller.admit(ctx, "p", 100, 100)
        w1.inflight = w2.inflight = 4
        controller.sent(flood[0], state, 4000, w1)  # a long prompt prefilling on w1
        controller.sent(flood[1], state, 400, w2)  # a short one on w2
        quiet = stream("p2")
        await controller.admit(quiet, "p", 100, 100)
        assert controller.with_room(state, scheduling, quiet) == {w2}, "where the least prefill is in flight"
        assert controller.with_room(state, scheduling, flood[2]) == {w1, w2}, "no quiet prompt prefilling yet"
        controller.sent(quiet, state, 400, w2)
        assert controller.with_room(state, scheduling, flood[2]) == {w1}, "the flood keeps off its step"
        plain = stream("p1")
        plain.stream = False
        assert controller.with_room(state, scheduling, plain) == {w1}, "a whole answer's prefill too"
        controller.first_token(quiet, state, w2, scheduling, held=5, ttft=0.05)
        assert controller.with_room(state, scheduling, flood[2]) == {w1, w2}, "its first token came: all open"
        w1.inflight = 8
        controller.sent(quiet, state, 400, w2)  # (a retry, say) prefilling on w2 again
        assert controller.with_room(state, scheduling, flood[2]) == {w2}, "the only room left is taken anyway"
        w1.inflight = 4
        clock.now += STUCK_MIN_S + 0.1
        assert controller.with_room(state, scheduling, flood[2]) == {w1, w2}, "a prefill this long is stuck"
        for ctx in [*flood, quiet]:
            controller.release(ctx, state)
        assert not state.prefilling, "nothing kept past a request's end"
    asyncio.run(main())
