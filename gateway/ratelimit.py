"""Tenant rate limits: requests and tokens per minute, over a sliding window, atomic across replicas in Redis.

Tokens are charged at admission at the request's worst case (Call.worst_tokens: every body byte a prompt token,
plus max_tokens for every sequence), so a burst cannot pass the limit on answers not yet written, then settled
when the request ends: the charge drops to the tokens the worker reported, and a request that never ran (shed,
refused by its budget) gives back its request and its tokens, so a batch line retried after a shed is charged
once. The window is the current minute plus the previous one weighted by how much of it still overlaps the last 60
seconds (the sliding-window counter). Over the limit: 429 ``rate_limit_exceeded`` with a Retry-After of the
seconds until this request fits if nothing else is counted meanwhile (``wait_to_fit``), and the x-ratelimit-*
headers a success carries: remaining, and reset as OpenAI means it, the time until the whole allowance is back
(``until_clear``: up to two minutes, as what counts now slides out of the window). With Redis configured
(``state.redis_url``) every replica shares the counts (one Lua step checks and adds both); otherwise they are this
process's. While Redis fails, each process counts in memory against its part of the limit (the limit divided by
the live gateway processes it last saw), so the processes together stay near the limit instead of each letting the
whole limit through; the memory counts start from zero, so the minute Redis fails may let up to twice the limit
through.

A runtime key with a rate limit of its own (gateway.keys) is counted beside its tenant: the request must fit
both, checked and charged in the same step, and a refusal names the limit it met.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.errors import RateLimited
from gateway.policy.loader import TenantView
from gateway.policy.schema import RateLimit

if TYPE_CHECKING:
    from gateway.state import SharedState

log = logging.getLogger("tollgate.ratelimit")
WINDOW_S = 60

# KEYS: per scope (the tenant, then the key if it has its own limit) its requests now, requests before, tokens
# now, tokens before. ARGV: requests, tokens, the previous window's weight, then per scope its requests and tokens
# per minute (0: none). Every scope must fit before any is charged. Returns whether it was allowed, the first scope
# refused, then per scope and kind the previous window's count and this one's (after the charge, if allowed).
_CHECK = """
local allowed = 1
local refused = 0
local scopes = #KEYS / 4
for s = 0, scopes - 1 do
  for i = 0, 1 do
    local limit = tonumber(ARGV[4 + 2 * s + i])
    if limit > 0 then
      local cur = tonumber(redis.call('get', KEYS[4 * s + 1 + 2 * i]) or '0')
      local prev = tonumber(redis.call('get', KEYS[4 * s + 2 + 2 * i]) or '0')
      if prev * tonumber(ARGV[3]) + cur + tonumber(ARGV[1 + i]) > limit then
        allowed = 0
        if refused == 0 then refused = s + 1 end
      end
    end
  end
