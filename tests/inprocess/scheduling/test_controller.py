"""The controller keeps each pool's queues and counts by pool name: what the pools tell it (track, untrack,
metrics_changed, set_share) and the handle ``admit`` gives back."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.context import RequestContext
from gateway.endpoints import CHAT
from gateway.errors import Unavailable
from gateway.policy.loader import PolicySnapshot
from gateway.policy.schema import Policy
from gateway.scheduling.controller import Controller
from gateway.state.replicas import ALONE, Share
from tests.fakes import live_worker

NOW = 1000.0


def snapshot(workers: int = 1) -> PolicySnapshot:
    policy = Policy.model_validate({
        "tenants": {"p1": {"tier": "premium"}, "s1": {"tier": "standard"}, "s2": {"tier": "standard"}},
        "models": {"m": {"pool": "p"}},
        "pools": {"p": {"workers": [f"http://w{i}" for i in range(workers)], "max_inflight_per_worker": 2}},
        "scheduling": {"batch_headroom": 0.0, "premium_reserve": 0.0, "tenant_headroom": 0.0}})
    return PolicySnapshot.build(policy, "test")


def request(snap: PolicySnapshot, tenant: str) -> RequestContext:
    ctx = RequestContext(tenant, snap, CHAT)
    ctx.tenant = snap.tenants[tenant]
    ctx.service_class = ctx.tenant.tier
    return ctx


def controller(snap: PolicySnapshot, **kw: Any) -> Controller:
    return Controller(clock=lambda: NOW, scheduling=lambda: snap.policy.scheduling, **kw)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_pool_a_reload_replaces_keeps_its_counts_now_against_the_new_workers() -> None:
    async def main() -> None:
        snap, wider = snapshot(1), snapshot(2)
        c = controller(snap)
        old = live_worker("http://w0", scraped_at=NOW, limit=1)
        before = c.track("p", [old], snap.policy.pools["p"])
        first = request(snap, "s1")
        running = await c.admit(first, "p", 100, 100)
        waiting = asyncio.ensure_future(c.admit(request(snap, "s2"), "p", 100, 100))
        await settle()
        assert before.queued == 1 and not waiting.done(), "one slot, taken: the second waits"

        new = [live_worker("http://w0", scraped_at=NOW, limit=1), live_worker("http://w1", scraped_at=NOW, limit=1)]
        after = c.track("p", new, wider.policy.pools["p"])
        state = c.states["p"]
        assert state is running, "the same queues and counts, not new ones"
        assert state.workers is new and state.spec is wider.policy.pools["p"]
        assert (state.granted, after.queued, before.queued) == (1, 1, 1), "what was admitted and queued stays"
        premium = await asyncio.wait_for(c.admit(request(snap, "p1"), "p", 100, 100), 1)
        assert premium is state and state.granted == 2, "the new worker's slot, beside the one still counted"
        assert not waiting.done(), "both slots of the new workers are held: the queued one still waits"

        c.release(first, running)
        await settle()
        assert waiting.done() and after.depths() == {"premium": 0, "standard": 0, "batch": 0}
        waiting.result()
    asyncio.run(main())


def test_a_pool_gone_is_forgotten_but_its_requests_still_release() -> None:
    async def main() -> None:
        snap = snapshot()
        c = controller(snap)
        c.track("p", [live_worker("http://w0", scraped_at=NOW, limit=2)], snap.policy.pools["p"])
        admitted = request(snap, "s1")
        handle = await c.admit(admitted, "p", 100, 100)
        c.untrack("p")
        assert "p" not in c.states and c.snapshot(["p"]) == {}
        c.metrics_changed("p")  # a retiring pool's last scrape: nothing to grant
        c.release(admitted, handle)
        assert handle.granted == 0 and c.tenant_inflight == {}
        c.track("p", [live_worker("http://w0", scraped_at=NOW, limit=2)], snap.policy.pools["p"])
        assert c.states["p"] is not handle and c.states["p"].granted == 0, "added again, it starts afresh"
        with pytest.raises(Unavailable):  # a pool it does not keep: the pipeline's fallback rule, not a 500
            await c.admit(request(snap, "s1"), "gone", 100, 100)
        assert c.tenant_inflight == {}, "nothing taken for it"
    asyncio.run(main())


def test_fresh_metrics_learn_each_worker_and_grant_what_now_fits() -> None:
    async def main() -> None:
        snap = snapshot()
        c = controller(snap)
        worker = live_worker("http://w0", scraped_at=NOW, limit=1)
        worker.learned.limit_found = True
        c.track("p", [worker], snap.policy.pools["p"])
        await c.admit(request(snap, "s1"), "p", 100, 100)
        waiting = asyncio.ensure_future(c.admit(request(snap, "s2"), "p", 100, 100))
        await settle()
        assert not waiting.done()
        worker.observed.running = 1  # the engine runs its one request and queues none: the limit probes up
        c.metrics_changed("p")
        await settle()
        assert worker.learned.limit == 2 and waiting.done() and c.states["p"].granted == 2
        waiting.result()
    asyncio.run(main())


def test_a_larger_share_grants_what_waits_in_every_pool() -> None:
    async def main() -> None:
        snap = snapshot()
        c = controller(snap, share=Share(0, 2))  # one of two processes: its part of the 2-slot worker is 1
        worker = live_worker("http://w0", scraped_at=NOW, limit=2)
        worker.learned.limit_found = True
        c.track("p", [worker], snap.policy.pools["p"])
        await c.admit(request(snap, "s1"), "p", 100, 100)
        waiting = asyncio.ensure_future(c.admit(request(snap, "s2"), "p", 100, 100))
        await settle()
        assert not waiting.done()
        c.set_share(ALONE)
        await settle()
        assert c.share == ALONE and waiting.done() and c.states["p"].granted == 2
        waiting.result()
    asyncio.run(main())
