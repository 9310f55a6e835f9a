"""The Starlette app: routes and lifespan only. Each step of a request lives in its own module."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, MutableMapping
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway import accounting, openai_api
from gateway.auth import authenticate, is_admin
from gateway.cache import replay
from gateway.cache.keys import CacheKey, cache_key
from gateway.cache.service import Lookup, SemanticCache
from gateway.cache.store import StoreUnavailable
from gateway.context import RequestContext
from gateway.metrics import GatewayMetrics
from gateway.openai_api import ApiError, error_body
from gateway.policy.loader import PolicyError, PolicySnapshot, PolicyStore
from gateway.policy.schema import CachePolicy
from gateway.scheduler import Scheduler
from gateway.upstream import UpstreamPool, Upstreams, dispatch, relay_body, relay_stream, until_disconnect

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

log = logging.getLogger("tollgate.app")
_REQUEST_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")
# A random per-process prefix and a counter: unique ids without a urandom syscall per request.
_ID_PREFIX = os.urandom(8).hex()
_id_counter = itertools.count()


def new_request_id() -> str:
    return f"{_ID_PREFIX}{next(_id_counter):016x}"


class Gateway:
    """Everything the request path shares: the policy store, upstream pools, scheduler and metrics."""

    def __init__(self, store: PolicyStore) -> None:
        self.store = store
        self.metrics = GatewayMetrics()
        self.upstreams = Upstreams(self.metrics)
        self.scheduler = Scheduler()
        self.cache: SemanticCache | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # background work; each task leaves the set when done

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.upstreams.reconcile(self.store.current.policy.pools)
        await self._reconcile_cache(self.store.current.policy.cache)
        self.store.listeners.append(self._on_policy)
        self.store.rejection_listeners.append(self._on_policy_rejected)
        self._spawn(self.store.watch())
        try:
            yield
        finally:
            for task in list(self._tasks):
                task.cancel()
            if self.cache is not None:
                await self.cache.close()
            await self.upstreams.close()

    def _on_policy(self, snapshot: PolicySnapshot) -> None:
        self.metrics.policy_reloads.labels("ok").inc()
        self.metrics.policy_ok.set(1)
        self._spawn(self.upstreams.reconcile(snapshot.policy.pools))
        self._spawn(self._reconcile_cache(snapshot.policy.cache))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reconcile_cache(self, spec: CachePolicy) -> None:
        """Start, keep or replace the cache to match the policy (thresholds etc. are read per request)."""
        current = self.cache
        if not spec.enabled:
            self.cache = None
        elif current is None or not current.same_backend(spec):
            cache = SemanticCache(spec, self.metrics)
            await cache.start()
            self.cache = cache
        if current is not None and current is not self.cache:
            await current.close()

    def _on_policy_rejected(self, error: PolicyError) -> None:
        self.metrics.policy_reloads.labels("error").inc()
        self.metrics.policy_ok.set(0)


class Completions:
    """POST /v1/chat/completions and /v1/completions, as a pure ASGI app (no buffering middleware)."""

    def __init__(self, gateway: Gateway, endpoint: str, path: str) -> None:
        self.gw = gateway
        self.endpoint = endpoint
        self.path = path
        self.validate = openai_api.validate_chat if endpoint == "chat" else openai_api.validate_completion

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gw = self.gw
        headers = dict(scope["headers"])
        rid = headers.get(b"x-request-id", b"")
        ctx = RequestContext(rid.decode() if _REQUEST_ID.match(rid) else new_request_id(), gw.store.current,
                             self.endpoint)
        out_headers = [(b"x-request-id", ctx.request_id.encode())]
        try:
            tenant = ctx.tenant = authenticate(headers.get(b"authorization"), ctx.snapshot)
            raw = await read_body(receive, headers, ctx.snapshot.policy.server.max_body_bytes)
            body = await openai_api.parse_json(raw)
            model = ctx.model = self.validate(body)
            route = ctx.snapshot.policy.models.get(model)
            if route is None:
                raise ApiError(404, f"The model '{model}' does not exist.", code="model_not_found", param="model")
            if not tenant.may_use(model):
                raise ApiError(403, f"Tenant '{tenant.name}' may not use model '{model}'.", code="model_not_allowed",
                               param="model")
            ctx.max_tokens_applied = openai_api.apply_max_tokens(body, tenant)
            out_headers.append((b"x-tollgate-max-tokens", ctx.max_tokens_applied.encode()))
            ctx.stream = bool(body.get("stream"))
            wants_usage = False
            if ctx.stream:
                options = body.get("stream_options") or {}
                wants_usage = bool(options.get("include_usage"))
                body["stream_options"] = {**options, "include_usage": True}  # billing needs the usage
            cached = await self._cache_lookup(ctx, headers, body, out_headers)
            if cached is not None and cached.hit:
                await self._serve_hit(ctx, cached, send, out_headers, wants_usage)
                return
            if route.upstream_model:
                body["model"] = route.upstream_model
            payload = orjson.dumps(body) if len(raw) <= openai_api.LARGE_BODY else await asyncio.to_thread(
                orjson.dumps, body)
            pool = gw.upstreams.pools[route.pool]
            keep = cached is not None and cached.key is not None and cached.store
            capture: list[bytes] | None = [] if keep else None
            await gw.scheduler.admit(ctx)
            try:
                left = await until_disconnect(
                    self._forward(ctx, pool, payload, send, out_headers, wants_usage, capture), receive)
            finally:
                gw.scheduler.release(ctx)
            if capture and not left and ctx.status == 200 and cached is not None and cached.store \
                    and cached.key is not None and gw.cache is not None:
                gw.cache.remember(cached.key, self.endpoint, b"".join(capture), ctx.stream, cached.vector,
                                  ctx.snapshot.policy.cache)
            if left:
                ctx.status, ctx.error = 499, "client_disconnected"
        except ApiError as exc:
            ctx.status = exc.status
            ctx.error = exc.code or exc.type
            await send_error(send, exc, out_headers)
        finally:
            ctx.timings.total = time.perf_counter() - ctx.timings.start
            accounting.finish(ctx, gw.metrics)

    async def _forward(self, ctx: RequestContext, pool: UpstreamPool, payload: bytes, send: Send,
                       headers: list[tuple[bytes, bytes]], wants_usage: bool, capture: list[bytes] | None) -> None:
        worker, response = await dispatch(ctx, pool, self.path, payload)
        try:
            if ctx.stream and response.status == 200:
                await relay_stream(ctx, worker, response, send, headers, not wants_usage, pool.spec.cooldown_s,
                                   capture)
            else:
                await relay_body(ctx, worker, response, send, headers, pool.spec.cooldown_s, capture)
        finally:
            worker.inflight -= 1

    async def _cache_lookup(self, ctx: RequestContext, headers: dict[bytes, bytes], body: dict[str, Any],
                            out_headers: list[tuple[bytes, bytes]]) -> CacheDecision | None:
        """Look the request up unless it is not cacheable; None when the cache is off."""
        cache, spec = self.gw.cache, ctx.snapshot.policy.cache
        if cache is None or not spec.enabled or ctx.tenant is None:
            return None
        metrics = self.gw.metrics
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 0
        key = cache_key(self.endpoint, body, ctx.tenant, ctx.tenant.cache, spec, max_tokens)
        directive = headers.get(b"cache-control", b"").lower()
        decision = CacheDecision(key=None if isinstance(key, str) else key, store=b"no-store" not in directive)
        if isinstance(key, str) or b"no-cache" in directive:
            ctx.cache = "bypass"
            metrics.cache_bypass.labels(key if isinstance(key, str) else "no-cache").inc()
        else:
            started = time.perf_counter()
            found = await cache.lookup(key, spec)
            ctx.timings.cache = time.perf_counter() - started
            metrics.cache_lookup.labels(found.result).observe(ctx.timings.cache)
            ctx.cache = found.result
            if found.result == "bypass":
                metrics.cache_bypass.labels(found.reason or "unknown").inc()
            decision.lookup = found
            decision.vector = found.vector
        out_headers.append((b"x-tollgate-cache", ctx.cache.encode()))
        if decision.lookup is not None and decision.lookup.similarity is not None:
            out_headers.append((b"x-tollgate-cache-similarity", f"{decision.lookup.similarity:.4f}".encode()))
        return decision

    async def _serve_hit(self, ctx: RequestContext, decision: CacheDecision, send: Send,
                         headers: list[tuple[bytes, bytes]], wants_usage: bool) -> None:
        assert decision.lookup is not None and decision.lookup.entry is not None and ctx.model is not None
        entry, layer = decision.lookup.entry, decision.lookup.result
        ctx.prompt_tokens, ctx.completion_tokens = entry.prompt_tokens, entry.completion_tokens
        if ctx.stream:
            body = replay.sse_body(entry, ctx.model, layer, wants_usage)
            content_type = b"text/event-stream; charset=utf-8"
        else:
            body = replay.json_body(entry, ctx.model, layer)
            content_type = b"application/json"
        ctx.timings.ttft = time.perf_counter() - ctx.timings.start
        await send({"type": "http.response.start", "status": 200, "headers": [
            *headers, (b"content-type", content_type), (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-cache"), (b"server-timing", ctx.timings.server_timing().encode())]})
        await send({"type": "http.response.body", "body": body})


@dataclass(slots=True)
class CacheDecision:
    """What the cache said about one request: its key (None if not cacheable), the lookup, whether to store."""

    key: CacheKey | None
    store: bool
    lookup: Lookup | None = None
    vector: Any = None

    @property
    def hit(self) -> bool:
        return self.lookup is not None and self.lookup.hit


async def read_body(receive: Receive, headers: dict[bytes, bytes], limit: int) -> bytes:
    declared = headers.get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"The request body is larger than {limit} bytes.", code="request_too_large")
    parts = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ApiError(499, "The client disconnected.", code="client_disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"The request body is larger than {limit} bytes.", code="request_too_large")
        parts.append(chunk)
        if not message.get("more_body"):
            return parts[0] if len(parts) == 1 else b"".join(parts)


async def send_error(send: Send, exc: ApiError, headers: list[tuple[bytes, bytes]]) -> None:
    body = exc.body()
    try:
        await send({"type": "http.response.start", "status": exc.status, "headers": [
            *headers, (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
    except (OSError, RuntimeError):
        pass  # the client is gone, or the response had already started


def json_response(data: object, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def error_response(status: int, message: str, code: str, type_: str = "invalid_request_error") -> Response:
    return Response(error_body(message, type_, code), status_code=status, media_type="application/json")


def create_app(store: PolicyStore) -> HotPaths:
    gw = Gateway(store)

    async def models(request: Request) -> Response:
        snapshot = store.current
        try:
            tenant = authenticate(request.headers.get("authorization", "").encode() or None, snapshot)
        except ApiError as exc:
            return Response(exc.body(), status_code=exc.status, media_type="application/json")
        data = [{"id": name, "object": "model", "created": int(snapshot.loaded_at), "owned_by": "tollgate"}
                for name in snapshot.policy.models if tenant.may_use(name)]
        return json_response({"object": "list", "data": data})

    async def healthz(request: Request) -> Response:
        return json_response({"status": "ok"})

    async def readyz(request: Request) -> Response:
        policy = store.current.policy
        missing = [name for name, route in policy.models.items()
                   if not (pool := gw.upstreams.pools.get(route.pool)) or not pool.ready()]
        if missing:
            return json_response({"status": "unready", "models_without_healthy_worker": missing}, 503)
        return json_response({"status": "ready"})

    async def metrics(request: Request) -> Response:
        for pool in gw.upstreams.pools.values():
            pool.publish()
        return Response(gw.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    def admin_guard(request: Request) -> Response | None:
        snapshot = store.current
        if snapshot.policy.server.admin_token_sha256 is None:
            return error_response(403, "The admin API is disabled: set server.admin_token_sha256.",
                                  "admin_disabled")
        if not is_admin(request.headers.get("authorization", "").encode() or None, snapshot):
            return error_response(401, "A valid admin token is required.", "invalid_admin_token")
        return None

    async def put_policy(request: Request) -> Response:
        if (denied := admin_guard(request)) is not None:
            return denied
        text = (await request.body()).decode("utf-8", errors="replace")
        try:
            changes = await store.apply_text(text)
        except PolicyError as exc:
            return json_response({"error": {"message": "The policy was rejected; the running one stays.",
                                            "type": "invalid_request_error", "param": None, "code": "invalid_policy",
                                            "details": [{"path": p, "message": m} for p, m in exc.errors]}}, 400)
        return json_response({"status": "applied", "digest": store.current.digest, "diff": changes})

    async def policy_status(request: Request) -> Response:
        if (denied := admin_guard(request)) is not None:
            return denied
        return json_response(store.status())

    async def purge_cache(request: Request) -> Response:
        if (denied := admin_guard(request)) is not None:
            return denied
        if gw.cache is None:
            return error_response(409, "The cache is not enabled in the policy.", "cache_disabled")
        q = request.query_params
        if not (q.get("tenant") or q.get("model") or q.get("id") or q.get("all") == "true"):
            return error_response(400, "Say what to purge: tenant=, model=, id= or all=true.", "missing_selector")
        try:
            purged = await gw.cache.purge(q.get("tenant"), q.get("model"), q.get("id"))
        except StoreUnavailable:
            return error_response(503, "The cache store is unreachable.", "cache_store_down", "server_error")
        return json_response({"purged": purged})

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        message = {404: f"No route for {request.url.path}.", 405: f"{request.method} is not allowed here."}
        return error_response(status, message.get(status, "Error."), {404: "not_found"}.get(status, "bad_method"))

    chat = Completions(gw, "chat", "/v1/chat/completions")
    completions = Completions(gw, "completions", "/v1/completions")
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/admin/policy", put_policy, methods=["PUT"]),
            Route("/admin/policy/status", policy_status, methods=["GET"]),
            Route("/admin/cache", purge_cache, methods=["DELETE"]),
        ],
        exception_handlers={404: not_found, 405: not_found},
        lifespan=gw.lifespan,
    )
    return HotPaths(app, {"/v1/chat/completions": chat, "/v1/completions": completions})


class HotPaths:
    """Send POSTs to the completion endpoints straight to their ASGI apps.

    Starlette's middleware stack wraps every `send`, which a stream calls once per chunk; profiled,
    that and its routing were ~15% of the gateway's CPU. Everything else goes through Starlette.
    """

    def __init__(self, app: Starlette, hot: dict[str, Completions]) -> None:
        self.app = app
        self.hot = hot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.hot.get(scope["path"])
            if endpoint is not None:
                try:
                    await endpoint(scope, receive, send)
                except Exception:
                    log.exception("unhandled error on %s", scope["path"])
                    await send_error(send, ApiError(500, "Internal error in the gateway.", "server_error",
                                                    "internal_error"), [])
                return
        await self.app(scope, receive, send)
