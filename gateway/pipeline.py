"""The pipeline, for every endpoint: prepare -> decide -> spend -> admit -> exchange, as plain async steps, no ASGI.

Every request, from the HTTP edge or a batch line, lives inside one ``Lifecycle``: the edge authenticates and
reads the body inside it, a batch runner enters it with a line's body, and both call ``run`` with their sink.
Each step reads the request context and adds to it; none calls back up. A step that will not go on raises a
``gateway.errors`` outcome; the lifecycle ends it in ``fail`` (which records ``ctx.error`` and lets the sink
answer it) and closes every request the same way, in the runtime's ``finish`` (``accounting.Finish``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Coroutine
from types import TracebackType
from typing import Any
from urllib.parse import quote

from gateway import openai_api
from gateway.cache import replay
from gateway.cache.decision import CacheDecision, decide, settle
from gateway.cache.service import Lookup
from gateway.context import Headers, RequestContext
from gateway.endpoints.responses import Home
from gateway.errors import AnswerTooLarge, ClientGone, GatewayError, NotFound, Shed, Unavailable, UpstreamFailed
from gateway.fleet.worker import Worker
from gateway.policy.schema import TIERS, ModelRoute, Tier
from gateway.routing.affinity import Affinity
from gateway.runtime import Gateway
from gateway.scheduling.controller import Controller
from gateway.scheduling.queues import PoolState
from gateway.sink import Sink
from gateway.transport.http1 import Response
from gateway.upstream.dispatch import Dispatch
from gateway.upstream.errors import TRANSPORT_ERRORS, worker_failure
from gateway.upstream.pools import UpstreamPool
from gateway.upstream.relay import Relayed, Rename, relay_body, relay_stream, renaming

log = logging.getLogger("tollgate.pipeline")


def lower_class(tier: Tier, asked: str | None) -> Tier:
    """The class a request runs in: its tenant's tier, or a lower one it asked for (unknown names are ignored)."""
    if asked in TIERS and TIERS.index(asked) > TIERS.index(tier):
        return asked
    return tier


class Lifecycle:
    """``async with Lifecycle(gw, ctx, sink):`` the one way a request ends, whoever started it.

    An outcome raised inside is answered through the sink (``fail``); anything else is logged and answered as
    an internal error; a cancellation (a batch stopped, the server shutting down) passes through. On every
    exit the request's status is what the client got (499 if it left, or got nothing) and the request is
    closed once, by ``gw.finish``. (A class, not @asynccontextmanager: it runs once per request.)"""

    __slots__ = ("ctx", "gw", "sink")

    def __init__(self, gw: Gateway, ctx: RequestContext, sink: Sink) -> None:
        self.gw, self.ctx, self.sink = gw, ctx, sink

    async def __aenter__(self) -> RequestContext:
        return self.ctx

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool:
        ctx, sink, gw = self.ctx, self.sink, self.gw
        try:
            if isinstance(exc, GatewayError):
                await fail(ctx, sink, exc)
            elif isinstance(exc, Exception):
                log.error("unhandled error in request %s", ctx.request_id, exc_info=exc)
                await fail(ctx, sink, GatewayError("Internal error in the gateway."))
        finally:
            status = sink.status
            ctx.status = 499 if ctx.error == ClientGone.code or status is None else status
            gw.finish(ctx)
        return isinstance(exc, Exception)


