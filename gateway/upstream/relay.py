"""Relay a worker's answer to the sink: streams unbuffered, whole bodies at once; read the usage on the way.

Streams are forwarded as they arrive: each upstream read goes out in one write as soon as it ends on an SSE
event boundary (vLLM writes whole events, so in practice every read), and only the usage event is parsed.
A client that leaves cancels the relay; the dispatch then closes the upstream response, which drops the
connection, so vLLM aborts the request and frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from gateway import sse
from gateway.context import RequestContext
from gateway.openai_api import LARGE_BODY, ApiError, error_body
from gateway.sink import Sink
from gateway.upstream.errors import COOLDOWN_STATUS, UpstreamError, worker_errors
from gateway.workers_state import Worker

log = logging.getLogger("tollgate.upstream")

_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no")]


@dataclass(slots=True)
class Relayed:
    """What the relay learnt: the worker's usage, when tokens arrived, and (if asked) the answer's bytes."""

    usage: dict[str, Any] | None = None
    first_at: float | None = None
    last_at: float | None = None
    captured: bytes | None = None

    @property
    def tpot(self) -> float | None:
        n = (self.usage or {}).get("completion_tokens") or 0
        if self.first_at is None or self.last_at is None or n < 2:
            return None
        return (self.last_at - self.first_at) / (n - 1)


class _UsageTap:
    """Finds the usage event among complete events; optionally drops it (the client did not ask for it)."""

    __slots__ = ("strip", "usage")

    def __init__(self, strip: bool) -> None:
        self.strip = strip
        self.usage: dict[str, Any] | None = None

    def __call__(self, events: bytes) -> bytes:
        if b'"usage":{' not in events and b'"usage": {' not in events:
            return events
        kept = []
        for event in sse.split_events(events):
            data = sse.payload(event)
            if data is not None and b'"usage"' in data:
                try:
                    obj = orjson.loads(data)
                except orjson.JSONDecodeError:
                    obj = None
                if isinstance(obj, dict) and isinstance(obj.get("usage"), dict):
                    self.usage = obj["usage"]
                    if self.strip and not obj.get("choices"):
                        continue
            kept.append(event + b"\n\n")
        return b"".join(kept)


async def relay_stream(ctx: RequestContext, worker: Worker, response: aiohttp.ClientResponse, sink: Sink,
                       strip_usage: bool, cooldown_s: float, capture: bool = False) -> Relayed:
    """Forward an SSE answer. The response head waits for the first upstream byte (it carries Server-Timing).

    A worker that fails mid-stream ends the stream with an SSE error event and [DONE], then UpstreamError."""
    splitter, tap = sse.EventSplitter(), _UsageTap(strip_usage)
    content = response.content
    relayed = Relayed()
    captured: list[bytes] | None = [] if capture else None
    with worker_errors(worker, "head", cooldown_s):
        chunk = await content.readany()
    ctx.timings.first_byte()
    await sink.start(200, [*ctx.response_headers(), *_SSE_HEADERS,
                           (b"server-timing", ctx.timings.server_timing())])
    failure: UpstreamError | None = None
    try:
        with worker_errors(worker, "stream", cooldown_s):
            while chunk:
                if captured is not None:
                    captured.append(chunk)
                out = splitter.feed(chunk)
                if out:
                    now = time.perf_counter()
                    if relayed.first_at is None:
                        relayed.first_at = now
                    relayed.last_at = now  # vLLM writes the usage event together with the last token
                    out = tap(out)
                    if out:
                        await sink.send(out, more=True)
                chunk = await content.readany()
        response.release()  # finished: the connection goes back to the pool
    except UpstreamError as exc:
        failure = exc
    tail = splitter.pending
    if failure is not None:
        tail += sse.event(error_body(failure.message, failure.type, failure.code)) + sse.DONE_EVENT
    await sink.send(tail, more=False)
    if failure is not None:
        raise failure
    relayed.usage = tap.usage
    if captured is not None:
        relayed.captured = b"".join(captured)
    return relayed


def _worker_complaint(body: bytes) -> str:
    """The message of a worker's 4xx (vLLM says what was wrong with the request), cut short."""
    try:
        error = orjson.loads(body).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (orjson.JSONDecodeError, AttributeError):
        message = None
    text = message if isinstance(message, str) and message else "The worker rejected the request."
    return text if len(text) <= 500 else text[:500] + "..."


async def relay_body(ctx: RequestContext, worker: Worker, response: aiohttp.ClientResponse, sink: Sink,
                     cooldown_s: float) -> Relayed:
    """Forward a whole answer. A worker's 4xx (a complaint about the request) becomes the gateway's own error
    with the worker's message; a 5xx becomes the gateway's own 502, naming nothing internal."""
    with worker_errors(worker, "head", cooldown_s):
        body = await response.read()
    response.release()
    ctx.timings.first_byte()
    status = response.status
    if status >= 500:
        if status in COOLDOWN_STATUS:
            worker.fail(f"HTTP {status}", cooldown_s)
        raise UpstreamError("head", f"HTTP {status}")
    if status >= 400:
        raise ApiError(status, _worker_complaint(body), "invalid_request_error", f"upstream_{status}")
    relayed = Relayed()
    if status == 200:
        try:
            parsed = await asyncio.to_thread(orjson.loads, body) if len(body) > LARGE_BODY else orjson.loads(body)
        except orjson.JSONDecodeError:
            log.warning("worker %s sent a non-JSON 200 body", worker.url)
            raise UpstreamError("head", "non-JSON 200 body") from None
        relayed.usage = parsed.get("usage") if isinstance(parsed, dict) else None
        relayed.captured = body
    await sink.start(status, [
        *ctx.response_headers(),
        (b"content-type", response.headers.get("Content-Type", "application/json").encode()),
        (b"content-length", str(len(body)).encode()),
        (b"server-timing", ctx.timings.server_timing()),
    ])
    await sink.send(body)
    return relayed
