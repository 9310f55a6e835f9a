"""Live state of each worker: health, cooldown, and load scraped from vLLM's /health and /metrics."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

log = logging.getLogger("tollgate.workers")

# Prefix -> field. The KV metric was renamed in vLLM 0.10; accept both names.
_GAUGES = {
    b"vllm:num_requests_running": "running",
    b"vllm:num_requests_waiting{": "waiting",
    b"vllm:num_requests_waiting ": "waiting",
    b"vllm:kv_cache_usage_perc": "kv_usage",
    b"vllm:gpu_cache_usage_perc": "kv_usage",
}


@dataclass(eq=False)
class Worker:
    url: str
    pool: str
    healthy: bool = False
    cooldown_until: float = 0.0
    inflight: int = 0
    waiting: float = 0.0
    kv_usage: float = 0.0
    last_error: str | None = None
    failed_checks: int = 0  # consecutive failed health checks
    running: float = 0.0  # vLLM's running requests (scraped)
    scraped_at: float = 0.0  # monotonic time of the last good metrics read
    learned_limit: int = 0  # the concurrency learned from the worker's metrics (scheduling.saturation)
    agreed_limit: int = 0  # the lowest any live gateway process learned (gateway.state.replicas); 0: none
    others_excess: int = 0  # what other gateway processes hold here beyond their parts (gateway.state.replicas)
    queued_reads: int = 0  # consecutive metrics reads with requests waiting in the engine
    hold_reads: int = 0  # reads left before the learned limit may probe upwards again
    limit_found: bool = False  # the engine has shown its limit (requests waiting) at least once
    recent_running: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=8))

    def available(self, now: float) -> bool:
        return self.healthy and now >= self.cooldown_until

    @property
    def load(self) -> float:
        """Gateway in-flight (fresh) + vLLM's waiting queue and KV usage (up to one scrape old)."""
        return self.inflight + self.waiting + self.kv_usage

    def fail(self, reason: str, cooldown_s: float) -> None:
        """Leave the worker out of routing; the scraper re-admits it once it is healthy after the cooldown."""
        if self.healthy:
            log.warning("worker %s cooled down for %.1fs: %s", self.url, cooldown_s, reason)
        self.healthy = False
        self.cooldown_until = time.monotonic() + cooldown_s
        self.last_error = reason


def parse_load(text: bytes) -> dict[str, float]:
    """Sum the load gauges over label sets; skips everything else without parsing it."""
    found: dict[str, float] = {}
    for line in text.split(b"\n"):
        if not line.startswith(b"vllm:") or line.startswith(b"vllm:num_requests_waiting_by"):
            continue
        for prefix, name in _GAUGES.items():
            if line.startswith(prefix):
                try:
                    found[name] = found.get(name, 0.0) + float(line.rsplit(b" ", 1)[1])
                except (IndexError, ValueError):
                    pass
                break
    return found


def describe(exc: BaseException) -> str:
    """An exception as a log reason: its class, and its message when it has one (a timeout has none)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def scrape(worker: Worker, session: aiohttp.ClientSession, request_timeout: aiohttp.ClientTimeout,
                 unhealthy_after: int = 1) -> None:
    """One health check and metrics read. A worker leaves routing after ``unhealthy_after`` consecutive
    failures, so one late answer (say, while this loop was briefly busy) does not drop a healthy worker;
    a failed real request still cools it down at once (Worker.fail)."""
    try:
        async with session.get(worker.url + "/health", timeout=request_timeout) as health:
            await health.read()
            if health.status != 200:
                raise RuntimeError(f"/health answered {health.status}")
        async with session.get(worker.url + "/metrics", timeout=request_timeout) as metrics:
            text = await metrics.read()
            load = parse_load(text) if metrics.status == 200 else {}
    except (aiohttp.ClientError, TimeoutError, RuntimeError) as exc:
        worker.failed_checks += 1
        worker.last_error = describe(exc)
        if worker.healthy and worker.failed_checks >= unhealthy_after:
            log.warning("worker %s failed %d health checks in a row: %s", worker.url, worker.failed_checks,
                        worker.last_error)
            worker.healthy = False
        return
    worker.failed_checks = 0
    worker.running = load.get("running", 0.0)
    worker.scraped_at = time.monotonic()
    worker.waiting = load.get("waiting", 0.0)
    worker.kv_usage = load.get("kv_usage", 0.0)
    if not worker.healthy and time.monotonic() >= worker.cooldown_until:
        log.info("worker %s admitted", worker.url)
        worker.healthy = True
        worker.last_error = None


async def scrape_forever(workers: list[Worker], session: aiohttp.ClientSession, request_timeout: aiohttp.ClientTimeout,
                         interval: float, unhealthy_after: int, after_round: Callable[[], None]) -> None:
    while True:
        await asyncio.gather(*(scrape(w, session, request_timeout, unhealthy_after) for w in workers))
        after_round()
        await asyncio.sleep(interval)
