"""Budget counters: spent and reserved per tenant and period, in nano-USD integers (no float drift).

``RedisCounters`` makes reserve and settle atomic across replicas with two Lua scripts; ``MemoryCounters`` does
the same in this process (one replica). A counter that does not exist yet (a new period, or Redis restarted
and lost it) is seeded from the durable ledger, which stays the truth: ``reserve`` answers ``None`` and the
caller seeds it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gateway.state import SharedState

NANO = 1_000_000_000
KEEP_S = 40 * 86400  # a period's counter outlives the period by this much

_RESERVE = """
if redis.call('exists', KEYS[1]) == 0 then
  if ARGV[3] == '' then return nil end
  redis.call('hset', KEYS[1], 'spent', ARGV[3], 'reserved', 0)
  redis.call('expire', KEYS[1], ARGV[4])
end
local spent = tonumber(redis.call('hget', KEYS[1], 'spent'))
local reserved = tonumber(redis.call('hget', KEYS[1], 'reserved'))
local amount = tonumber(ARGV[1])
if spent + reserved + amount > tonumber(ARGV[2]) then return {0, spent, reserved} end
redis.call('hincrby', KEYS[1], 'reserved', amount)
return {1, spent, reserved + amount}
"""
_SETTLE = """
if redis.call('exists', KEYS[1]) == 0 then return nil end
redis.call('hincrby', KEYS[1], 'reserved', -tonumber(ARGV[1]))
local spent = redis.call('hincrby', KEYS[1], 'spent', ARGV[2])
return {spent, tonumber(redis.call('hget', KEYS[1], 'reserved'))}
"""


class Counters(Protocol):
    async def reserve(self, key: str, amount: int, limit: int, seed: int | None) -> tuple[bool, int, int] | None:
        """(granted, spent, reserved after), or None when the counter is missing and no seed was given."""

    async def settle(self, key: str, reserved: int, actual: int) -> tuple[int, int] | None:
        """Release a reservation and add the actual spend: (spent, reserved) after, None if missing."""

    async def close(self) -> None: ...


class MemoryCounters:
    def __init__(self) -> None:
        self._counters: dict[str, list[int]] = {}  # key -> [spent, reserved]
        self._made: dict[str, float] = {}

    async def reserve(self, key: str, amount: int, limit: int, seed: int | None) -> tuple[bool, int, int] | None:
        counter = self._counters.get(key)
        if counter is None:
            if seed is None:
                return None
            counter = self._counters[key] = [seed, 0]
            self._made[key] = time.time()
            self._expire()
        spent, reserved = counter
        if spent + reserved + amount > limit:
            return False, spent, reserved
        counter[1] += amount
        return True, spent, counter[1]

    async def settle(self, key: str, reserved: int, actual: int) -> tuple[int, int] | None:
        return self.settle_now(key, reserved, actual)

    def settle_now(self, key: str, reserved: int, actual: int) -> tuple[int, int] | None:
        """``settle`` without a coroutine: in-process, the request path need not schedule anything."""
        counter = self._counters.get(key)
        if counter is None:
            return None
        counter[1] -= reserved
        counter[0] += actual
        return counter[0], counter[1]

    def _expire(self) -> None:
        cutoff = time.time() - KEEP_S
        for key in [k for k, made in self._made.items() if made < cutoff]:
            self._counters.pop(key, None)
            self._made.pop(key, None)

    async def close(self) -> None:
        return None


class RedisCounters:
    def __init__(self, state: SharedState) -> None:
        """On the process's one Redis client, under its namespace."""
        assert state.redis is not None
        self.redis = state.redis
        self.prefix = state.prefix + "budget:"
        self._reserve = self.redis.register_script(_RESERVE)
        self._settle = self.redis.register_script(_SETTLE)

    async def reserve(self, key: str, amount: int, limit: int, seed: int | None) -> tuple[bool, int, int] | None:
        result = await self._reserve(keys=[self.prefix + key], args=[amount, limit, "" if seed is None else seed,
                                                                      KEEP_S])
        if result is None:
            return None
        granted, spent, reserved = (int(v) for v in result)
        return bool(granted), spent, reserved

    async def settle(self, key: str, reserved: int, actual: int) -> tuple[int, int] | None:
        result = await self._settle(keys=[self.prefix + key], args=[reserved, actual])
        if result is None:
            return None
        return int(result[0]), int(result[1])

    async def close(self) -> None:
        return None  # the client is the process's (gateway.state), closed with it
