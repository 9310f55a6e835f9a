"""Settling a rate-limit charge and the headroom headers in Redis (this machine's): the rules
tests/inprocess/test_ratelimit_units.py holds the in-process limiter to."""

from __future__ import annotations

import asyncio
import uuid

from gateway.policy.schema import StatePolicy
from gateway.ratelimit import RateLimiter
from gateway.state import SharedState
from tests.conftest import REDIS_URL
from tests.inprocess.test_ratelimit_units import MINUTE, headroom_rules, settle_rules, tenant


def test_settling_gives_back_what_was_not_used_in_redis() -> None:
    async def main() -> None:
        state = SharedState(StatePolicy(redis_url=REDIS_URL, namespace=f"test-{uuid.uuid4().hex[:8]}"))
        try:
            limiter = RateLimiter(state)
            charge = await limiter.check(tenant(tpm=1000), 10, now=MINUTE)
            assert charge is not None and charge.in_redis, "counted in Redis, so settled there"
            limiter.settle(charge, 10, ran=True)
            await settle_rules(limiter)
        finally:
            await state.close()
    asyncio.run(main())


def test_the_answer_says_the_limits_headroom_as_openai_does_in_redis() -> None:
    async def main() -> None:
        state = SharedState(StatePolicy(redis_url=REDIS_URL, namespace=f"test-{uuid.uuid4().hex[:8]}"))
        try:
            await headroom_rules(RateLimiter(state))
        finally:
            await state.close()
    asyncio.run(main())