async def run(gw: Gateway, ctx: RequestContext, raw: bytes, sink: Sink, cache_control: bytes = b"",
              service_class: str | None = None, session: str | None = None, tags: bytes | None = None) -> None:
    """Answer one authenticated request (``ctx.tenant`` set) whose body is ``raw``; raise an outcome where it
    ends early. Run it inside a ``Lifecycle``.

    ``service_class`` is a class the caller asks for (the X-Tollgate-Class header, or "batch" for a batch
    line); a request may run in a lower class than its tenant's tier, never a higher one. ``session`` names a
    conversation (the X-Session-Id header) whose requests should go to one worker; ``tags`` is the
    X-Tollgate-Tags header (cost centres, gateway.tags)."""
    assert ctx.tenant is not None
    ctx.service_class = lower_class(ctx.tenant.tier, service_class)
    call = await openai_api.prepare(ctx, raw, tags)
    previous = gw.responses.of_previous(call.body, ctx.tenant.name) if ctx.endpoint.homed else None
    pinned = None
    if previous is not None:  # the worker holds the conversation, and puts it before this prompt
        pinned, call.carried = previous.worker, previous.tokens
    ctx.charge = await gw.ratelimit.check(ctx.tenant, call.worst_tokens)  # requests and tokens per minute
    decision = await decide(gw.cache, ctx, call.body, cache_control, gw.metrics)
    if decision is not None and decision.hit:
        assert decision.lookup is not None
        await serve_hit(ctx, decision.lookup, sink, call.wants_usage)
        return
    ctx.service_class = await gw.spend.admit(ctx, call)  # may clamp, downgrade or refuse; reserves the worst case
    relayed = Relayed()
    if decision is None or decision.semantic is None:
        await fresh(gw, ctx, call, sink, relayed, decision, session, pinned)
    else:
        semantic = decision.semantic
        if ctx.service_class == "batch":  # nobody waits on a batch line's first token: a hit saves the engine
            await asyncio.wait({semantic})
        gate = Gate(sink, semantic, decision.semantic_due)
        found = await race(fresh(gw, ctx, call, gate, relayed, decision, session, pinned), semantic, gate)
        settle(ctx, decision, found, gw.metrics)
        if found is not None and found.hit:
            await serve_hit(ctx, found, sink, call.wants_usage)
            assert gw.cache is not None and decision.key is not None
            gw.cache.served(decision.key, found, call.body, ctx.snapshot.policy.cache)
            return
    ctx.timings.tpot = relayed.tpot
    _remember(gw, ctx, decision, relayed)


async def fresh(gw: Gateway, ctx: RequestContext, call: openai_api.Call, sink: Sink, relayed: Relayed,
                decision: CacheDecision | None, session: str | None, pinned: str | None) -> None:
    """The answer from a worker: admitted by the scheduler, exchanged, counted, its slot given back."""
    assert ctx.tenant is not None
    pool, admission = await admit(gw, ctx, call)
    shown = ctx.served_model or ""
    worker_model = call.route.upstream_model or shown  # the name the body goes to the worker with (serialise)
    ended = None
    try:  # from here on the scheduler's slot is this request's: every exit gives it back
        payload = await openai_api.serialise(call, ctx.service_class)
        affinity = pool.router.affinity(call.body, session)
        await exchange(ctx, pool, payload, sink, relayed, (call.wants_usage, call.wants_continuous_usage),
                       gw.scheduler, admission, affinity, capture=decision is not None and decision.keep_answer,
                       pinned=pinned, rename=renaming(worker_model, shown))
    except BaseException as exc:
        ended = exc
        raise
    finally:  # also when the client left or the worker failed: what was delivered is counted
        count_tokens(ctx, relayed, call.prompt_estimate, sink.status, call.max_output * call.sequences,
                     oversized=isinstance(ended, AnswerTooLarge))
        gw.scheduler.release(ctx, admission, ended)
        if ctx.endpoint.homed and ctx.worker is not None and sink.status is not None:  # where a follow-up must go
            start = relayed.head if ctx.stream else (relayed.captured or b"")[:512]
            gw.responses.remember(start, Home(ctx.tenant.name, pool.name, ctx.worker, conversation(ctx, call),
                                              shown, worker_model))


GRACE_S = 0.010  # what a fresh answer's head may wait for a semantic lookup about to end (the bound: 15 ms)
_SLACK_S = 0.002  # past the lookup's expected end


class CalledOff(Exception):
    """The fresh answer is not wanted: a semantic hit came before its first byte went out."""


def _hit(semantic: asyncio.Task[Lookup]) -> Lookup | None:
    return semantic.result() if semantic.done() and not semantic.cancelled() and semantic.result().hit else None


