"""Per-request state: built at ingress, filled in by each step, closed by accounting.finish()."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gateway.policy.loader import PolicySnapshot, TenantView


@dataclass(slots=True)
class Timings:
    """Stage durations in seconds; None where a stage did not happen.

    queue_wait: admission wait in the scheduler; cache: the cache lookup; upstream_connect: dispatch until the worker's
    response headers; ttft: request arrival until the first upstream body byte; tpot: mean gap
    between output tokens after the first; total: arrival until the last byte was sent.
    """

    start: float = field(default_factory=time.perf_counter)
    queue_wait: float | None = None
    cache: float | None = None
    upstream_connect: float | None = None
    ttft: float | None = None
    tpot: float | None = None
    total: float | None = None

    def server_timing(self) -> str:
        parts = []
        for name in ("queue_wait", "cache", "upstream_connect", "ttft", "tpot", "total"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name};dur={value * 1000:.3f}")
        return ", ".join(parts)


@dataclass(slots=True)
class RequestContext:
    request_id: str
    snapshot: PolicySnapshot
    endpoint: str
    timings: Timings = field(default_factory=Timings)
    tenant: TenantView | None = None
    model: str | None = None
    stream: bool = False
    worker: str | None = None
    attempts: int = 0
    status: int = 200
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    max_tokens_applied: str | None = None
    cache: str | None = None  # hit-exact | hit-semantic | miss | bypass

    @property
    def tier(self) -> str:
        return self.tenant.tier if self.tenant else "none"