end
local counts = {}
for s = 0, scopes - 1 do
  for i = 0, 1 do
    local key = KEYS[4 * s + 1 + 2 * i]
    local cur = tonumber(redis.call('get', key) or '0')
    if allowed == 1 then
      cur = redis.call('incrby', key, ARGV[1 + i])
      redis.call('expire', key, 130)
    end
    counts[#counts + 1] = tonumber(redis.call('get', KEYS[4 * s + 2 + 2 * i]) or '0')
    counts[#counts + 1] = cur
  end
end
return {allowed, refused, unpack(counts)}
"""


# Give back part of a charge, in the window it was made in, never below zero (KEYS: requests, tokens).
_REFUND = """
for i = 1, 2 do
  local back = tonumber(ARGV[i])
  if back > 0 and redis.call('exists', KEYS[i]) == 1 then
    if redis.call('decrby', KEYS[i], back) < 0 then redis.call('set', KEYS[i], 0, 'KEEPTTL') end
  end
end
return 1
"""


@dataclass(frozen=True, slots=True)
class Headroom:
    """One limit as OpenAI's x-ratelimit-* headers state it: the tightest scope's, after this request."""

    limit: int
    remaining: int
    reset_s: float  # until the window has moved past what counts now


@dataclass(frozen=True, slots=True)
class Charge:
    """What ``check`` counted for a request: its tenant, the window, the tokens, where (Redis or here), the
    scopes charged (the tenant's name, and "#<key id>" for a key's own limit; empty: the tenant alone), and the
    headroom left, for the answer's headers."""

    tenant: str
    window: int
    tokens: int
    in_redis: bool
    scopes: tuple[str, ...] = ()
    requests_left: Headroom | None = None
    tokens_left: Headroom | None = None

    def headers(self) -> list[tuple[bytes, bytes]]:
        """x-ratelimit-limit-requests, -remaining-requests, -reset-requests and the -tokens trio, as OpenAI
        sends them (a reset as "1s", "6m0s"); only for the limits that apply."""
        out = []
        for kind, room in (("requests", self.requests_left), ("tokens", self.tokens_left)):
            if room is not None:
                out += [(b"x-ratelimit-limit-" + kind.encode(), str(room.limit).encode()),
                        (b"x-ratelimit-remaining-" + kind.encode(), str(max(0, room.remaining)).encode()),
                        (b"x-ratelimit-reset-" + kind.encode(), duration(room.reset_s).encode())]
        return out


def duration(seconds: float) -> str:
    """A reset as OpenAI writes it: "850ms", "1s", "6m0s"."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    return f"{whole // 60}m{whole % 60}s" if whole >= 60 else f"{whole}s"


def wait_to_fit(prev: float, cur: float, to_boundary: float, limit: int, cost: int) -> float | None:
    """Seconds from now until ``cost`` more fits under ``limit`` if nothing else is counted meanwhile; None if it
    never does (it alone is over the limit). The count seen is ``prev`` weighted by its share still inside the
    last minute (``to_boundary`` / 60, falling to 0 at the boundary) plus ``cur``; at the boundary ``cur`` becomes
    the previous window's count and falls the same way. The least such time: a moment sooner it does not fit."""
    room = limit - cost
    if room < 0:
        return None
    if prev * to_boundary / WINDOW_S + cur <= room:
        return 0.0
    if cur <= room:  # before the boundary, as the previous window's share falls
        return max(0.0, to_boundary - WINDOW_S * (room - cur) / prev)
    return to_boundary + WINDOW_S * (1 - room / cur)


def until_clear(prev: float, cur: float, to_boundary: float) -> float:
    """Seconds until nothing counted now is seen any more (the whole allowance back): OpenAI's reset."""
    return to_boundary + WINDOW_S if cur else (to_boundary if prev else 0.0)


def headroom(caps: list[tuple[int, int]], counts: list[tuple[float, float]], weight: float,
             to_boundary: float) -> tuple[Headroom | None, Headroom | None]:
    """The tightest scope's limit of each kind, from the (previous, current) counts per scope and kind."""
    found: list[Headroom | None] = []
    for kind in (0, 1):
        rooms = [Headroom(cap[kind], cap[kind] - math.ceil(prev * weight + cur), until_clear(prev, cur, to_boundary))
                 for cap, (prev, cur) in zip(caps, counts[kind::2], strict=True) if cap[kind]]
        found.append(min(rooms, key=lambda r: r.remaining) if rooms else None)
    return found[0], found[1]


def _window(now: float) -> tuple[int, float]:
    """The current window number and the previous window's weight (its share still inside the last minute)."""
    index = int(now // WINDOW_S)
    return index, 1.0 - (now - index * WINDOW_S) / WINDOW_S


class RateLimiter:
    def __init__(self, state: SharedState | None = None, processes: Callable[[], int] = lambda: 1) -> None:
        """``state``: with Redis, counts are shared there (else this process's); ``processes``: how many
        gateway processes share the limits, for the fallback while Redis is down."""
        self._memory: dict[tuple[str, str, int], int] = {}
        redis = state.redis if state is not None else None
        self._script = redis.register_script(_CHECK) if redis is not None else None
        self._refund = redis.register_script(_REFUND) if redis is not None else None
        self._tasks: set[asyncio.Task[None]] = set()
        self._prefix = state.prefix if state is not None else ""
        self._processes = processes
        self._warned = False

    async def check(self, tenant: TenantView, tokens: int, now: float | None = None) -> Charge | None:
        """Count one request of ``tokens`` (worst case) for the tenant (and its key's own limit); RateLimited
        when it would pass a limit. Returns what was charged, for ``settle`` (None: no limit applies)."""
        scopes = tenant.rate_scopes
        if not scopes:
            return None
        now = time.time() if now is None else now
        index, weight = _window(now)
        to_boundary = (index + 1) * WINDOW_S - now
        caps = [(limit.requests_per_minute or 0, limit.tokens_per_minute or 0) for _, limit in scopes]
        refused: int | None = None
        in_redis = False
        if self._script is not None:
            keys = [f"{self._prefix}rl:{name}:{kind}:{w}" for name, _ in scopes for kind in ("r", "t")
                    for w in (index, index - 1)]
            try:
                allowed, first, *raw = await self._script(keys=keys, args=[
                    1, tokens, weight, *(v for cap in caps for v in cap)])
                self._warned, in_redis = False, True
                refused = None if allowed else int(first) - 1
                counts = [(float(raw[i]), float(raw[i + 1])) for i in range(0, len(raw), 2)]
            except Exception as exc:
                if not self._warned:
                    log.error("rate-limit store unavailable (%s): counting in this process against its part", exc)
                    self._warned = True
                parts = max(1, self._processes())
                caps = [(math.ceil(r / parts) if r else 0, math.ceil(t / parts) if t else 0) for r, t in caps]
        if not in_redis:
            refused, counts = self._check_memory([name for name, _ in scopes], index, weight, tokens, caps)
        if refused is not None:
            name, limit = scopes[refused]
            waits = [wait_to_fit(prev, cur, to_boundary, cap, cost)
                     for (prev, cur), cap, cost in zip(counts, (c for pair in caps for c in pair),
                                                       (1, tokens) * len(caps), strict=True) if cap]
            raise self._refused(tenant, name, limit, tokens, waits, headroom(caps, counts, weight, to_boundary))
        requests_left, tokens_left = headroom(caps, counts, weight, to_boundary)
        return Charge(tenant.name, index, tokens, in_redis, tuple(name for name, _ in scopes), requests_left,
                      tokens_left)

    def settle(self, charge: Charge, used_tokens: int, ran: bool) -> None:
        """Once per charged request, at its end: give back the tokens it did not use, and the request itself if
        it never ran (in the window it was charged to; nothing once that window has passed)."""
        tokens_back, requests_back = max(0, charge.tokens - used_tokens), 0 if ran else 1
        if not tokens_back and not requests_back:
            return
        for scope in charge.scopes or (charge.tenant,):
            if not charge.in_redis:
                for kind, back in (("r", requests_back), ("t", tokens_back)):
                    key = (scope, kind, charge.window)
                    if back and key in self._memory:
                        self._memory[key] = max(0, self._memory[key] - back)
                continue
            assert self._refund is not None
            keys = [f"{self._prefix}rl:{scope}:{kind}:{charge.window}" for kind in ("r", "t")]
            task = asyncio.get_running_loop().create_task(self._give_back(keys, requests_back, tokens_back))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _give_back(self, keys: list[str], requests: int, tokens: int) -> None:
        assert self._refund is not None
        try:
            await self._refund(keys=keys, args=[requests, tokens])
        except Exception as exc:  # the charge stands: the limit errs on the safe side
            log.warning("rate-limit refund failed (%s)", exc)

    async def close(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _check_memory(self, names: list[str], index: int, weight: float, tokens: int,
                      caps: list[tuple[int, int]]) -> tuple[int | None, list[tuple[float, float]]]:
        """Charge every scope if each fits; else the index of the first that does not (nothing charged). With
        it, per scope and kind the previous window's count and this one's (after the charge, if made)."""
        kinds = (("r", 1), ("t", tokens))

        def counts() -> list[tuple[float, float]]:
            return [(self._memory.get((name, kind, index - 1), 0), self._memory.get((name, kind, index), 0))
                    for name in names for kind, _ in kinds]

        for i, (name, limits) in enumerate(zip(names, caps, strict=True)):
            for (kind, cost), cap in zip(kinds, limits, strict=True):
                prev, cur = self._memory.get((name, kind, index - 1), 0), self._memory.get((name, kind, index), 0)
                if cap and prev * weight + cur + cost > cap:
                    return i, counts()
        for name in names:
            for kind, cost in kinds:
                self._memory[(name, kind, index)] = self._memory.get((name, kind, index), 0) + cost
        for key in [k for k in self._memory if k[2] < index - 1]:
            del self._memory[key]
        return None, counts()

    @staticmethod
    def _refused(tenant: TenantView, scope: str, limit: RateLimit, tokens: int, waits: list[float | None],
                 rooms: tuple[Headroom | None, Headroom | None]) -> RateLimited:
        """The 429: Retry-After when this request fits (the latest of the limits it must fit), and the
        x-ratelimit-* headers as a success would carry them."""
        parts = []
        if limit.requests_per_minute:
            parts.append(f"{limit.requests_per_minute} requests")
        if limit.tokens_per_minute:
            parts.append(f"{limit.tokens_per_minute} tokens (this request counts {tokens}: prompt + max_tokens)")
        whose = f"API key '{scope[1:]}' of tenant '{tenant.name}'" if scope.startswith("#") else \
            f"tenant '{tenant.name}'"
        headers = Charge(tenant.name, 0, 0, False, (), *rooms).headers()
        if any(wait is None for wait in waits):
            return RateLimited(f"Rate limit reached for {whose}: {' and '.join(parts)} per minute. This request "
                               "alone counts more than the limit: lower max_tokens or shorten the prompt.",
                               retry_after_s=WINDOW_S, headers=headers)
        wait_s = max((w for w in waits if w is not None), default=0.0)
        return RateLimited(f"Rate limit reached for {whose}: {' and '.join(parts)} per minute. "
                           f"Retry after {max(1, math.ceil(wait_s))} s.", retry_after_s=wait_s, headers=headers)
