"""Send a request to the worker its pool's router picks; retry once elsewhere before the first byte.

A connect error or a 5xx status is retried on another worker, once: nothing has reached the client yet.
After the response head, nothing is retried (the relay owns the answer from there). The router's after-dispatch
hooks hear of each try as it is sent (the prefix index places the prompt's blocks there at once, so the next
request with that prefix finds them while a non-streamed answer is still being generated) and of each try that
failed (which withdraws them: the retry's worker is the one that prefills).
The worker's in-flight lease covers the whole exchange, relay included, and is given back on every exit.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from types import TracebackType

from gateway.context import RequestContext
from gateway.errors import AnswerTooLarge, Unavailable, UpstreamFailed
from gateway.fleet.observe import cool_down
from gateway.fleet.worker import Worker
from gateway.routing.affinity import Affinity
from gateway.transport.http1 import Client, Response
from gateway.upstream.errors import COOLDOWN_STATUS, RETRYABLE_STATUS, TRANSPORT_ERRORS, worker_failure
from gateway.upstream.pools import UpstreamPool


class Dispatch:
    """``async with Dispatch(...) as (worker, response):`` the response head of a worker that took the request.
    The first try goes where the pool's router sends it (by the request's ``affinity``, when its profile reads
    one: gateway.routing.profiles), a retry to the least loaded of the others.

    ``pinned``: the one worker that may take it (it holds the state the request continues, or the response it
    reads: ``method`` GET, over ``client``: the pool's reads); no retry elsewhere, and the router learns nothing
    (what such a request continues is held there already, and its body is not the prompt the engine caches).
    ``room``: the workers that can start it now (the scheduler's view): the first try goes to one of them when
    there are any, so that a stale load figure does not send it to an engine at its limit (a prefix cached on
    one may still go there: see gateway.routing.deciders).

    The worker that took it counts the request in flight (``Worker.inflight``, this class its one writer) from
    its try until the block ends, relay included; the response is closed then (a no-op once the relay released
    it). Raises Unavailable when no worker is available, UpstreamFailed when every try failed. (A class, not
    @asynccontextmanager: it runs once a request, and a generator-based one costs several calls more.)"""

    __slots__ = ("affinity", "client", "ctx", "method", "path", "payload", "pinned", "pool", "response",
                 "room", "worker")

    def __init__(self, ctx: RequestContext, pool: UpstreamPool, path: str, payload: bytes,
                 affinity: Affinity | None = None, pinned: str | None = None, room: Collection[Worker] = (),
                 method: bytes = b"POST", client: Client | None = None) -> None:
        self.ctx, self.pool, self.path, self.payload, self.affinity = ctx, pool, path, payload, affinity
        self.pinned, self.room, self.method, self.client = pinned, room, method, client
        self.worker: Worker | None = None
        self.response: Response | None = None

    async def __aenter__(self) -> tuple[Worker, Response]:
        ctx, pool, pinned, affinity = self.ctx, self.pool, self.pinned, self.affinity
        exclude: set[Worker] = set()
        failure: UpstreamFailed | None = None
        # identity: an answer the gateway cannot read (a compressed one) could not be metered
        headers = [(b"content-type", b"application/json"), (b"accept-encoding", b"identity"),
                   (b"x-request-id", ctx.request_id.encode("latin-1"))]
        if ctx.trace is not None:
            headers += ctx.trace.headers()  # traceparent, and the caller's tracestate
        ctx.timings.dispatch_at = time.perf_counter() - ctx.timings.start
        router = pool.router
        for attempt in range(2):
            if pinned is not None:
                worker = router.pinned(pinned) if attempt == 0 else None
                if worker is None and attempt == 0:
                    raise Unavailable("The worker holding this response is not available now; retry later (a "
                                      "follow-up can start a new conversation without previous_response_id).",
                                      "previous_response_unavailable")
            elif attempt == 0:
                worker, ctx.route = router.first(affinity, self.room)
            else:
                worker, ctx.route = router.retry(exclude)
            if worker is None:
                break
            if attempt:
                pool.metrics.retries.labels(pool.name).inc()
            ctx.attempts += 1
            ctx.worker = worker.url
            exclude.add(worker)
            learns = pinned is None and affinity is not None  # what the router is told of this try
            worker.inflight += 1
            try:
                if learns:
                    router.taken(affinity, worker)
                sent: list[float] = []
                started = time.perf_counter()
                try:
                    response = await (self.client or pool.client).request(self.method, worker.url, self.path,
                                                                          self.payload, headers, sent)
                except TRANSPORT_ERRORS as exc:
                    raise worker_failure(worker, "connect", pool.spec.cooldown_s, exc) from None
                finally:  # until the request was written (connecting, if it had to), or until the try ended
                    ctx.timings.upstream_connect = (sent[0] if sent else time.perf_counter()) - started
            except AnswerTooLarge:
                worker.inflight -= 1
                raise  # another worker would make the same answer again
            except UpstreamFailed as exc:
                worker.inflight -= 1
                failure = exc
                if learns:
                    router.refused(affinity, worker)
                continue
            except BaseException:
                worker.inflight -= 1
                raise
            status = response.status
            if status in RETRYABLE_STATUS and attempt == 0 and router.can_retry(exclude):
                response.close()
                worker.inflight -= 1
                if learns:
                    router.refused(affinity, worker)
                if status in COOLDOWN_STATUS:
                    cool_down(worker, f"HTTP {status}", pool.spec.cooldown_s)
                continue
            self.worker, self.response = worker, response
            return worker, response
        if failure is not None:
            raise failure
        if ctx.attempts:  # every worker tried answered 5xx, and the last one is out of routing now
            raise UpstreamFailed("head", "every try failed")
        raise Unavailable(f"No healthy worker serves the model '{ctx.model}' right now.", "upstream_unavailable")

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        assert self.worker is not None and self.response is not None
        self.response.close()  # a no-op after the relay released it; drops an unfinished one
        self.worker.inflight -= 1
