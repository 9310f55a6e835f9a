"""The budget counters' tests (tests/inprocess/spend/test_money.py) on Redis, this machine's, and what only Redis
does: a reservation whose process died lapses."""

from __future__ import annotations

import asyncio
import os

import pytest

from gateway.policy.schema import StatePolicy
from gateway.spend import counters as module
from gateway.state import SharedState
from tests.conftest import REDIS_URL
from tests.inprocess.spend.test_money import (
    test_a_settlement_without_a_reservation_still_counts,
    test_counters_need_a_seed_for_a_new_period_and_never_go_past_the_limit,
    test_what_settles_is_what_the_counter_holds_not_what_the_caller_believes,
)

__all__ = [  # collected here, on the counters below
    "test_a_settlement_without_a_reservation_still_counts",
    "test_counters_need_a_seed_for_a_new_period_and_never_go_past_the_limit",
    "test_what_settles_is_what_the_counter_holds_not_what_the_caller_believes",
]


@pytest.fixture(params=[REDIS_URL], ids=["redis"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_reservation_nobody_settles_lapses(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process killed with requests in flight leaves their reservations; they are released after HOLD_S."""
    async def main() -> None:
        state = SharedState(StatePolicy(redis_url=REDIS_URL, namespace=f"test-{os.urandom(4).hex()}"))
        redis_counters = module.RedisCounters(state)
        monkeypatch.setattr(module, "HOLD_S", -1.0)  # already past its hold
        assert await redis_counters.reserve("t:d", "dead", 900, 1000, 0) == (True, 0, 900)
        monkeypatch.setattr(module, "HOLD_S", 3600.0)
        assert await redis_counters.reserve("t:d", "live", 900, 1000, None) == (True, 0, 900), "the dead one lapsed"
        assert await redis_counters.reserve("t:d", "more", 200, 1000, None) == (False, 0, 900), "the live one holds"
        await state.close()
    asyncio.run(main())
