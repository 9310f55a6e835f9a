"""Tenant rate limits: the sliding window in-process, and shared by two replicas through Redis."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from gateway.auth import hash_key
from gateway.errors import RateLimited
from gateway.outcomes import render
from gateway.policy.loader import PolicySnapshot
from gateway.policy.schema import Policy, StatePolicy
from gateway.ratelimit import RateLimiter
from gateway.state import SharedState
from tests.conftest import Proc, on_shared_state, policy_dict

MODEL = "sim-llama-8b"


def tenant(rpm: int | None = None, tpm: int | None = None):  # type: ignore[no-untyped-def]
    policy = Policy.model_validate({"allow_empty": True, "tenants": {"t": {"tier": "standard", "rate_limit": {
        "requests_per_minute": rpm, "tokens_per_minute": tpm}}}})
    return PolicySnapshot.build(policy, "test").tenants["t"]


def test_requests_per_minute_over_a_sliding_window() -> None:
    async def main() -> None:
        limiter, t = RateLimiter(), tenant(rpm=10)
        start = 6000.0  # the start of a minute window
        for i in range(10):
            await limiter.check(t, 10, now=start + i)
        with pytest.raises(RateLimited) as caught:
            await limiter.check(t, 10, now=start + 30)
        status, headers, _ = render(caught.value)
        assert status == 429 and caught.value.code == "rate_limit_exceeded"
        assert dict(headers)[b"retry-after"] == b"36", "6 s into the next window 9 of the 10 still count"
        assert dict(headers)[b"x-ratelimit-remaining-requests"] == b"0"
        # 30 s into the next window half of the previous one still counts: 5 of 10 left
        for _ in range(5):
            await limiter.check(t, 10, now=start + 90)
        with pytest.raises(RateLimited):
            await limiter.check(t, 10, now=start + 90)
    asyncio.run(main())


def test_tokens_per_minute_count_the_worst_case() -> None:
    async def main() -> None:
        limiter, t = RateLimiter(), tenant(tpm=1000)
        await limiter.check(t, 600, now=60.0)
        with pytest.raises(RateLimited) as caught:
            await limiter.check(t, 600, now=61.0)
        assert "1000 tokens" in caught.value.message
        await limiter.check(t, 400, now=62.0)  # what fits still goes
        await limiter.check(tenant(), 10**9, now=62.0)  # no limit, no count
    asyncio.run(main())


def test_redis_down_counts_against_this_process_part() -> None:
    """Redis unreachable: the process counts in memory against its part (limit / live processes), not the
    whole limit, and does not refuse everything either."""
    async def main() -> None:
        dead = SharedState(StatePolicy(redis_url="redis://127.0.0.1:1/0", timeout_ms=100))
        limiter, t = RateLimiter(dead, processes=lambda: 2), tenant(rpm=10)
        for i in range(5):
            await limiter.check(t, 10, now=6000.0 + i)
        with pytest.raises(RateLimited) as caught:
            await limiter.check(t, 10, now=6006.0)
        assert caught.value.code == "rate_limit_exceeded", "5 of 10: this process's half"
        await dead.close()
    asyncio.run(main())


def test_two_replicas_share_one_limit_through_redis(start_gateway: Callable[..., Proc],
                                                    start_sim: Callable[..., Proc]) -> None:
    sim = start_sim("--decode-base-ms", "2")
    name, key = f"rl-{uuid.uuid4().hex[:8]}", f"tg-test-rl-{uuid.uuid4().hex}"
    policy = policy_dict([sim.url])
    policy["tenants"][name] = {"tier": "standard", "keys": ["sha256:" + hash_key(key)],
                               "rate_limit": {"requests_per_minute": 12}}
    on_shared_state(policy)
    replicas = [start_gateway(policy), start_gateway(policy)]

    def ask(i: int) -> httpx.Response:
        return httpx.post(replicas[i % 2].url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                          json={"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
                          timeout=30)
    # the official client reads the headroom as OpenAI's headers state it
    client = openai.OpenAI(base_url=replicas[1].url + "/v1", api_key=key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert raw.parse().choices[0].message.content is not None
    assert (raw.headers["x-ratelimit-limit-requests"], raw.headers["x-ratelimit-remaining-requests"]) == ("12", "11")
    assert raw.headers["x-ratelimit-reset-requests"].endswith("s"), raw.headers
    assert "x-ratelimit-limit-tokens" not in raw.headers, "no token limit, no token headers"
    with ThreadPoolExecutor(8) as pool:
        answers = [*pool.map(ask, range(1, 40))]
    ok = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code == 429]
    assert len(ok) + len(refused) == 39
    # the count is the replicas' together: every answer saw a different one
    left = [int(a.headers["x-ratelimit-remaining-requests"]) for a in ok]
    assert len(set(left)) == len(left) and all(0 <= n < 11 for n in left), left
    ok.append(raw.http_response)  # type: ignore[arg-type]
    # 12 a minute over both replicas (a few more only if the test straddles a minute boundary)
    assert 12 <= len(ok) <= 14, [(a.status_code, a.text[:200]) for a in answers]
    assert all(r.json()["error"]["code"] == "rate_limit_exceeded" and int(r.headers["retry-after"]) >= 1
               for r in refused)
