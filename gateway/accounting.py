"""One finish() per request: Prometheus, the JSON log line, and (later) the cost ledger.

The log line goes through a QueueHandler: the event loop only enqueues a record, and a
listener thread formats and writes it, so a slow disk or a full pipe never stalls a request.
Payloads are never logged.
"""

from __future__ import annotations

import logging
import logging.handlers
import queue
import sys
from typing import IO

import orjson

from gateway.context import RequestContext
from gateway.metrics import GatewayMetrics

request_log = logging.getLogger("tollgate.requests")


class JsonLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = getattr(record, "line", None)
        if isinstance(line, dict):
            return orjson.dumps(line).decode()
        return orjson.dumps({"level": record.levelname.lower(), "logger": record.name,
                             "message": record.getMessage()}).decode()


def start_logging(stream: IO[str] | None = None, level: int = logging.INFO) -> logging.handlers.QueueListener:
    """Route all tollgate logs through one queue to a writer thread; returns the listener to stop at exit."""
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonLineFormatter())
    listener = logging.handlers.QueueListener(records, handler, respect_handler_level=False)
    root = logging.getLogger("tollgate")
    root.handlers[:] = [logging.handlers.QueueHandler(records)]
    root.setLevel(level)
    root.propagate = False
    listener.start()
    return listener


def finish(ctx: RequestContext, metrics: GatewayMetrics) -> None:
    t = ctx.timings
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
    if request_log.isEnabledFor(logging.INFO):
        request_log.info("", extra={"line": {
            "request_id": ctx.request_id, "tenant": ctx.tenant.name if ctx.tenant else None, "tier": tier,
            "model": ctx.model, "endpoint": ctx.endpoint, "stream": ctx.stream, "worker": ctx.worker,
            "attempts": ctx.attempts, "status": ctx.status, "error": ctx.error,
            "prompt_tokens": ctx.prompt_tokens, "completion_tokens": ctx.completion_tokens,
            "max_tokens": ctx.max_tokens_applied, "policy": ctx.snapshot.digest,
            "stages_ms": {name: None if v is None else round(v * 1000, 3) for name, v in (
                ("queue_wait", t.queue_wait), ("upstream_connect", t.upstream_connect), ("ttft", t.ttft),
                ("tpot", t.tpot), ("total", t.total))},
        }})
