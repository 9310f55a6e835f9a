"""Keep-alive upstream pools, dispatch with one retry before the first byte, and the response relay.

Transport: aiohttp, directly. Chosen by measurement in this gateway (loadtest/RESULTS.md): as a bare
client, aiohttp costs 0.25-0.35 ms of CPU per request here, httpx on the aiohttp transport 0.5-0.7 ms
and httpx on httpcore 1.3-2.3 ms; inside the gateway, httpx's client, Request/URL models and Headers
lookups were a quarter of all CPU.

Streams are relayed as they arrive: each upstream read is forwarded in one ASGI send as soon as it
ends on an SSE event boundary (vLLM writes whole events, so in practice every read), and only the
final usage event is inspected. A client that leaves closes the upstream response at once, which
drops the connection, so vLLM aborts the request and frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping
from typing import Any

import aiohttp
import orjson

from gateway.context import RequestContext
from gateway.metrics import GatewayMetrics
from gateway.openai_api import ApiError, error_body
from gateway.policy.schema import Pool
from gateway.routing import pick
from gateway.workers_state import Worker, scrape, scrape_forever

log = logging.getLogger("tollgate.upstream")

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# Set by aiohttp's trace hook in the request's own task: when the request headers were written.
_headers_sent_at: contextvars.ContextVar[list[float]] = contextvars.ContextVar("headers_sent_at")
_RETRYABLE_STATUS = frozenset({500, 502, 503, 504})
_COOLDOWN_STATUS = frozenset({502, 503, 504})


async def _on_headers_sent(session: object, ctx: object, params: object) -> None:
    stamp = _headers_sent_at.get(None)
    if stamp is not None:
        stamp.append(time.perf_counter())


def _session(spec: Pool, traced: bool) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=spec.max_connections, keepalive_timeout=spec.keepalive_s,
                                     ttl_dns_cache=None)
    traces = []
    if traced:
        trace = aiohttp.TraceConfig()
        trace.on_request_headers_sent.append(_on_headers_sent)
        traces.append(trace)
    return aiohttp.ClientSession(connector=connector, trace_configs=traces, auto_decompress=False,
                                 skip_auto_headers=("User-Agent",))


class UpstreamPool:
    """One keep-alive session per pool, its workers, and their scraper."""

    def __init__(self, name: str, spec: Pool, metrics: GatewayMetrics) -> None:
        self.name = name
        self.spec = spec
        self.metrics = metrics
        self.workers = [Worker(str(url).rstrip("/"), name) for url in spec.workers]
        # connect: pool wait + TCP connect; sock_read: the longest silence between upstream bytes
        self.timeout = aiohttp.ClientTimeout(total=None, connect=spec.connect_timeout_s,
                                             sock_read=spec.read_timeout_s)
        self.session: aiohttp.ClientSession | None = None
        self._scrape_session: aiohttp.ClientSession | None = None
        self._scraper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Open the sessions, scrape once before serving (so /readyz is right at once), then keep scraping."""
        self.session = _session(self.spec, traced=True)
        self._scrape_session = _session(self.spec, traced=False)
        timeout = aiohttp.ClientTimeout(total=min(2.0, max(0.5, self.spec.scrape_interval_s * 2)))
        await asyncio.gather(*(scrape(w, self._scrape_session, timeout) for w in self.workers))
        self.publish()
        self._scraper = asyncio.get_running_loop().create_task(
            scrape_forever(self.workers, self._scrape_session, timeout, self.spec.scrape_interval_s, self.publish))

    def publish(self) -> None:
        for w in self.workers:
            labels = (self.name, w.url)
            self.metrics.worker_up.labels(*labels).set(1 if w.available(time.monotonic()) else 0)
            self.metrics.worker_inflight.labels(*labels).set(w.inflight)
            self.metrics.worker_waiting.labels(*labels).set(w.waiting)
            self.metrics.worker_kv.labels(*labels).set(w.kv_usage)

    @property
    def inflight(self) -> int:
        return sum(w.inflight for w in self.workers)

    def ready(self) -> bool:
        now = time.monotonic()
        return any(w.available(now) for w in self.workers)

    async def close(self) -> None:
        if self._scraper:
            self._scraper.cancel()
        for session in (self.session, self._scrape_session):
            if session is not None:
                await session.close()


