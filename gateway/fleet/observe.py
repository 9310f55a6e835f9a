"""The observed part of each worker (gateway.fleet.worker): health, cooldown, and load from /health and /metrics."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp

from gateway.fleet.worker import Worker

log = logging.getLogger("tollgate.workers")

# Prefix -> field. The KV metric was renamed in vLLM 0.10; accept both names.
_GAUGES = {
    b"vllm:num_requests_running": "running",
    b"vllm:num_requests_waiting{": "waiting",
    b"vllm:num_requests_waiting ": "waiting",
    b"vllm:kv_cache_usage_perc": "kv_usage",
    b"vllm:gpu_cache_usage_perc": "kv_usage",
}


def cool_down(worker: Worker, reason: str, cooldown_s: float) -> None:
    """Leave the worker out of routing after a real request failed on it; the scraper re-admits it once it is
    healthy after the cooldown."""
    observed = worker.observed
    if observed.healthy:
        log.warning("worker %s cooled down for %.1fs: %s", worker.url, cooldown_s, reason)
    observed.healthy = False
    observed.cooldown_until = time.monotonic() + cooldown_s
    observed.last_error = reason


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
        worker.observed.failed_checks += 1
        worker.observed.last_error = describe(exc)
        if worker.observed.healthy and worker.observed.failed_checks >= unhealthy_after:
            log.warning("worker %s failed %d health checks in a row: %s", worker.url, worker.observed.failed_checks,
                        worker.observed.last_error)
            worker.observed.healthy = False
        return
    worker.observed.failed_checks = 0
    worker.observed.running = load.get("running", 0.0)
    worker.observed.scraped_at = time.monotonic()
    worker.observed.waiting = load.get("waiting", 0.0)
    worker.observed.kv_usage = load.get("kv_usage", 0.0)
    if not worker.observed.healthy and time.monotonic() >= worker.observed.cooldown_until:
        log.info("worker %s admitted", worker.url)
        worker.observed.healthy = True
        worker.observed.last_error = None


async def scrape_forever(workers: list[Worker], session: aiohttp.ClientSession, request_timeout: aiohttp.ClientTimeout,
                         interval: float, unhealthy_after: int, after_round: Callable[[], None]) -> None:
    while True:
        await asyncio.gather(*(scrape(w, session, request_timeout, unhealthy_after) for w in workers))
        after_round()
        await asyncio.sleep(interval)
