"""Relay a worker's answer to the sink: streams unbuffered, whole bodies at once; read the usage on the way.

Streams are forwarded as they arrive: each upstream read goes out in one write as soon as it ends on an SSE
event boundary (vLLM writes whole events, so in practice every read), and only the usage event is parsed.
A client that leaves cancels the relay; the dispatch then closes the upstream response, which drops the
connection, so vLLM aborts the request and frees its KV blocks.

An answer names the model of the policy that served it, never the name the workers know it by (a model's
``upstream_model``, or a fallback's): where the two differ (``renaming``), its ``"model"`` member is rewritten
as bytes on the way (``Rename``), with no parse and no re-serialisation. Where they agree, nothing is done.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway import sse
from gateway.context import RequestContext
from gateway.errors import UpstreamFailed, WorkerRejected
from gateway.fleet.observe import cool_down
from gateway.fleet.worker import Worker
from gateway.openai_api import LARGE_BODY
from gateway.sink import Sink
from gateway.transport.http1 import Response
from gateway.upstream.errors import COOLDOWN_STATUS, TRANSPORT_ERRORS, worker_failure

log = logging.getLogger("tollgate.upstream")

# A stream is copied for the cache up to this many times the largest entry the cache stores: its SSE framing and
# per-chunk usage are many times the text it carries, and a copy past that is never stored anyway.
CAPTURE_PER_ENTRY = 4

@dataclass(frozen=True, slots=True)
class Rename:
    """The rewrite of an answer's ``model`` member from the name the worker serves to the one the client is
    shown. The member is found with any spacing JSON allows (vLLM writes compact JSON, another server may not);
    inside a string a quote is escaped, so text that spells the member is never taken for it."""

    member: re.Pattern[bytes]
    shown: bytes

    def __call__(self, data: bytes, count: int = 0) -> bytes:
        return self.member.sub(lambda _: self.shown, data, count)


def renaming(worker_model: str, shown: str) -> Rename | None:
    """The rewrite from the worker's name to ``shown``; None when they agree."""
    if worker_model == shown:
        return None
    return Rename(re.compile(rb'"model"\s*:\s*' + re.escape(orjson.dumps(worker_model))),
                  b'"model":' + orjson.dumps(shown))


def renamed(body: bytes, rename: Rename | None) -> bytes:
    """A whole answer with its model member rewritten. A large answer (embeddings: tens of MB of vectors) has
    one member of its own: only the first is rewritten, and the search stops there."""
    if rename is None:
        return body
    return rename(body) if len(body) <= LARGE_BODY else rename(body, 1)


_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no")]


@dataclass(slots=True)
class Relayed:
    """What the relay learnt, kept by the caller so that a cut answer still says what it delivered: the worker's
    usage (the latest one, on every chunk when continuous usage is on), whether the answer ended normally, how
    many token events were relayed, when tokens arrived, and (if asked) the answer's bytes."""

    parsed_usage: dict[str, Any] | None = None
    usage_raw: bytes | None = None  # the latest chunk's usage object, parsed only when asked for (``usage``)
    answered: bool = False  # the worker's answer ended normally (a whole body, or a stream to its end)
    events: int = 0
    first_at: float | None = None
    last_at: float | None = None
    captured: bytes | None = None
    head: bytes = b""  # the start of a stream's first read (where a Responses stream names its response)

    @property
    def usage(self) -> dict[str, Any] | None:
        if self.usage_raw is not None:
            raw, self.usage_raw = self.usage_raw, None
            try:
                parsed = orjson.loads(raw)
                self.parsed_usage = parsed if isinstance(parsed, dict) else self.parsed_usage
            except orjson.JSONDecodeError:
                log.warning("unreadable usage from a worker: %r", raw[:200])
        return self.parsed_usage

    @usage.setter
    def usage(self, value: dict[str, Any] | None) -> None:
        self.parsed_usage, self.usage_raw = value, None

    @property
    def tpot(self) -> float | None:
        usage = self.usage or {}
        n = usage.get("completion_tokens") or usage.get("output_tokens") or 0
        if self.first_at is None or self.last_at is None or n < 2:
            return None
        return (self.last_at - self.first_at) / (n - 1)