class Upstreams:
    """Pools by name, kept in step with the policy. A replaced pool drains before it closes."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics
        self.pools: dict[str, UpstreamPool] = {}
        self._retiring: set[asyncio.Task[None]] = set()

    async def reconcile(self, specs: dict[str, Pool]) -> None:
        started = []
        for name, spec in specs.items():
            current = self.pools.get(name)
            if current is not None and current.spec == spec:
                continue
            pool = UpstreamPool(name, spec, self.metrics)
            started.append(pool.start())
            self.pools[name] = pool
            if current is not None:
                self._retire(current)
        for name in set(self.pools) - set(specs):
            self._retire(self.pools.pop(name))
        await asyncio.gather(*started)

    def _retire(self, pool: UpstreamPool) -> None:
        async def drain() -> None:
            while pool.inflight:
                await asyncio.sleep(0.5)
            await pool.close()
        task = asyncio.get_running_loop().create_task(drain())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def close(self) -> None:
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*(p.close() for p in self.pools.values()), return_exceptions=True)


async def dispatch(ctx: RequestContext, pool: UpstreamPool, path: str,
                   payload: bytes) -> tuple[Worker, aiohttp.ClientResponse]:
    """Send to the least-loaded worker; a connect error or a 5xx status is retried once elsewhere."""
    assert pool.session is not None
    exclude: set[Worker] = set()
    failure = "no healthy worker"
    headers = {"content-type": "application/json", "x-request-id": ctx.request_id}
    for attempt in range(2):
        worker = pick(pool.workers, exclude)
        if worker is None:
            break
        if attempt:
            pool.metrics.retries.labels(pool.name).inc()
        ctx.attempts += 1
        ctx.worker = worker.url
        stamp: list[float] = []
        token = _headers_sent_at.set(stamp)
        sent_at = time.perf_counter()
        worker.inflight += 1
        try:
            response = await pool.session.post(worker.url + path, data=payload, headers=headers,
                                               timeout=pool.timeout)
        except (aiohttp.ClientError, TimeoutError) as exc:
            worker.inflight -= 1
            failure = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            worker.fail(failure, pool.spec.cooldown_s)
            exclude.add(worker)
            continue
        finally:
            _headers_sent_at.reset(token)
        ctx.timings.upstream_connect = (stamp[0] if stamp else time.perf_counter()) - sent_at
        status = response.status
        if status in _RETRYABLE_STATUS and attempt == 0 and pick(pool.workers, exclude | {worker}):
            response.close()
            worker.inflight -= 1
            failure = f"HTTP {status}"
            if status in _COOLDOWN_STATUS:
                worker.fail(failure, pool.spec.cooldown_s)
            exclude.add(worker)
            continue
        return worker, response
    raise ApiError(502 if ctx.attempts else 503,
                   f"No worker could take the request for model '{ctx.model}' ({failure}).",
                   "server_error", "upstream_unavailable")


async def until_disconnect(work: Coroutine[Any, Any, None], receive: Receive) -> bool:
    """Run ``work`` in this task; cancel it if the client disconnects first. Returns True if the client left.

    One watcher task per request and no asyncio.wait: the work itself stays in the request's task.
    """
    current = asyncio.current_task()
    assert current is not None
    left = False

    async def watch() -> None:
        nonlocal left
        await _disconnected(receive)
        left = True
        current.cancel()
    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        await work
    except asyncio.CancelledError:
        if not left:
            raise
        current.uncancel()
    finally:
        watcher.cancel()
    return left


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class SSEScanner:
    """Finds event boundaries and the usage event in a byte stream without re-framing it."""

    __slots__ = ("first_at", "last_at", "pending", "strip_usage", "usage")

    def __init__(self, strip_usage: bool) -> None:
        self.strip_usage = strip_usage
        self.pending = b""
        self.usage: dict[str, Any] | None = None
        self.first_at: float | None = None
        self.last_at: float | None = None

    def feed(self, chunk: bytes) -> bytes:
        """Return the complete events in ``chunk`` (plus what was pending), minus a stripped usage event."""
        if self.pending:
            chunk = self.pending + chunk
            self.pending = b""
        end = chunk.rfind(b"\n\n")
        if end < 0:
            self.pending = chunk
            return b""
        if end + 2 < len(chunk):
            self.pending = chunk[end + 2:]
            chunk = chunk[:end + 2]
        now = time.perf_counter()
        if self.first_at is None:
            self.first_at = now
        self.last_at = now  # vLLM writes the usage event together with the last token
        if b'"usage":{' in chunk or b'"usage": {' in chunk:
            return self._take_usage(chunk)
        return chunk

    def _take_usage(self, chunk: bytes) -> bytes:
        kept = []
        for event in chunk.split(b"\n\n")[:-1]:
            data = event[6:] if event.startswith(b"data: ") else b""
            if b'"usage"' in data:
                try:
                    obj = orjson.loads(data)
                except orjson.JSONDecodeError:
                    obj = None
                if isinstance(obj, dict) and isinstance(obj.get("usage"), dict):
                    self.usage = obj["usage"]
                    if self.strip_usage and not obj.get("choices"):
                        continue
            kept.append(event + b"\n\n")
        return b"".join(kept)


def _sse_error(message: str) -> bytes:
    return b"data: " + error_body(message, "server_error", "upstream_stream_broken") + b"\n\ndata: [DONE]\n\n"


async def relay_stream(ctx: RequestContext, worker: Worker, response: aiohttp.ClientResponse, send: Send,
                       headers: list[tuple[bytes, bytes]], strip_usage: bool, cooldown_s: float,
                       capture: list[bytes] | None = None) -> None:
    """Forward an SSE response; the response head waits for the first upstream byte (its Server-Timing).

    With ``capture``, every upstream read is also kept (for the cache to store the answer after [DONE])."""
    scanner = SSEScanner(strip_usage)
    content = response.content
    broken: str | None = None
    complete = False
    try:
        try:
            first = await content.readany()
        except (aiohttp.ClientError, TimeoutError) as exc:
            worker.fail(str(exc) or type(exc).__name__, cooldown_s)
            raise ApiError(502, f"The worker failed before its first byte ({type(exc).__name__}).",
                           "server_error", "upstream_stream_broken") from None
        ctx.timings.ttft = time.perf_counter() - ctx.timings.start
        await send({"type": "http.response.start", "status": 200, "headers": [
            *headers, (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"), (b"server-timing", ctx.timings.server_timing().encode()),
        ]})
        if capture is not None:
            capture.append(first)
        out = scanner.feed(first)
        if out:
            await send({"type": "http.response.body", "body": out, "more_body": True})
        try:
            while chunk := await content.readany():
                if capture is not None:
                    capture.append(chunk)
                out = scanner.feed(chunk)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
            complete = True
        except (aiohttp.ClientError, TimeoutError) as exc:
            broken = f"The worker failed mid-stream ({type(exc).__name__}); the answer is incomplete."
            worker.fail(str(exc) or type(exc).__name__, cooldown_s)
    finally:
        # release() hands a finished connection back to the pool; close() drops an unfinished one, which is
        # how the worker learns that the client left (vLLM aborts the request and frees its KV blocks).
        response.release() if complete else response.close()
    tail = scanner.pending
    if broken:
        ctx.status, ctx.error = 502, "upstream_stream_broken"
        tail += _sse_error(broken)
    await send({"type": "http.response.body", "body": tail, "more_body": False})
    _account_usage(ctx, scanner.usage, scanner.first_at, scanner.last_at)


async def relay_body(ctx: RequestContext, worker: Worker, response: aiohttp.ClientResponse, send: Send,
                     headers: list[tuple[bytes, bytes]], cooldown_s: float,
                     capture: list[bytes] | None = None) -> None:
    """Forward a whole (non-streamed) response, reading its usage for accounting."""
    try:
        body = await response.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        response.close()
        worker.fail(str(exc) or type(exc).__name__, cooldown_s)
        raise ApiError(502, f"The worker failed before answering ({type(exc).__name__}).", "server_error",
                       "upstream_broken") from None
    response.release()
    ctx.timings.ttft = time.perf_counter() - ctx.timings.start
    ctx.status = response.status
    if capture is not None and response.status == 200:
        capture.append(body)
    if response.status == 200:
        try:
            parsed = await asyncio.to_thread(orjson.loads, body) if len(body) > 262_144 else orjson.loads(body)
            _account_usage(ctx, parsed.get("usage") if isinstance(parsed, dict) else None, None, None)
        except orjson.JSONDecodeError:
            log.warning("worker %s sent a non-JSON 200 body", worker.url)
    else:
        ctx.error = f"upstream_{response.status}"
    await send({"type": "http.response.start", "status": response.status, "headers": [
        *headers,
        (b"content-type", response.headers.get("Content-Type", "application/json").encode()),
        (b"content-length", str(len(body)).encode()),
        (b"server-timing", ctx.timings.server_timing().encode()),
    ]})
    await send({"type": "http.response.body", "body": body})


def _account_usage(ctx: RequestContext, usage: dict[str, Any] | None, first_at: float | None,
                   last_at: float | None) -> None:
    if not usage:
        return
    ctx.prompt_tokens = usage.get("prompt_tokens")
    ctx.completion_tokens = usage.get("completion_tokens")
    n = ctx.completion_tokens or 0
    if first_at is not None and last_at is not None and n > 1:
        ctx.timings.tpot = (last_at - first_at) / (n - 1)
