"""The cache store's tests (tests/inprocess/cache/test_parts.py) on a real Redis, this machine's: the in-process
layer runs them on the in-process store."""

from __future__ import annotations

import pytest
import redis

from gateway.cache.store import RedisStore
from tests.fakes import HandClock
from tests.inprocess.cache.test_parts import _state, clock, test_store_lru_ttl_exact_and_events

__all__ = ["clock", "test_store_lru_ttl_exact_and_events"]  # collected here, on the store below


@pytest.fixture(params=["redis"])
def store(request: pytest.FixtureRequest, clock: HandClock) -> RedisStore:
    redis.Redis(db=15).flushdb()
    return RedisStore(_state("redis://127.0.0.1:6379/15"), clock)
