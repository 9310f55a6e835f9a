"""Settling a rate-limit charge: a request gives back the tokens it did not use, and one that never ran its
request too, in the window it was charged to, in this process (and in Redis alike:
tests/process/test_ratelimit_units.py runs the same rules there)."""

from __future__ import annotations

import asyncio
import copy
import math
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import RateLimited
from gateway.outcomes import render
from gateway.policy.loader import PolicySnapshot, TenantView
from gateway.policy.schema import Policy
from gateway.ratelimit import RateLimiter

MINUTE = 6000.0  # the start of a window


def tenant(name: str = "t", rpm: int | None = None, tpm: int | None = None) -> TenantView:
    """A tenant with these limits (none: no rate_limit section at all)."""
    limits = {"requests_per_minute": rpm, "tokens_per_minute": tpm} if rpm or tpm else None
    policy = Policy.model_validate({"allow_empty": True, "tenants": {name: {"tier": "standard",
                                                                              "rate_limit": limits}}})
    return PolicySnapshot.build(policy, "test").tenants[name]


async def fills(limiter: RateLimiter, t: TenantView, tokens: int, now: float) -> bool:
    try:
        await limiter.check(t, tokens, now=now)
    except RateLimited:
        return False
    return True


async def settle_rules(limiter: RateLimiter) -> None:
    tokens = tenant("by-tokens", tpm=1000)
    charge = await limiter.check(tokens, 900, now=MINUTE)
    assert charge is not None and not await fills(limiter, tokens, 200, MINUTE + 1)
    limiter.settle(charge, used_tokens=100, ran=True)  # 800 of the worst case were not used
    await limiter.close()
    assert await fills(limiter, tokens, 700, MINUTE + 2), "the unused tokens are back"
    assert not await fills(limiter, tokens, 201, MINUTE + 3), "100 used + 700 + 201 is over 1000"

    requests = tenant("by-requests", rpm=2)
    shed = await limiter.check(requests, 1, now=MINUTE)
    await limiter.check(requests, 1, now=MINUTE)
    assert shed is not None and not await fills(limiter, requests, 1, MINUTE + 1)
    limiter.settle(shed, used_tokens=0, ran=False)  # shed before it ran: it gives its request back
    await limiter.close()
    assert await fills(limiter, requests, 1, MINUTE + 2)
    assert not await fills(limiter, requests, 1, MINUTE + 3), "given back once, not twice"


def test_settling_gives_back_what_was_not_used_in_this_process() -> None:
    asyncio.run(settle_rules(RateLimiter()))


def test_a_charge_from_a_window_gone_by_is_not_refunded_into_the_new_one() -> None:
    async def main() -> None:
        limiter, t = RateLimiter(), tenant(rpm=1)
        old = await limiter.check(t, 1, now=MINUTE)
        assert old is not None
        await limiter.check(t, 1, now=MINUTE + 120)  # two minutes on: the old window is forgotten
        limiter.settle(old, used_tokens=0, ran=False)
        assert not await fills(limiter, t, 1, MINUTE + 121), "the new window's request still counts"
    asyncio.run(main())


def test_a_tenant_without_a_limit_is_neither_charged_nor_refused() -> None:
    assert asyncio.run(RateLimiter().check(tenant(), 10**9, now=MINUTE)) is None


@settings(max_examples=150, deadline=None)
@given(limit=st.integers(1, 50), cost=st.integers(1, 60), at=st.floats(0, 59.99),
       earlier=st.lists(st.floats(0, 1), max_size=60))
def test_retry_after_is_the_first_moment_the_request_fits(limit: int, cost: int, at: float,
                                                          earlier: list[float]) -> None:
    """Requests counted over the last two windows, then one refused: retried at its Retry-After (exact, before
    rounding up to a whole second) it fits; a second sooner it is refused again; one larger than the limit is
    told so. (Positive control: the rule this replaced, "until the next window begins", fails here: at the
    boundary the whole window just ended still counts.)"""
    async def main() -> None:
        t, limiter = tenant(tpm=limit), RateLimiter()
        now = MINUTE + at
        for share in sorted(earlier):  # from the previous window's start to now
            await fills(limiter, t, 1, MINUTE - 60 + share * (60 + at))
        try:
            await limiter.check(t, cost, now=now)
        except RateLimited as refused:
            if cost > limit:
                assert "alone counts more than the limit" in refused.message
                return
            wait = refused.retry_after_s
            assert dict(render(refused)[1])[b"retry-after"] == str(max(1, math.ceil(wait))).encode()
            assert int(dict(render(refused)[1])[b"x-ratelimit-remaining-tokens"]) < cost
            if wait > 1:
                assert not await fills(copy.deepcopy(limiter), t, cost, now + wait - 1), "fits a second sooner"
            assert await fills(limiter, t, cost, now + wait + 1e-6), "refused again at its Retry-After"
    asyncio.run(main())


async def headroom_rules(limiter: RateLimiter) -> None:
    t = tenant(f"headers-{uuid.uuid4().hex[:6]}", rpm=3, tpm=100)
    first = await limiter.check(t, 30, now=MINUTE + 10)
    second = await limiter.check(t, 30, now=MINUTE + 11)
    assert first is not None and second is not None
    assert dict(first.headers()) == {
        b"x-ratelimit-limit-requests": b"3", b"x-ratelimit-remaining-requests": b"2",
        b"x-ratelimit-reset-requests": b"1m50s", b"x-ratelimit-limit-tokens": b"100",
        b"x-ratelimit-remaining-tokens": b"70", b"x-ratelimit-reset-tokens": b"1m50s"}
    assert dict(second.headers())[b"x-ratelimit-remaining-tokens"] == b"40"
    only_requests = await limiter.check(tenant(f"rpm-{uuid.uuid4().hex[:6]}", rpm=5), 10, now=MINUTE)
    assert only_requests is not None and {k for k, _ in only_requests.headers()} == {
        b"x-ratelimit-limit-requests", b"x-ratelimit-remaining-requests", b"x-ratelimit-reset-requests"}


def test_the_answer_says_the_limits_headroom_as_openai_does_in_this_process() -> None:
    asyncio.run(headroom_rules(RateLimiter()))


@pytest.mark.parametrize(("seconds", "text"), [(0.25, "250ms"), (1, "1s"), (59.2, "1m0s"), (360, "6m0s")])
def test_a_reset_reads_as_openai_writes_it(seconds: float, text: str) -> None:
    from gateway.ratelimit import duration

    assert duration(seconds) == text
