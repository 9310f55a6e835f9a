"""A key's own limits, enforced beside its tenant's by the real rate limiter (in this process; in Redis:
tests/process/keys/test_model.py) and the real budget: the request must fit both, a refusal names the one it
met, and what the other had granted is given back."""

from __future__ import annotations

import asyncio
import math
import os
from typing import Any

import orjson
import pytest

from gateway.context import RequestContext
from gateway.endpoints import CHAT
from gateway.errors import OverBudget, RateLimited
from gateway.keys.model import KeyedTenant, KeyRecord, narrowed
from gateway.openai_api import prepare
from gateway.ops.metrics import GatewayMetrics
from gateway.policy.loader import PolicySnapshot, TenantView
from gateway.policy.schema import Budget, Policy, RateLimit, StatePolicy
from gateway.ratelimit import RateLimiter
from gateway.spend.alerts import Alerts
from gateway.spend.counters import NANO, MemoryCounters
from gateway.spend.service import Spend
from gateway.state import SharedState

MINUTE = 6000.0
MODEL = "m"


def tenant(**extra: Any) -> TenantView:
    policy = Policy.model_validate({"tenants": {"t": {"tier": "standard", **extra}}, "models": {MODEL: {"pool": "p"}},
                                    "pools": {"p": {"workers": ["http://127.0.0.1:9"]}},
                                    "prices": {"models": {MODEL: [{"effective": "2026-01-01", "input_per_m": 1.0,
                                                                   "output_per_m": 4.0}]}}})
    return PolicySnapshot.build(policy, "test").tenants["t"]


def record(kid: str, budget: Budget | None = None, rate_limit: RateLimit | None = None,
           models: tuple[str, ...] | None = None) -> KeyRecord:
    return KeyRecord(id=kid, digest=kid * 5, tenant="t", name="", created_at=0.0, created_by="admin:x",
                     expires_at=None, revoked_at=None, revoked_by=None, rotated_from=None, rotated_to=None,
                     budget=budget, rate_limit=rate_limit, models=models, version=1)


@pytest.fixture(params=["memory"])  # tests/process/keys/test_model.py runs the limiter's tests on Redis too
def limiter(request: pytest.FixtureRequest) -> Any:
    return request.param


async def opened(kind: str) -> tuple[RateLimiter, SharedState | None]:
    """A rate limiter of ``kind``: "memory", or a Redis's URL (under a namespace of its own)."""
    if kind == "memory":
        return RateLimiter(), None
    state = SharedState(StatePolicy(redis_url=kind, namespace=f"test-{os.urandom(4).hex()}"))
    return RateLimiter(state), state


def test_a_key_has_its_own_requests_per_minute_inside_its_tenants(limiter: str) -> None:
    async def main() -> None:
        rl, state = await opened(limiter)
        try:
            base = tenant(rate_limit={"requests_per_minute": 5})
            capped = narrowed(base, record("key-aaaaaaaaaaaa", rate_limit=RateLimit(requests_per_minute=2)))
            free = narrowed(base, record("key-bbbbbbbbbbbb", models=(MODEL,)))  # its own models, no own limit
            assert isinstance(capped, KeyedTenant) and isinstance(free, KeyedTenant)
            charges = [await rl.check(capped, 10, now=MINUTE) for _ in range(2)]
            assert all(c is not None and c.scopes == ("t", "#key-aaaaaaaaaaaa") for c in charges)
            with pytest.raises(RateLimited, match="API key 'key-aaaaaaaaaaaa' of tenant 't': 2 requests"):
                await rl.check(capped, 10, now=MINUTE + 1)
            for _ in range(3):  # the refused request took nothing from the tenant: 3 of its 5 are left
                await rl.check(free, 10, now=MINUTE + 2)
            with pytest.raises(RateLimited, match="for tenant 't': 5 requests"):
                await rl.check(free, 10, now=MINUTE + 3)
            with pytest.raises(RateLimited, match="for tenant 't'"):
                await rl.check(capped, 10, now=MINUTE + 3)

            rl.settle(charges[0], 0, ran=False)  # never ran: its request back, to the key and the tenant
            await rl.close()
            assert await rl.check(capped, 10, now=MINUTE + 4) is not None
        finally:
            if state is not None:
                await state.close()
    asyncio.run(main())


