"""Where shared state lives: one Redis client per process for everything replicas share.

The cache store, the budget and rate-limit counters and the list of live gateway processes all use
``SharedState.redis`` (one connection pool, one timeout, keys under ``state.namespace``); the ledger goes to
``state.postgres_dsn`` when set. Without ``state.redis_url`` each process keeps its own (the embedded
default: one machine, nothing to start). Each feature states what it does while Redis is down (README,
"When Redis is down"); none of them crashes or waits longer than ``state.timeout_ms``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.policy.schema import StatePolicy

if TYPE_CHECKING:
    from redis.asyncio import Redis


class SharedState:
    """The one Redis client (None without ``state.redis_url``), its key prefix, and the errors that mean
    "Redis is down" to every feature's fallback."""

    def __init__(self, spec: StatePolicy) -> None:
        self.spec = spec
        self.prefix = spec.namespace + ":"  # every shared key starts with it
        self.redis: Redis | None = None
        self.errors: tuple[type[BaseException], ...] = (OSError, TimeoutError)
        if spec.redis_url:
            import redis.asyncio as redis

            timeout = spec.timeout_ms / 1000
            self.errors = (redis.RedisError, OSError, TimeoutError)
            # no retry on timeout and no health-check pings: a slow Redis is a down Redis, answered at once by
            # each feature's own fallback rather than by waiting twice
            self.redis = redis.Redis.from_url(spec.redis_url, socket_timeout=timeout,
                                              socket_connect_timeout=timeout, retry_on_timeout=False,
                                              health_check_interval=0)

    @property
    def timeout_s(self) -> float:
        return self.spec.timeout_ms / 1000

    async def close(self) -> None:
        if self.redis is not None:
            await self.redis.aclose()