class Gate:
    """The sink a fresh answer writes through while a semantic lookup races it: the answer's head waits for a
    lookup due to end within ``GRACE_S`` (never for one that cannot hit, nor one due later: on a saturated host the
    embedder is slow, and waiting would only add to TTFT), and a hit by then calls the answer off before a byte of
    it goes out. (A worker's first token can come in a few milliseconds; the embedder takes ~20 ms here.)"""

    def __init__(self, sink: Sink, semantic: asyncio.Task[Lookup], due: float | None) -> None:
        self.sink, self.semantic, self.due = sink, semantic, due

    @property
    def status(self) -> int | None:
        return self.sink.status

    async def start(self, status: int, headers: Headers) -> None:
        if status == 200 and not self.semantic.done() and self.due is not None:
            left = self.due - time.perf_counter()
            if left <= GRACE_S:
                await asyncio.wait({self.semantic}, timeout=min(GRACE_S, max(0.0, left) + _SLACK_S))
        if status == 200 and _hit(self.semantic) is not None:
            raise CalledOff
        await self.sink.start(status, headers)

    async def send(self, body: bytes, more: bool = False) -> None:
        await self.sink.send(body, more)

    async def fail(self, error: GatewayError, headers: Headers) -> None:
        await self.sink.fail(error, headers)


async def race(answer: Coroutine[Any, Any, None], semantic: asyncio.Task[Lookup], sink: Sink) -> Lookup | None:
    """Run the fresh answer beside the semantic lookup. The lookup's result if it ended in time: a hit before the
    answer's first byte calls the answer off (the worker sees the request cancelled), a miss lets it go on.
    None if the answer came first. The answer is never held back but by the ``Gate``'s grace.

    The answer runs in the request's own task, as the edge's disconnect watch expects: a hit cancels that task
    and this takes the cancel back, so everything the answer held is released by its own ``finally`` blocks."""
    if _hit(semantic) is not None:
        answer.close()
        return semantic.result()
    current = asyncio.current_task()
    assert current is not None
    called_off = running = False

    def on_lookup(done: asyncio.Task[Lookup]) -> None:
        nonlocal called_off
        if running and _hit(done) is not None and sink.status is None:
            called_off = True
            current.cancel()
    semantic.add_done_callback(on_lookup)
    running = True
    try:
        await answer
    except CalledOff:
        return semantic.result()
    except asyncio.CancelledError:
        if not called_off:
            raise
        current.uncancel()
        return semantic.result()
    finally:
        running = False
        semantic.remove_done_callback(on_lookup)
    if semantic.done() and not semantic.cancelled() and not semantic.result().hit:
        return semantic.result()  # a miss (or a bypass), with its reason
    return None


async def retrieve(gw: Gateway, ctx: RequestContext, rid: str, sink: Sink) -> None:
    """GET /v1/responses/{id}: a stored answer, read from the worker that made it (vLLM keeps it in that server's
    memory), and only by the tenant that made it. Run inside a ``Lifecycle`` like any request: it counts against
    the tenant's requests per minute and in flight, holds the worker under a lease, cools a failing worker down,
    and leaves a ledger record, of no tokens (it generates none; the stored usage is the original's)."""
    assert ctx.tenant is not None
    ctx.prompt_tokens = ctx.completion_tokens = 0
    home = gw.responses.find(rid, ctx.tenant.name)
    if home is None:
        raise NotFound("No such response for this tenant.", "response_not_found")
    pool = gw.upstreams.pools.get(home.pool)
    if pool is None:
        raise Unavailable("The worker holding this response is not available now.", "previous_response_unavailable")
    ctx.charge = await gw.ratelimit.check(ctx.tenant, 0)
    with gw.scheduler.tenant_held(ctx):
        async with Dispatch(ctx, pool, f"/v1/responses/{quote(rid, safe='')}", b"", pinned=home.worker,
                            method=b"GET", client=pool.reads) as (worker, response):
            if response.status == 404:
                raise NotFound("The worker that made this response no longer holds it (it restarted).",
                               "response_not_found")
            if 200 <= response.status < 300 and encoded(response):
                raise UpstreamFailed("head", "a compressed stored response")
            rename = renaming(home.worker_model, home.model) if home.model else None
            await relay_body(ctx, worker, response, sink, Relayed(), pool.spec.cooldown_s, rename)


