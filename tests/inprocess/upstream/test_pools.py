"""The pools keep the scheduler in step with the policy: a pool a reload replaces hands its queued and admitted
requests to the new workers, a pool removed is forgotten, and each scrape tells the scheduler (no callback of the
runtime's between them)."""

from __future__ import annotations

import asyncio

from gateway.context import RequestContext
from gateway.endpoints import CHAT
from gateway.ops.metrics import GatewayMetrics
from gateway.policy.loader import PolicySnapshot
from gateway.policy.schema import Policy, Pool
from gateway.scheduling.controller import Controller
from gateway.upstream.pools import Upstreams

NOWHERE = ["http://127.0.0.1:9"]  # nothing listens on the discard port: each scrape fails at once


class Counting(Controller):
    """The controller, counting the scrapes it is told of."""

    def __init__(self) -> None:
        super().__init__()
        self.told: list[str] = []

    def metrics_changed(self, pool: str) -> None:
        self.told.append(pool)
        super().metrics_changed(pool)


def spec(workers: list[str]) -> Pool:
    return Pool.model_validate({"workers": workers})


def test_a_reload_that_replaces_a_pool_keeps_its_counts_and_removing_it_forgets_them() -> None:
    async def main() -> None:
        snap = PolicySnapshot.build(Policy.model_validate({
            "tenants": {"s1": {"tier": "standard"}}, "models": {"m": {"pool": "p"}},
            "pools": {"p": {"workers": NOWHERE}}, "scheduling": {"mode": "fifo"}}), "test")
        scheduler = Counting()
        upstreams = Upstreams(GatewayMetrics(), scheduler)
        try:
            await upstreams.reconcile({"p": spec(NOWHERE)})
            first = upstreams.pools["p"]
            assert scheduler.told and set(scheduler.told) == {"p"}, "the first scrape, before serving, is told"
            ctx = RequestContext("s1", snap, CHAT)
            ctx.tenant = snap.tenants["s1"]
            ctx.service_class = "standard"
            handle = await scheduler.admit(ctx, "p", 10, 10)  # fifo: counted without a healthy worker
            assert handle.workers is first.workers
            first.router.index.remember((1, 2), NOWHERE[0])  # the kept worker holds a prompt

            wider = spec([*NOWHERE, "http://127.0.0.1:9/second"])
            await upstreams.reconcile({"p": wider})
            second = upstreams.pools["p"]
            assert second is not first and scheduler.states["p"] is handle, "the same counts, handed over"
            assert handle.workers is second.workers and (handle.spec, handle.granted) == (wider, 1)
            assert second.queues.queued == 0
            assert second.router.index is first.router.index and second.router.index.longest((1, 2)) == (
                NOWHERE[0], 2), "a worker kept keeps what it holds"

            await upstreams.reconcile({})
            assert "p" not in scheduler.states and upstreams.pools == {}
            scheduler.release(ctx, handle)
            assert handle.granted == 0, "a request of a removed pool still gives its slot back"
        finally:
            await upstreams.close()
    asyncio.run(main())
