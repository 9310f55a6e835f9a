"""Budget counters: spent and reserved per tenant and period, in nano-USD integers (no float drift).

``RedisCounters`` makes reserve and settle atomic across replicas with two Lua scripts; ``MemoryCounters`` does
the same in this process (one replica). A counter that does not exist yet (a new period, or Redis restarted
and lost it) is seeded from the durable ledger, which stays the truth: ``reserve`` answers ``None`` and the
caller seeds it.

Each reservation is held under its own id, beside the counter, so that what settles is what was reserved,
never what the caller believes it reserved: a reserve the caller gave up on (a timeout) but that Redis ran
later is released by the request's settle all the same; a settle after Redis lost the reservations (a restart)
releases nothing instead of driving ``reserved`` below zero; a reservation whose process died lapses after
``HOLD_S``. Settling a request that reserved nothing (admitted while Redis was down, a priced cache hit) adds
its cost all the same.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gateway.state import SharedState

NANO = 1_000_000_000
KEEP_S = 40 * 86400  # a period's counter outlives the period by this much
HOLD_S = 3600.0  # a reservation nobody settled (its process died) lapses after this long

# KEYS: counter, reservation amounts, reservation deadlines
# ARGV: amount, limit, seed ('' for none), keep_s, id, deadline, now. At most 100 lapsed reservations are
# released per reserve (each reserve sweeps some: a backlog clears quickly, no call is slow).
_RESERVE = """
if redis.call('exists', KEYS[1]) == 0 then
  if ARGV[3] == '' then return nil end
  redis.call('hset', KEYS[1], 'spent', ARGV[3], 'reserved', 0)
  redis.call('expire', KEYS[1], ARGV[4])
end
local lapsed = redis.call('zrangebyscore', KEYS[3], '-inf', ARGV[7], 'LIMIT', 0, 100)
for _, id in ipairs(lapsed) do
  local held = tonumber(redis.call('hget', KEYS[2], id) or '0')
  if held > 0 then redis.call('hincrby', KEYS[1], 'reserved', 0 - held) end
  redis.call('hdel', KEYS[2], id)
  redis.call('zrem', KEYS[3], id)
end
local spent = tonumber(redis.call('hget', KEYS[1], 'spent'))
local reserved = tonumber(redis.call('hget', KEYS[1], 'reserved'))
if reserved < 0 then
  redis.call('hset', KEYS[1], 'reserved', 0)
  reserved = 0
end
local amount = tonumber(ARGV[1])
if spent + reserved + amount > tonumber(ARGV[2]) then return {0, spent, reserved} end
redis.call('hincrby', KEYS[1], 'reserved', amount)
redis.call('hset', KEYS[2], ARGV[5], amount)
redis.call('zadd', KEYS[3], ARGV[6], ARGV[5])
redis.call('expire', KEYS[2], ARGV[4])
redis.call('expire', KEYS[3], ARGV[4])
return {1, spent, reserved + amount}
"""
# KEYS: counter, reservation amounts, reservation deadlines; ARGV: id ('' for none), actual
_SETTLE = """
local held = 0
if ARGV[1] ~= '' then
  held = tonumber(redis.call('hget', KEYS[2], ARGV[1]) or '0')
  redis.call('hdel', KEYS[2], ARGV[1])
  redis.call('zrem', KEYS[3], ARGV[1])
end
if redis.call('exists', KEYS[1]) == 0 then return nil end
if held > 0 then redis.call('hincrby', KEYS[1], 'reserved', 0 - held) end
local spent = redis.call('hincrby', KEYS[1], 'spent', ARGV[2])
local reserved = tonumber(redis.call('hget', KEYS[1], 'reserved'))
if reserved < 0 then
  redis.call('hset', KEYS[1], 'reserved', 0)
  reserved = 0
end
return {spent, reserved}
"""


class Counters(Protocol):
    async def reserve(self, key: str, rid: str, amount: int, limit: int,
                      seed: int | None) -> tuple[bool, int, int] | None:
        """Hold ``amount`` under ``rid``: (granted, spent, reserved after), or None when the counter is missing
        and no seed was given."""

    async def settle(self, key: str, rid: str | None, actual: int) -> tuple[int, int] | None:
        """Release what ``rid`` holds (if anything) and add the actual spend: (spent, reserved) after, None if
        the counter is missing."""

    async def close(self) -> None: ...


class MemoryCounters:
    def __init__(self) -> None:
        self._counters: dict[str, list[int]] = {}  # key -> [spent, reserved]
        self._held: dict[str, dict[str, int]] = {}  # key -> reservation id -> amount
        self._made: dict[str, float] = {}

    async def reserve(self, key: str, rid: str, amount: int, limit: int,
                      seed: int | None) -> tuple[bool, int, int] | None:
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
        self._held.setdefault(key, {})[rid] = amount
        return True, spent, counter[1]

    async def settle(self, key: str, rid: str | None, actual: int) -> tuple[int, int] | None:
        return self.settle_now(key, rid, actual)

    def settle_now(self, key: str, rid: str | None, actual: int) -> tuple[int, int] | None:
        """``settle`` without a coroutine: in-process, the request path need not schedule anything."""
        held = self._held.get(key, {}).pop(rid, 0) if rid is not None else 0
        counter = self._counters.get(key)
        if counter is None:
            return None
        counter[1] = max(0, counter[1] - held)
        counter[0] += actual
        return counter[0], counter[1]

    def _expire(self) -> None:
        cutoff = time.time() - KEEP_S
        for key in [k for k, made in self._made.items() if made < cutoff]:
            self._counters.pop(key, None)
            self._held.pop(key, None)
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

    def _keys(self, key: str) -> list[str]:
        return [self.prefix + key, self.prefix + key + ":held", self.prefix + key + ":until"]

    async def reserve(self, key: str, rid: str, amount: int, limit: int,
                      seed: int | None) -> tuple[bool, int, int] | None:
        now = time.time()
        result = await self._reserve(keys=self._keys(key), args=[
            amount, limit, "" if seed is None else seed, KEEP_S, rid, repr(now + HOLD_S), repr(now)])
        if result is None:
            return None
        granted, spent, reserved = (int(v) for v in result)
        return bool(granted), spent, reserved

    async def settle(self, key: str, rid: str | None, actual: int) -> tuple[int, int] | None:
        result = await self._settle(keys=self._keys(key), args=[rid or "", actual])
        if result is None:
            return None
        return int(result[0]), int(result[1])

    async def close(self) -> None:
        return None  # the client is the process's (gateway.state), closed with it