async def admit(gw: Gateway, ctx: RequestContext, call: openai_api.Call) -> tuple[UpstreamPool, PoolState]:
    """Admit the request to its model's pool; when that pool has no healthy worker or sheds the request, to the
    first of the model's fallbacks that the tenant may use and whose context window fits the request (batch
    lines only where the route allows it). A fallback is priced and reserved as itself, and the answer names it
    (``ctx.answered_by``: the X-Tollgate-Model header, the answer's ``model``, the ledger, the log). Returns the
    pool with the scheduler's handle on the request's slot in it, for ``release``."""
    route, tried = call.route, {ctx.model}
    while True:
        pool = gw.upstreams.pools.get(route.pool)
        try:
            if pool is None:
                raise Unavailable(f"No worker pool serves the model '{ctx.served_model}' right now.",
                                  "upstream_unavailable")
            return pool, await gw.scheduler.admit(ctx, pool.name, call.cost, call.size)
        except (Unavailable, Shed):
            fallback = _fallback(ctx, call, tried)
            if fallback is None:
                raise
        name, route = fallback
        tried.add(name)
        ctx.answered_by = name
        openai_api.retarget(call, name, route)
        await gw.spend.switch(ctx, call)


def _fallback(ctx: RequestContext, call: openai_api.Call, tried: set[str | None]) -> tuple[str, ModelRoute] | None:
    """The next fallback of the requested model this request may use, or None (a follow-up of a previous response
    has none: that response lives on one worker of its own model)."""
    models = ctx.snapshot.policy.models
    asked = models.get(ctx.model or "")
    if asked is None or (ctx.batch is not None and not asked.fallbacks_for_batch) or \
            call.body.get("previous_response_id"):
        return None
    needs = call.prompt_estimate + call.max_output * call.sequences
    for name in asked.fallbacks:
        route = models.get(name)
        if route is None or name in tried or not ctx.tenant or not ctx.tenant.may_use(name):
            continue
        if route.context_window is not None and needs > route.context_window:
            continue
        return name, route
    return None


async def exchange(ctx: RequestContext, pool: UpstreamPool, payload: bytes, sink: Sink, relayed: Relayed,
                   usage: tuple[bool, bool], scheduler: Controller, admission: PoolState,
                   affinity: Affinity | None = None, capture: bool = False, pinned: str | None = None,
                   rename: Rename | None = None) -> None:
    """Dispatch to a worker (``pinned``: only that one) and relay its answer to the sink; ``relayed`` learns what
    went by. ``admission``: what ``scheduler.admit`` returned for the request; ``rename``: the answer's model
    member as the worker writes it and as the client is shown it, where they differ."""
    room = scheduler.with_room(admission, ctx.snapshot.policy.scheduling)
    async with Dispatch(ctx, pool, ctx.endpoint.path, payload, affinity, pinned, room) as (worker, response):
        if 200 <= response.status < 300 and encoded(response):
            await _unreadable(ctx, worker, response, relayed, pool.spec.cooldown_s)
        if ctx.stream and response.status == 200:
            first = functools.partial(scheduler.first_token, ctx, admission, worker,
                                      ctx.snapshot.policy.scheduling)
            await relay_stream(ctx, worker, response, sink, relayed, usage, pool.spec.cooldown_s, capture, first,
                               rename)
        else:
            await relay_body(ctx, worker, response, sink, relayed, pool.spec.cooldown_s, rename)


def encoded(response: Response) -> bool:
    """The worker compressed its answer (workers are asked for ``accept-encoding: identity``): neither its usage
    nor its events can be read, so it is not relayed as if they could."""
    coding = response.header(b"content-encoding")
    return coding is not None and coding.strip().lower() not in (b"", b"identity")


async def _unreadable(ctx: RequestContext, worker: Worker, response: Response, relayed: Relayed,
                      cooldown_s: float) -> None:
    """Refuse a compressed answer with a 502. A whole body is read first (it is the work done, and its size is
    the completion's estimate, see count_tokens); a stream is dropped at once, so the engine stops."""
    if not ctx.stream:
        try:
            relayed.captured = await response.read()
        except TRANSPORT_ERRORS as exc:
            raise worker_failure(worker, "head", cooldown_s, exc) from None
        response.release()
        relayed.answered = True
    raise UpstreamFailed("head", f"content-encoding {response.header(b'content-encoding')!r}")


def conversation(ctx: RequestContext, call: openai_api.Call) -> int:
    """The tokens a follow-up of this response carries: what the worker counted (its input holds the stored
    conversation) and generated; without a count of the worker's, the most it can be."""
    if ctx.usage_estimated or ctx.prompt_tokens is None:
        return call.worst_tokens
    return ctx.prompt_tokens + (ctx.completion_tokens or 0)


MAX_TOKENS_CLAIMED = 1 << 40  # a worker's count past this is not a real one (and could overflow the ledger's columns)


