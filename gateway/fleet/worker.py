"""The gateway's view of one worker, in parts that each have one writer.

- ``observed``: what its /health and /metrics said, and whether it is in routing; written by
  ``gateway.fleet.observe`` (the scraper, and ``cool_down`` when a real request fails on it).
- ``inflight``: the requests this process has on it now; written by ``gateway.upstream.dispatch.Dispatch``.
- ``learned``: how many requests it runs, learned from what it shows; written by
  ``gateway.scheduling.capacity.learn``.
- ``agreed``: what the gateway processes of every replica agreed about it; written by
  ``gateway.state.replicas.Replicas.agree``.

``tests/inprocess/test_structure.py`` holds each part to its writer.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field


@dataclass(slots=True)
class Observed:
    healthy: bool = False
    cooldown_until: float = 0.0  # monotonic time before which a failed worker stays out of routing
    last_error: str | None = None
    failed_checks: int = 0  # consecutive failed health checks
    running: float = 0.0  # the engine's running requests
    waiting: float = 0.0  # the engine's own queue
    kv_usage: float = 0.0  # 0..1
    generated: float = 0.0  # the tokens the engine has generated (its counter; 0: not said)
    prefix_queries: float = 0.0  # vLLM's prefix_cache_queries counter at the last read
    prefix_created: float = 0.0  # and its creation time (0: not said)
    cache_epoch: int = 0  # restarts seen: the counter went back or was created anew (its prefix cache empty)
    scraped_at: float = 0.0  # monotonic time of the last good metrics read
    metrics_error: str | None = None  # why the last metrics read gave nothing (None: it gave a reading)
    metrics_failures: int = 0  # metrics reads in a row that gave nothing
    metrics_next: float = 0.0  # monotonic time before which /metrics is not read again (it keeps failing)


@dataclass(slots=True)
class Learned:
    limit: int = 0  # the concurrency learned so far; 0 before the first read
    queued_reads: int = 0  # consecutive metrics reads with requests waiting in the engine
    generated_read: float = 0.0  # the engine's generated tokens at the last read learned from
    hold_reads: int = 0  # reads left before the limit may probe upwards again
    limit_found: bool = False  # the engine has shown its limit (requests waiting) at least once
    recent_running: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=8))
    # learned from the requests it answers, for when its metrics say nothing (missing, slow, broken)
    stream_limit: float = 0.0  # additive increase, multiplicative decrease; 0 before the first answer
    slow_start: bool = True  # doubling until the first sign of congestion
    ttft_floor: float = 0.0  # the engine's TTFT when it is not congested (the least seen, slowly forgotten)
    per_token_floor: float = 0.0  # the same for a whole (non-streamed) answer, per output token
    demonstrated: float = 0.0  # the most requests it held while answering uncongested (slowly forgotten)
    recent_slow: collections.deque[bool] = field(default_factory=lambda: collections.deque(maxlen=8))


@dataclass(slots=True)
class Agreed:
    limit: int = 0  # the lowest limit any live gateway process learned; 0: none agreed (alone, or Redis down)
    excess: int = 0  # what other gateway processes hold here beyond their parts


@dataclass(eq=False)
class Worker:
    url: str
    pool: str
    observed: Observed = field(default_factory=Observed)
    inflight: int = 0
    learned: Learned = field(default_factory=Learned)
    agreed: Agreed = field(default_factory=Agreed)

    def available(self, now: float) -> bool:
        return self.observed.healthy and now >= self.observed.cooldown_until

    @property
    def load(self) -> float:
        """Gateway in-flight (fresh) + the engine's waiting queue and KV usage (up to one scrape old)."""
        return self.inflight + self.observed.waiting + self.observed.kv_usage