async def relay_stream(ctx: RequestContext, worker: Worker, response: Response, sink: Sink,
                       relayed: Relayed, usage: tuple[bool, bool], cooldown_s: float, capture: bool = False,
                       first_token: Callable[[int, float], None] | None = None, rename: Rename | None = None) -> None:
    """Forward an SSE answer. The response head waits for the first upstream byte (it carries Server-Timing).

    ``usage`` is what the client asked for: (the final usage event, usage on every chunk). ``first_token`` hears
    the engine's TTFT and the requests on the worker when the first byte comes. ``rename``: every event's model
    member, rewritten after the tap (whole events: a member never straddles two writes). A worker that fails
    mid-stream: what it sent is flushed, the stream left open, and UpstreamFailed raised (the sink ends the
    stream with an SSE error event and [DONE])."""
    splitter = sse.EventSplitter()
    tap = ctx.endpoint.tap(relayed, *usage)
    captured: list[bytes] | None = [] if capture else None
    room = CAPTURE_PER_ENTRY * ctx.snapshot.policy.cache.max_entry_bytes  # for the cache's copy, in SSE bytes
    try:
        chunk = await response.readany()
    except TRANSPORT_ERRORS as exc:
        raise worker_failure(worker, "head", cooldown_s, exc) from None
    if ctx.endpoint.homed:  # where the stream names its response (no copy for the other endpoints)
        relayed.head = chunk[:512]
    ttft = ctx.timings.first_byte()
    if first_token is not None:  # the engine's TTFT, without the gateway's queue wait: a capacity signal
        first_token(worker.inflight, ttft - (ctx.timings.queue_wait or 0.0))
    await sink.start(200, [*ctx.response_headers(), *_SSE_HEADERS,
                           (b"server-timing", ctx.server_timing())])
    failure: Exception | None = None
    try:
        while chunk:
            if captured is not None:
                room -= len(chunk)
                captured = captured if room >= 0 else None  # past what the cache would store: no copy
                if captured is not None:
                    captured.append(chunk)
            # whole events and nothing pending (vLLM's one event a write) pass as they are: the splitter's own
            # first case, without a call a chunk
            if not splitter.pending and chunk.endswith(b"\n\n") and b"\r" not in chunk:
                out = chunk
            else:
                out = splitter.feed(chunk)
            if out:
                now = time.perf_counter()
                if relayed.first_at is None:
                    relayed.first_at = now
                relayed.last_at = now  # vLLM writes the usage event together with the last token
                out = tap(out)
                if out:
                    await sink.send(out if rename is None else rename(out), more=True)
            chunk = await response.readany()
        response.release()  # finished: the connection goes back to the pool
        relayed.answered = True
    except TRANSPORT_ERRORS as exc:
        failure = worker_failure(worker, "stream", cooldown_s, exc)
    pending = splitter.pending if rename is None else rename(splitter.pending)
    if failure is not None:
        if pending:
            await sink.send(pending, more=True)
        raise failure
    await sink.send(pending, more=False)
    if captured is not None:
        relayed.captured = b"".join(captured)


_USAGE_KEY = re.compile(rb'"usage"\s*:\s*')
_TAIL = 4096  # where a large answer's usage is looked for: vLLM writes it last


def usage_of(body: bytes) -> dict[str, Any] | None:
    """The usage of a whole JSON answer; ValueError when the answer is not a JSON object.

    A small answer is parsed whole. A large one (an embeddings answer is tens of MB) is not: parsing 2,048 vectors
    into Python floats to read one small object took the RSS up 61-64 MB per answer and kept it there (glibc holds
    the freed arenas). Its usage is read from its tail, where vLLM writes it, and the answer is only checked to
    be an object; a key ``"usage"`` cannot stand inside a JSON string (its quotes would be escaped)."""
    if len(body) <= LARGE_BODY:
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ValueError(str(exc)) from None
        if not isinstance(parsed, dict):
            raise ValueError("not a JSON object")
        usage = parsed.get("usage")
        return usage if isinstance(usage, dict) else None
    stripped = body.strip()
    if not (stripped.startswith(b"{") and stripped.endswith(b"}")):
        raise ValueError("not a JSON object")
    tail = stripped[-_TAIL:]
    key = tail.rfind(b'"usage"')
    found = _USAGE_KEY.match(tail, key) if key >= 0 else None
    if found is None:
        return None
    start, depth = found.end(), 0
    for end in range(start, len(tail)):  # the object's closing brace: usage holds numbers and small objects only
        char = tail[end]
        if char == 0x7B:  # {
            depth += 1
        elif char == 0x7D:  # }
            depth -= 1
            if depth == 0:
                try:
                    usage = orjson.loads(tail[start:end + 1])
                except orjson.JSONDecodeError:
                    return None
                return usage if isinstance(usage, dict) else None
    return None


def _worker_complaint(body: bytes) -> str:
    """The message of a worker's 4xx (vLLM says what was wrong with the request), cut short."""
    try:
        error = orjson.loads(body).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (orjson.JSONDecodeError, AttributeError):
        message = None
    text = message if isinstance(message, str) and message else "The worker rejected the request."
    return text if len(text) <= 500 else text[:500] + "..."


async def relay_body(ctx: RequestContext, worker: Worker, response: Response, sink: Sink,
                     relayed: Relayed, cooldown_s: float, rename: Rename | None = None) -> None:
    """Forward a whole answer (its model member rewritten by ``rename``; the cache's copy is the worker's). A
    worker's 4xx (a complaint about the request) becomes the gateway's own error with the worker's message; a
    5xx becomes the gateway's own 502, naming nothing internal."""
    try:
        body = await response.read()
    except TRANSPORT_ERRORS as exc:
        raise worker_failure(worker, "head", cooldown_s, exc) from None
    response.release()
    relayed.answered = True
    ctx.timings.first_byte()
    status = response.status
    if status >= 500:
        if status in COOLDOWN_STATUS:
            cool_down(worker, f"HTTP {status}", cooldown_s)
        raise UpstreamFailed("head", f"HTTP {status}")
    if status >= 400:
        raise WorkerRejected(_worker_complaint(body), status)
    if status == 200:
        try:
            relayed.usage = usage_of(body)
        except ValueError:
            log.warning("worker %s sent a non-JSON 200 body", worker.url)
            raise UpstreamFailed("head", "non-JSON 200 body") from None
        relayed.captured = body
        body = renamed(body, rename)
    await sink.start(status, [
        *ctx.response_headers(),
        (b"content-type", response.header(b"content-type") or b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"server-timing", ctx.server_timing(whole=True)),
    ])
    await sink.send(body)