def test_a_key_limited_where_its_tenant_is_not_is_counted_alone(limiter: str) -> None:
    async def main() -> None:
        rl, state = await opened(limiter)
        try:
            own = narrowed(tenant(), record("key-cccccccccccc", rate_limit=RateLimit(tokens_per_minute=100)))
            charge = await rl.check(own, 60, now=MINUTE)
            assert charge is not None and charge.scopes == ("#key-cccccccccccc",)
            with pytest.raises(RateLimited, match="100 tokens"):
                await rl.check(own, 60, now=MINUTE + 1)
            rl.settle(charge, 20, ran=True)  # used 20 of its 60
            await rl.close()
            assert await rl.check(own, 60, now=MINUTE + 2) is not None
            assert await rl.check(tenant(), 10**9, now=MINUTE) is None, "no limit anywhere: nothing counted"
        finally:
            if state is not None:
                await state.close()
    asyncio.run(main())


async def admitted(spend: Spend, view: TenantView, max_tokens: int) -> tuple[RequestContext, OverBudget | None]:
    """A request admitted as the pipeline admits it: its context, and the refusal if it was refused."""
    snap = PolicySnapshot.build(Policy.model_validate({
        "tenants": {"t": {"tier": "standard"}}, "models": {MODEL: {"pool": "p"}},
        "pools": {"p": {"workers": ["http://127.0.0.1:9"]}},
        "prices": {"models": {MODEL: [{"effective": "2026-01-01", "input_per_m": 1.0, "output_per_m": 4.0}]}}}),
        "test")
    ctx = RequestContext("r", snap, CHAT)
    ctx.tenant, ctx.model = view, MODEL
    body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens})
    call = await prepare(ctx, body)
    spend.baselines.seed("t", 1.0, 1000)  # a large baseline: no cost anomaly here
    try:
        await spend.admit(ctx, call)
    except OverBudget as refused:
        return ctx, refused
    return ctx, None


def test_a_keys_own_budget_holds_beside_its_tenants_and_a_refusal_gives_the_tenants_back() -> None:
    """Each request's worst case is about 0.004 USD (1000 output tokens at 4 USD per million): the key's 0.01
    per day lets two be in flight; the tenant's 1.00 would let hundreds."""
    async def main() -> None:
        metrics = GatewayMetrics()
        spend = Spend(metrics, Alerts(metrics, None), None)
        base = tenant(budget={"period": "month", "limit_usd": 1.0})
        view = narrowed(base, record("key-dddddddddddd", budget=Budget(period="day", limit_usd=0.01)))
        (first, _), (second, _) = await admitted(spend, view, 1000), await admitted(spend, view, 1000)
        third, refused = await admitted(spend, view, 1000)
        assert refused is not None and refused.code == "insufficient_quota"
        assert refused.message.startswith("API key 'key-dddddddddddd' of tenant 't' has ")
        assert "left of its daily budget of 0.01 USD" in refused.message, refused.message
        counters = spend.counters
        assert isinstance(counters, MemoryCounters)
        a = first.reservation.amount  # type: ignore[attr-defined]
        month, day = (next(k for k in counters._counters if k.startswith(p)) for p in ("t:", "#key-dddddddddddd:"))
        assert counters._counters[day] == [0, 2 * a]
        assert counters._counters[month] == [0, 3 * a], "the refused request's tenant part is held until it settles"
        spend.settle(third, 0.0)  # as every request ends (accounting): what it held is given back
        assert counters._counters[month] == [0, 2 * a]
        spend.settle(first, 0.0005)
        assert counters._counters[day] == counters._counters[month] == [math.ceil(0.0005 * NANO), a]
        fourth, refused = await admitted(spend, view, 1000)  # room again, under both
        assert refused is None
        for ctx in (second, fourth):
            spend.settle(ctx, 0.0)
        assert counters._counters[day] == counters._counters[month] == [math.ceil(0.0005 * NANO), 0]
        plain = tenant(budget={"period": "month", "limit_usd": 1.0})
        ctx, _ = await admitted(spend, plain, 1000)  # a key with no budget of its own: the tenant's alone
        assert ctx.reservation.then is None and ctx.reservation.scope == "t"  # type: ignore[attr-defined]
    asyncio.run(main())
