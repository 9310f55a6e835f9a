"""One finish() per request: Prometheus, the JSON log line, and (later) the cost ledger.

The event loop only puts the request's dict on a queue; a writer thread serialises and writes it,
so a slow disk or a full pipe never stalls a request. (A stdlib LogRecord per request was 5% of the
gateway's CPU.) Other logs go through the same thread via a QueueHandler. Payloads are never logged.
"""

from __future__ import annotations

import logging
import logging.handlers
import queue
import sys
import time
from datetime import UTC, datetime
from typing import IO, Any

import orjson

from gateway.context import STAGES, RequestContext
from gateway.metrics import GatewayMetrics


class JsonLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {"time": _iso(record.created), "level": record.levelname.lower(), "logger": record.name,
                "message": record.getMessage()}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line).decode()


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Writer(logging.Handler):
    """Writes what the queue carries: request dicts as JSON lines, log records formatted as JSON."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__()
        self.stream = stream
        self.setFormatter(JsonLineFormatter())

    def handle(self, record: Any) -> bool:  # type: ignore[override]
        try:
            if isinstance(record, dict):
                record["time"] = _iso(record["time"])  # formatted here, off the event loop
                text = orjson.dumps(record).decode()
            else:
                text = self.format(record)
            self.stream.write(text + "\n")
            self.stream.flush()
        except Exception:  # a broken pipe must not kill the writer thread
            pass
        return True


class _PassThroughQueueHandler(logging.handlers.QueueHandler):
    """Enqueue the record as it is: the stock prepare() formats it on the caller's thread, a second time."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record


_lines: queue.SimpleQueue[Any] | None = None


def start_logging(stream: IO[str] | None = None, level: int = logging.INFO) -> logging.handlers.QueueListener:
    """One writer thread for request lines and tollgate's logs; returns the listener to stop at exit."""
    global _lines
    _lines = queue.SimpleQueue()
    listener = logging.handlers.QueueListener(_lines, _Writer(stream or sys.stderr))
    root = logging.getLogger("tollgate")
    root.handlers[:] = [_PassThroughQueueHandler(_lines)]
    root.setLevel(level)
    root.propagate = False
    listener.start()
    return listener


def finish(ctx: RequestContext, metrics: GatewayMetrics) -> None:
    t = ctx.timings
    t.total = time.perf_counter() - t.start
    tier, model = ctx.tier, ctx.model or "none"
    queue_wait, connect, ttft, tpot, duration = metrics.stage_children(tier, model)
    for child, value in ((queue_wait, t.queue_wait), (connect, t.upstream_connect), (ttft, t.ttft),
                         (tpot, t.tpot), (duration, t.total)):
        if value is not None:
            child.observe(value)
    metrics.requests.labels(tier, model, str(ctx.status)).inc()
    if ctx.error:
        metrics.errors.labels(tier, model, ctx.error).inc()
    if ctx.prompt_tokens:
        metrics.tokens.labels(tier, model, "prompt").inc(ctx.prompt_tokens)
    if ctx.completion_tokens:
        metrics.tokens.labels(tier, model, "completion").inc(ctx.completion_tokens)
    if ctx.cache:
        metrics.cache_requests.labels(tier, ctx.cache).inc()
        if ctx.cache.startswith("hit"):
            metrics.cache_tokens_saved.labels(tier, "prompt").inc(ctx.prompt_tokens or 0)
            metrics.cache_tokens_saved.labels(tier, "completion").inc(ctx.completion_tokens or 0)
    if _lines is not None:
        _lines.put({
            "time": time.time(), "request_id": ctx.request_id, "tenant": ctx.tenant.name if ctx.tenant else None,
            "tier": tier,
            "model": ctx.model, "endpoint": ctx.endpoint, "stream": ctx.stream, "worker": ctx.worker,
            "attempts": ctx.attempts, "status": ctx.status, "error": ctx.error,
            "prompt_tokens": ctx.prompt_tokens, "completion_tokens": ctx.completion_tokens,
            "max_tokens": ctx.max_tokens_applied, "cache": ctx.cache, "policy": ctx.snapshot.digest,
            "stages_ms": {name: None if (v := getattr(t, name)) is None else round(v * 1000, 3) for name in STAGES},
        })