def _count(value: object) -> int | None:
    """A token count from a worker's usage, or None when it is not one (the worker is not trusted)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_TOKENS_CLAIMED:
        return value
    return None


def count_tokens(ctx: RequestContext, relayed: Relayed, prompt_estimate: int, delivered: int | None,
                 most_out: int, oversized: bool = False) -> None:
    """The tokens a request used, from the worker's usage: its final one, or for a cut stream the latest per-chunk
    usage. Without readable usage from a worker that took the request (a non-streamed answer the client left
    before, a worker that died, one without continuous usage, a 2xx without usage, a compressed answer), the
    prompt is estimated from the body's size and the completion from the token events relayed, or, for a whole
    body, from its size (4 bytes a token: its JSON counts too, so this errs high), and the record says it is an
    estimate: work a worker did is never billed as nothing. ``delivered``: the status the client got so far.

    ``most_out`` is what the request let the engine generate (max_tokens for every sequence; 0 for embeddings):
    a completion counted or estimated past it is not one the engine made, so it is billed at that bound and the
    record says so (the reservation held exactly that much). The prompt has no such bound: an image in a message
    is a URL in the body and hundreds of tokens in the engine.

    An answer dropped for its size (``oversized``) is billed at that bound, estimated: the engine generated at
    least what the gateway could not hold, and nothing it reported can be read."""
    if oversized:  # the prompt as the worker counted it, when a chunk said so
        counted = _count((relayed.usage or {}).get("prompt_tokens"))
        ctx.prompt_tokens = counted if counted is not None else prompt_estimate
        ctx.completion_tokens, ctx.usage_estimated = most_out, True
        return
    usage = relayed.usage or {}
    # an embeddings answer has no completion_tokens; the Responses API says input_ and output_tokens
    prompt = _count(usage.get("prompt_tokens", usage.get("input_tokens")))
    completion = _count(usage.get("completion_tokens", usage.get("output_tokens")) or 0)
    if prompt is not None and completion is not None:
        ctx.prompt_tokens, ctx.completion_tokens = prompt, min(completion, most_out)
        ctx.usage_estimated = completion > most_out
        details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
        ctx.cached_tokens = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    elif ctx.timings.upstream_connect is not None and (
            relayed.events or not relayed.answered or relayed.captured is not None or
            (delivered is not None and 200 <= delivered < 300)):
        body = 0 if ctx.stream else len(relayed.captured or b"") // 4
        ctx.prompt_tokens, ctx.completion_tokens = prompt_estimate, min(max(relayed.events, body), most_out)
        ctx.usage_estimated = True


async def serve_hit(ctx: RequestContext, found: Lookup, sink: Sink, wants_usage: bool) -> None:
    """Answer from the cache, in the shape a fresh answer would have."""
    entry, layer = found.entry, found.result
    assert entry is not None and ctx.model is not None
    ctx.prompt_tokens, ctx.completion_tokens = entry.prompt_tokens, entry.completion_tokens
    if ctx.stream:
        body = replay.sse_body(ctx.endpoint, entry, ctx.model, layer, wants_usage)
        content_type = b"text/event-stream; charset=utf-8"
    else:
        body = replay.json_body(ctx.endpoint, entry, ctx.model, layer)
        content_type = b"application/json"
    ctx.timings.first_byte()
    await sink.start(200, [*ctx.response_headers(), (b"content-type", content_type),
                           (b"content-length", str(len(body)).encode()), (b"cache-control", b"no-cache"),
                           (b"server-timing", ctx.server_timing(whole=True))])
    await sink.send(body)


async def fail(ctx: RequestContext, sink: Sink, exc: GatewayError) -> None:
    """Record the outcome, and let the sink answer it (as the whole answer, in-band, or not at all)."""
    ctx.error = exc.code
    await sink.fail(exc, ctx.response_headers())


def _remember(gw: Gateway, ctx: RequestContext, decision: CacheDecision | None, relayed: Relayed) -> None:
    if decision is None or not decision.keep_answer or relayed.captured is None or gw.cache is None:
        return
    if ctx.answered_by is not None:
        return  # a fallback's answer is not the asked model's
    assert decision.key is not None
    gw.cache.remember(decision.key, ctx.endpoint, relayed.captured, ctx.stream, decision.semantic,
                      ctx.snapshot.policy.cache)
