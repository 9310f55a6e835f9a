"""The observed part of each worker (gateway.fleet.worker): health, cooldown, and load from /health and /metrics."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from gateway.fleet.worker import Worker
from gateway.transport.http1 import Client, UpstreamError

log = logging.getLogger("tollgate.workers")

# Line prefix -> field, for the engines the gateway knows: vLLM (the KV metric was renamed in 0.10; both names
# are read), SGLang and TGI. Label sets of one gauge are summed (an engine may report per model or per rank).
_GAUGES: dict[bytes, str] = {
    b"vllm:num_requests_running": "running",
    b"vllm:num_requests_waiting{": "waiting",
    b"vllm:num_requests_waiting ": "waiting",
    b"vllm:kv_cache_usage_perc": "kv_usage",
    b"vllm:gpu_cache_usage_perc": "kv_usage",
    # the engine's process, for the prefix index: the counter's creation time (prometheus_client's _created
    # sample) changes when the engine restarts, and the counter itself goes back
    b"vllm:prefix_cache_queries_created": "prefix_created",
    b"vllm:prefix_cache_queries_total": "prefix_queries",
    # the tokens the engine has generated: the count moves at the end of each step that ran, so two reads with
    # the same count saw one moment of the engine (a long prefill step) twice
    b"vllm:generation_tokens_total": "generated",
    b"sglang:num_running_reqs": "running",
    b"sglang:num_queue_reqs": "waiting",
    b"sglang:token_usage": "kv_usage",
    b"tgi_batch_current_size": "running",
    b"tgi_queue_size": "waiting",
}
_FIRST = tuple({prefix.split(b":")[0].split(b"_")[0] for prefix in _GAUGES})  # b"vllm", b"sglang", b"tgi"
MAX_METRICS_BYTES = 4 * 1024 * 1024  # vLLM's is ~100 KB; a larger page is not read (a broken exporter)
PARSE_ON_LOOP_BYTES = 256 * 1024
METRICS_BACKOFF_MAX_S = 30.0  # a /metrics that is missing, too large or unknown is retried after 1, 2, 4 ... 30 s
MAX_HEALTH_BYTES = 64 * 1024
# a slow or dropped read: read again next round (the class names describe() puts first)
_TRANSIENT = ("TimeoutError", "ReadTimeout", "ConnectFailed", "Disconnected")


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
    """Sum the load gauges over label sets; skips everything else without parsing it. Empty when the page has
    none of the known names (an engine without vLLM's, SGLang's or TGI's metrics). Every value is finite: a
    sample that is NaN or infinite is left out, and a sum that overflows is too."""
    found: dict[str, float] = {}
    for line in text.split(b"\n"):
        if not line.startswith(_FIRST) or line.startswith(b"vllm:num_requests_waiting_by"):
            continue
        for prefix, name in _GAUGES.items():
            if line.startswith(prefix):
                try:
                    value = float(line.rsplit(b" ", 1)[1])
                except (IndexError, ValueError):
                    break
                if math.isfinite(value):  # NaN and ±Inf (Prometheus allows them) say nothing of a load
                    found[name] = found.get(name, 0.0) + value
                break
    found = {name: value for name, value in found.items() if math.isfinite(value)}  # 1e308 + 1e308
    if "kv_usage" in found and found["kv_usage"] > 1.0:  # a percentage (0-100) where a share was expected
        found["kv_usage"] /= 100.0
    return found


def describe(exc: BaseException) -> str:
    """An exception as a log reason: its class, and its message when it has one (a timeout has none)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def read_page(client: Client, url: str, path: str, timeout_s: float, limit: int) -> tuple[int, bytes | None]:
    """GET ``path`` from the worker at ``url`` within ``timeout_s``: the status and the whole body (None when it is
    over ``limit`` bytes: the rest is not read, and the connection is dropped)."""
    async with asyncio.timeout(timeout_s):
        response = await client.request(b"GET", url, path)
        try:
            parts, size = [], 0
            while chunk := await response.readany():
                size += len(chunk)
                if size > limit:
                    return response.status, None
                parts.append(chunk)
            response.release()
        finally:
            response.close()  # a no-op once released; drops a connection left mid-body
    return response.status, parts[0] if len(parts) == 1 else b"".join(parts)


async def scrape(worker: Worker, client: Client, timeout_s: float, unhealthy_after: int = 1) -> None:
    """One health check, then one metrics read. Only /health decides whether a worker is in routing: it leaves
    after ``unhealthy_after`` consecutive failures (one late answer does not drop a healthy worker; a failed
    real request still cools it down at once). /metrics is a refinement: an engine that has none (404), whose
    page hangs, is too large or names nothing known is served all the same, its capacity then learned from
    the requests it answers (gateway.scheduling.capacity)."""
    observed = worker.observed
    try:
        status, _ = await read_page(client, worker.url, "/health", timeout_s, MAX_HEALTH_BYTES)
        if status != 200:
            raise RuntimeError(f"/health answered {status}")
    except (UpstreamError, TimeoutError, RuntimeError) as exc:
        observed.failed_checks += 1
        observed.last_error = describe(exc)
        if observed.healthy and observed.failed_checks >= unhealthy_after:
            log.warning("worker %s failed %d health checks in a row: %s", worker.url, observed.failed_checks,
                        observed.last_error)
            observed.healthy = False
        return
    observed.failed_checks = 0
    if not observed.healthy and time.monotonic() >= observed.cooldown_until:
        log.info("worker %s admitted", worker.url)
        observed.healthy = True
        observed.last_error = None
    now = time.monotonic()
    if now < observed.metrics_next:
        return  # a /metrics that keeps failing is read less and less often (it may be what hurts the engine)
    load = await _read_load(worker, client, timeout_s)
    if load is None:  # the last good reading stands, and ages: capacity falls back to the request stream
        observed.metrics_failures += 1
        if not (observed.metrics_error or "").startswith(_TRANSIENT):  # _read_load said why it read nothing
            observed.metrics_next = now + min(METRICS_BACKOFF_MAX_S, 0.5 * 2 ** min(observed.metrics_failures, 10))
        return
    observed.metrics_failures = 0
    observed.running = load.get("running", 0.0)
    observed.waiting = load.get("waiting", 0.0)
    observed.kv_usage = load.get("kv_usage", 0.0)
    observed.generated = load.get("generated", 0.0)
    if "prefix_queries" in load:  # the engine's process, for the prefix index (see _GAUGES)
        queries, created = load["prefix_queries"], load.get("prefix_created", 0.0)
        if queries < observed.prefix_queries or (created and observed.prefix_created
                                                 and created != observed.prefix_created):
            observed.cache_epoch += 1  # a fresh engine: whatever its prefix cache held is gone
        observed.prefix_queries, observed.prefix_created = queries, created
    observed.scraped_at = time.monotonic()


async def _read_load(worker: Worker, client: Client, timeout_s: float) -> dict[str, float] | None:
    """The load gauges, or None when /metrics gives none (missing, failing, slow, too large, or unknown)."""
    observed = worker.observed
    try:
        status, text = await read_page(client, worker.url, "/metrics", timeout_s, MAX_METRICS_BYTES)
    except (UpstreamError, TimeoutError) as exc:
        observed.metrics_error = describe(exc)
        return None
    if status != 200:
        observed.metrics_error = f"/metrics answered {status}"
        return None
    if text is None:
        observed.metrics_error = f"/metrics is over {MAX_METRICS_BYTES} bytes"
        return None
    load = parse_load(text) if len(text) <= PARSE_ON_LOOP_BYTES else await asyncio.to_thread(parse_load, text)
    if "running" not in load and "waiting" not in load:
        observed.metrics_error = "/metrics names no known load gauge"
        return None
    observed.metrics_error = None
    return load


# While a pool is idle (nothing in flight from here, and its engines ran and queued nothing at the last reading,
# so no other replica is using them either) it is read this often at most. Below the default stale_after_s
# (2 s), so the last reading is still fresh when work comes. Measured: reading two idle workers twice a second
# was 0.7% of a core, more than the rest of an idle gateway (0.55%).
IDLE_SCRAPE_S = 1.5


def idle(workers: list[Worker]) -> bool:
    return all(w.inflight == 0 and w.observed.running == 0 and w.observed.waiting == 0 for w in workers)


async def scrape_forever(workers: list[Worker], client: Client, timeout_s: float, interval: float,
                         unhealthy_after: int, after_round: Callable[[], None]) -> None:
    while True:
        await asyncio.gather(*(scrape(w, client, timeout_s, unhealthy_after) for w in workers))
        after_round()
        await asyncio.sleep(max(interval, IDLE_SCRAPE_S) if idle(workers) else interval)
